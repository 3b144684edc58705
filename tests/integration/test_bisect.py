"""Finalize failures on QNN HTP are bisected to the node (real HTP sessions, fresh processes).

The failing construct: a float32 `Gather`. HTP validates it, then fails to finalize any
graph that holds one (`Failed to finalize QNN graph. Error: QNN_COMMON_ERROR_MEM_ALLOC`,
tables from 16x64 to 16384x4096, constant or input indices, int32 or int64), while a
quantized Gather (DequantizeLinear -> Gather -> QuantizeLinear) and float Conv, Relu, Mul,
Concat finalize (onnxruntime-qnn 2.7.0, QNN SDK 2.51). The test graphs hold one such Gather
among 40 nodes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.integration.test_qnn import QNN_WHEELS, project, steps_of
from winml_recipes import api
from winml_recipes.runtime.bisect import GraphCutter, bisect_failure, explain
from winml_recipes.runtime.sessions import open_session
from winml_recipes.sdk.errors import ExecutionProviderError

pytestmark = pytest.mark.skipif(not QNN_WHEELS, reason="no onnxruntime-qnn wheel here")
SHAPE = [1, 16, 8, 8]


def chain(path: Path, gather_at: int = 13) -> Path:
    """20 blocks of 1x1 Conv -> Relu, one of them replaced by a channel Gather -> Concat,
    with a skip connection (Add) across the Gather; 42 nodes."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.arange(0, 16, 2, dtype=np.int64), "idx")]
    nodes, x = [], "x"
    for i in range(20):
        if i == gather_at:
            nodes += [
                helper.make_node("Gather", [x, "idx"], ["sel"], name="pick_channels", axis=1),
                helper.make_node("Concat", ["sel", "sel"], ["cat"], name="concat", axis=1),
                helper.make_node("Add", ["cat", f"t{i - 3}"], [f"t{i}"], name="skip"),
            ]
            x = f"t{i}"
            continue
        w = (rng.standard_normal((16, 16, 1, 1)) * 0.3).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes += [
            helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], name=f"conv{i}"),
            helper.make_node("Relu", [f"c{i}"], [f"t{i}"], name=f"relu{i}"),
        ]
        x = f"t{i}"
    nodes.append(helper.make_node("Relu", [x], ["y"], name="last"))
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes, "chain", [vi("x", TensorProto.FLOAT, SHAPE)], [vi("y", TensorProto.FLOAT, SHAPE)],
        inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.save(model, str(path))
    return path


def quantized_chain(tmp_path: Path) -> Path:
    """The chain as a u16/u8 QDQ graph, with the Gather left in float (quantizer's exclude)."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.calibrate import CalibrationDataReader

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            rng = np.random.default_rng(1)
            self.feeds = iter([{"x": rng.standard_normal(SHAPE).astype(np.float32)}] * 2)

        def get_next(self):
            return next(self.feeds, None)

    out = tmp_path / "qdq.onnx"
    quantize_static(
        str(chain(tmp_path / "float.onnx")),
        str(out),
        Reader(),
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QUInt16,
        weight_type=QuantType.QUInt8,
        nodes_to_exclude=["pick_channels"],
    )
    return out


# suite wall time: test_a_quantized_graph_bisects_to_its_float_gather bisects alike in CI
@pytest.mark.slow
def test_a_float_gather_fails_to_finalize_and_bisection_names_it(tmp_path: Path) -> None:
    model = chain(tmp_path / "chain.onnx")
    with pytest.raises(ExecutionProviderError, match="Failed to finalize QNN graph") as err:
        open_session(model, "qnn-htp", fallback=False)
    seen: list[int] = []
    region = bisect_failure(model, "qnn-htp", progress=lambda what, done, total: seen.append(done))
    assert region is not None and region.complete
    assert region.culprit == ("pick_channels", "Gather")
    assert region.nodes == (("pick_channels", "Gather"),)
    assert region.loads == len(seen) <= 2 * 6 + 1  # 2 log2(31 compute nodes) + 1
    explained = explain(err.value, model, "qnn-htp")
    message = explained.message
    assert message.startswith(
        "QNNExecutionProvider (htp) failed to finalize the graph (QNN_COMMON_ERROR_MEM_ALLOC); "
        "the smallest failing region is pick_channels (Gather), found in "
    )
    assert "build it quantized" in message
    # QNN's op_affinity keeps Gather on the CPU: checked by a real load.
    assert "keeps Gather (1 node(s)) on the CPU, which loads here" in message
    assert explained.data["bisection"]["culprit"] == {"name": "pick_channels", "op_type": "Gather"}
    assert explained.data["cpu_op_affinity"] == {"op_types": ["Gather"], "nodes": 1, "loads": True}


def test_a_quantized_graph_is_cut_into_valid_qdq_pieces(tmp_path: Path) -> None:
    model = quantized_chain(tmp_path)
    cutter = GraphCutter(onnx.load(str(model)))
    gather = next(i for i in cutter.units if cutter.nodes[i].op_type == "Gather")
    add = next(i for i in cutter.units if cutter.nodes[i].name == "skip")
    for start, end in [(0, gather), (gather, gather), (gather, add), (add, add)]:
        piece = cutter.piece(start, end)
        onnx.checker.check_model(piece, full_check=True)
        ops = {n.name: n.op_type for n in piece.graph.node}
        producers = {o: n.op_type for n in piece.graph.node for o in n.output}
        # Inputs are float, read by a QuantizeLinear (the pair travels with the piece) or by a
        # float node; outputs are float, after a DequantizeLinear where the graph quantized.
        for vi in [*piece.graph.input, *piece.graph.output]:
            assert vi.type.tensor_type.elem_type == TensorProto.FLOAT, vi.name
        for o in piece.graph.output:
            assert producers[o.name] in ("DequantizeLinear", "Gather"), (o.name, ops)
        for node in piece.graph.node:
            if node.op_type == "DequantizeLinear" and node.input[0] in producers:
                assert producers[node.input[0]] == "QuantizeLinear"
    # The skip connection's DQ (produced long before the Add) comes with its Q.
    skip = cutter.piece(add, add)
    assert [n.op_type for n in skip.graph.node].count("QuantizeLinear") >= 3


def test_a_quantized_graph_bisects_to_its_float_gather(tmp_path: Path) -> None:
    model = quantized_chain(tmp_path)
    region = bisect_failure(model, "qnn-htp")
    assert region is not None and region.complete and not region.note
    assert region.culprit == ("pick_channels", "Gather")
    error = ExecutionProviderError(
        "QNNExecutionProvider cannot load the model: Failed to finalize QNN graph. Error: "
        "QNN_COMMON_ERROR_MEM_ALLOC: Memory allocation related error., Code: 1002"
    )
    message = explain(error, model, "qnn-htp").message
    assert "the smallest failing region is pick_channels (Gather), found in " in message
    assert "build it quantized" not in message  # the graph is quantized already


def test_verify_names_the_region_and_keeps_it_on_the_cpu_with_fallback(tmp_path: Path) -> None:
    model = chain(tmp_path / "chain.onnx")
    recipe = project(tmp_path, model, "[-1.0, 1.0]", "[verify]")
    with pytest.raises(ExecutionProviderError) as err:
        api.build(recipe, device="npu", precision="w8a16", output_root=tmp_path / "out")
    assert "the smallest failing region is pick_channels (Gather)" in err.value.message
    assert err.value.data["bisection"]["culprit"]["op_type"] == "Gather"
    recipe.write_text(
        recipe.read_text().replace("[verify]", "[{verify: {allow_cpu_fallback: true}}]")
    )
    result = api.build(recipe, device="npu", precision="w8a16", output_root=tmp_path / "out")
    verify = steps_of(result)["verify"]["metrics"]
    assert verify["verified_on"] == "qnn-htp"
    assert verify["placement"]["fallback_nodes"] == [{"name": "pick_channels", "op_type": "Gather"}]
    assert verify["cpu_op_affinity"]["op_types"] == ["Gather"]
    assert verify["cpu_op_affinity"]["bisection"]["culprit"]["name"] == "pick_channels"
    assert verify["outputs"]["y"]["sqnr_db"] > 30


def test_compare_reports_the_layers_before_the_failing_region(tmp_path: Path) -> None:
    model = quantized_chain(tmp_path)
    report = api.compare(model, tmp_path / "float.onnx", device="npu", samples=1)
    assert report["bisection"]["culprit"] == {"name": "pick_channels", "op_type": "Gather"}
    assert "failed to finalize the graph" in report["bisection"]["message"]
    assert report["compared_up_to"] == "conv12"
    tensors = [r["tensor"] for r in report["tensors"]]
    assert tensors[0] == "x" and tensors[-1] == "t12"  # the Relu fused into conv12
    assert all(r["target_vs_float_db"] > 20 for r in report["tensors"])
