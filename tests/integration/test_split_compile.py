"""Split compilation on real QNN HTP sessions: a graph cut into parts, each compiled to its
own EPContext binary, stitched into one model whose outputs equal the unsplit compiled
model's (CPU fallback off), and a build compiled in parts that `run` and `perf` use."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import RECIPES
from winml_recipes.onnx.split import Splitter
from winml_recipes.runtime.providers import availability
from winml_recipes.runtime.sessions import open_session
from winml_recipes.runtime.splitcompile import SplitPlan, compile_parts

pytestmark = pytest.mark.skipif(
    not availability("qnn-htp").available, reason="onnxruntime-qnn is not installed"
)


def _htp(path: Path):
    return open_session(path, "qnn-htp", fallback=False, device="npu")


def _compile(model: onnx.ModelProto, cuts: list[int], work: Path, boundary="quantized") -> Path:
    splitter = Splitter(model, boundary)
    parts = splitter.parts(cuts)
    plan = SplitPlan(tuple(parts), (0.0,) * len(parts), None, "test")
    whole = work / "whole.onnx"
    work.mkdir(parents=True, exist_ok=True)
    onnx.save(model, whole)
    out = work / "model_ctx.onnx"
    compile_parts(
        plan, whole, work / "parts", out, "qnn-htp",
        embed=False, provider_options={}, device="npu",
    )  # fmt: skip
    return out


@pytest.mark.parametrize(("parts", "boundary"), [(2, "quantized"), (3, "quantized"), (2, "float")])
def test_the_encoder_compiled_in_parts_equals_the_unsplit_compiled_encoder(
    tiny_npu_build, tmp_path, parts, boundary
) -> None:
    folder = tiny_npu_build.output_dir / "vision_encoder"
    model = onnx.load(folder / "model.onnx")
    splitter = Splitter(model, boundary)
    cuts = splitter.choose_cuts(parts)
    crossing = [splitter.crossing(k) for k in cuts]
    # Q/DQ pairs stay whole: what crosses is a quantized tensor (or its DQ output)
    dtype = TensorProto.UINT16 if boundary == "quantized" else TensorProto.FLOAT
    for part in splitter.parts(cuts)[1:]:
        assert [i.type.tensor_type.elem_type for i in part.model.graph.input] == [dtype]
    out = _compile(model, cuts, tmp_path, boundary)
    stitched = onnx.load(out)
    assert [n.op_type for n in stitched.graph.node] == ["EPContext"] * parts
    assert sorted(p.name for p in tmp_path.glob("*_qnn.bin")) == [
        f"model_ctx_part{j}_qnn.bin" for j in range(parts)
    ]
    split_session = _htp(out)
    assert split_session.placement.partitions == {"QNNExecutionProvider": parts}
    unsplit = _htp(folder / "model_ctx.onnx")  # one EPContext node, compiled by the build
    rng = np.random.default_rng(parts)
    for _ in range(2):
        feed = {"pixel_values": rng.uniform(-1, 1, (1, 3, 112, 112)).astype(np.float32)}
        got, want = split_session.run(feed), unsplit.run(feed)
        for name, value in want.items():
            assert np.abs(value).max() > 0.1, name  # real outputs, not zeros
            # HTP computes each part as the whole graph computes it: bit for bit
            np.testing.assert_array_equal(got[name], value, err_msg=f"{name}, cuts {crossing}")


def _two_branch_qdq(work: Path) -> onnx.ModelProto:
    """x -> two conv branches (interleaved) -> Add -> Conv, quantized by onnxruntime's QNN
    config (uint16 activations): any cut between the branches carries two tensors."""
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    rng = np.random.default_rng(0)

    def w(name: str, cin: int, cout: int) -> TensorProto:
        return numpy_helper.from_array(
            rng.normal(0, 0.3, (cout, cin, 3, 3)).astype(np.float32), name
        )

    nodes = [
        helper.make_node("Conv", ["x", "wa"], ["a1"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["x", "wb"], ["b1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a1"], ["a2"]),
        helper.make_node("Sigmoid", ["b1"], ["b2"]),
        helper.make_node("Conv", ["a2", "wa2"], ["a3"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["b2", "wb2"], ["b3"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["a3", "b3"], ["s"]),
        helper.make_node("Conv", ["s", "wc"], ["y"], pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "branches",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])],
        [w("wa", 8, 8), w("wb", 8, 8), w("wa2", 8, 8), w("wb2", 8, 8), w("wc", 8, 8)],
    )
    float_path, qdq_path = work / "float.onnx", work / "qdq.onnx"
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10),
        float_path,
    )

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.left = [
                {"x": rng.normal(0, 1, (1, 8, 16, 16)).astype(np.float32)} for _ in range(4)
            ]

        def get_next(self):
            return self.left.pop() if self.left else None

    config = get_qnn_qdq_config(
        float_path, Reader(), activation_type=QuantType.QUInt16, weight_type=QuantType.QUInt8
    )
    quantize(float_path, qdq_path, config)
    return onnx.load(qdq_path)


def test_a_cut_carrying_several_tensors_compiles_and_matches(tmp_path) -> None:
    model = _two_branch_qdq(tmp_path)
    splitter = Splitter(model)
    several = [k for k in range(1, len(splitter.core)) if splitter.valid(k)
               and len(splitter.crossing(k)) >= 2]  # fmt: skip
    assert several, "the two branches give a cut with two crossing tensors"
    cut = several[len(several) // 2]
    crossing = splitter.crossing(cut)
    out = _compile(model, [cut], tmp_path / "split")
    stitched = onnx.load(out)
    assert [n.op_type for n in stitched.graph.node] == ["EPContext", "EPContext"]
    assert sorted(stitched.graph.node[1].input) == sorted(crossing)  # both tensors cross
    whole_ctx = tmp_path / "whole_ctx.onnx"
    from winml_recipes.runtime.epcontext import compile_epcontext

    compile_epcontext(
        tmp_path / "split" / "whole.onnx", whole_ctx, "qnn-htp",
        embed=False, provider_options={}, device="npu",
    )  # fmt: skip
    feed = {"x": np.random.default_rng(1).normal(0, 1, (1, 8, 16, 16)).astype(np.float32)}
    got = _htp(out).run(feed)["y"]
    want = _htp(whole_ctx).run(feed)["y"]
    assert np.abs(want).max() > 0.1
    np.testing.assert_array_equal(got, want)


def test_a_build_compiled_in_parts_runs_and_is_timed(tiny_npu_build, tmp_path) -> None:
    """`-D encoder_parts=2`: the recipe's compile gets parts: 2 (the earlier steps come from
    the session cache); run and perf load the one model_ctx.onnx as before."""
    from winml_recipes import api

    result = api.build(
        RECIPES / "sam3-tiny.yaml", device="npu", precision="w8a16", output_root=tmp_path / "b",
        defines={"encoder_parts": 2},
    )  # fmt: skip
    out = result.output_dir
    manifest = json.loads((out / "manifest.json").read_text())
    steps = manifest["components"]["vision_encoder"]["steps"]
    compile_metrics = next(s for s in steps if s["pass"] == "compile")["metrics"]
    parts = compile_metrics["split"]["parts"]
    assert len(parts) == 2 and compile_metrics["compiled_vs_uncompiled"]["bit_exact"]
    assert parts[1]["inputs"] == parts[0]["outputs"]
    typed = next(
        s for s in result.record.components["vision_encoder"].steps if s.pass_name == "compile"
    )
    assert [p.binaries for p in typed.split_parts] == [
        ("model_ctx_part0_qnn.bin",),
        ("model_ctx_part1_qnn.bin",),
    ]
    files = {f["path"] for f in manifest["components"]["vision_encoder"]["artifact"]["files"]}
    assert {
        "vision_encoder/model_ctx_part0_qnn.bin",
        "vision_encoder/model_ctx_part1_qnn.bin",
    } <= files
    # the same encoder compiled whole by the shared build: same outputs on HTP
    feed = {
        "pixel_values": np.random.default_rng(5).uniform(-1, 1, (1, 3, 112, 112)).astype(np.float32)
    }
    got = _htp(out / "vision_encoder" / "model_ctx.onnx").run(feed)
    want = _htp(tiny_npu_build.output_dir / "vision_encoder" / "model_ctx.onnx").run(feed)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])

    summary = api.run(out, points=["60,40"], output_dir=tmp_path / "run", compiled=True)
    run = summary["target_run"]["vision_encoder"]
    assert (run["model"], run["ran_on"]) == ("vision_encoder/model_ctx.onnx", "qnn-htp")
    assert run["placement"]["partitions"] == {"QNNExecutionProvider": 2}  # one per part
    assert 0.5 < summary["task_metric"]["values"]["mask_iou"] <= 1.0
    report = api.perf([out], iterations=2, warmup=1)
    rows = [r for r in report["rows"] if r["component"] == "vision_encoder"]
    compiled = [r for r in rows if Path(r["files"][0]).name == "model_ctx.onnx"]
    assert compiled and compiled[0]["latency_ms"]["p50"] > 0
    assert compiled[0]["placement"] == {"QNNExecutionProvider": 2}  # two EPContext nodes
    html = (out / "report.html").read_text()
    assert "compiled in parts" in html and "model_ctx_part1_qnn.bin" in html
