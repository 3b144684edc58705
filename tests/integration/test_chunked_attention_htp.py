"""Attention in query chunks on QNN HTP: the chunked and the unchunked graph both prepare,
and their HTP outputs agree with each other and with the float model; at sam3-mid's size the
rewrite is exact in float on the CPU EP (slow)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import cli
from tests.integration.test_qnn import QNN_WHEELS
from winml_recipes.eps.qnn.rules.attention import RULE, ChunkedAttentionPass
from winml_recipes.graph.log import RewriteLog
from winml_recipes.onnx.metrics import compare_runs
from winml_recipes.runtime.sessions import open_session

F = TensorProto.FLOAT
T, C, H = 64, 32, 2  # tokens, width, heads: scores [1, 2, 64, 64]


def _block(path: Path) -> Path:
    """x [1,T,C] -> q/k/v projections -> dynamo's SDPA form -> output projection."""
    rng = np.random.default_rng(0)
    d = C // H
    s = np.float32(d**-0.25)

    def w(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.normal(0, 0.3, shape).astype(np.float32), name)

    def shape(name: str, dims: list[int]) -> onnx.TensorProto:
        return numpy_helper.from_array(np.array(dims, np.int64), name)

    nodes = []
    for p in "qkv":
        nodes += [
            helper.make_node("MatMul", ["x", f"w{p}"], [f"{p}0"]),
            helper.make_node("Reshape", [f"{p}0", "heads"], [f"{p}1"]),
            helper.make_node("Transpose", [f"{p}1"], [f"{p}"], perm=[0, 2, 1, 3]),
        ]
    nodes += [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("Mul", ["q", "s"], ["qs"]),
        helper.make_node("Mul", ["kt", "s"], ["ks"]),
        helper.make_node("MatMul", ["qs", "ks"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["attn"]),
        helper.make_node("Transpose", ["attn"], ["attn_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["attn_t", "merged"], ["attn_m"]),
        helper.make_node("MatMul", ["attn_m", "wo"], ["y"]),
    ]
    inits = [w("wq", C, C), w("wk", C, C), w("wv", C, C), w("wo", C, C),
             numpy_helper.from_array(np.array(s, np.float32), "s"),
             shape("heads", [1, T, H, d]), shape("merged", [1, T, C])]  # fmt: skip
    graph = helper.make_graph(
        nodes, "attention_block", [helper.make_tensor_value_info("x", F, [1, T, C])],
        [helper.make_tensor_value_info("y", F, [1, T, C])], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.save(onnx.shape_inference.infer_shapes(model), path)
    return path


def _chunk(src: Path, out: Path, bound: int) -> int:
    model = ir.load(src)
    log = RewriteLog()
    ChunkedAttentionPass(log, bound)(model)
    ir.save(model, out, external_data=f"{out.name}.data")
    return log.count(RULE)


def _build(model: Path, out: Path) -> tuple[Path, dict]:
    done = cli("build", "--onnx", model, "--device", "npu", "--precision", "w8a16",
               "-o", out, "--json")  # fmt: skip
    assert done.exit_code == 0, done.stderr
    manifest = json.loads(done.stdout)
    steps = {s["pass"]: s for s in manifest["components"]["model"]["steps"]}
    folder = next(out.glob("*/npu-w8a16"))
    return folder / "model" / "model.onnx", steps


@pytest.mark.skipif(not QNN_WHEELS, reason="no onnxruntime-qnn wheel here")
def test_chunked_and_unchunked_attention_agree_on_htp(tmp_path: Path) -> None:
    plain = _block(tmp_path / "plain.onnx")
    assert _chunk(plain, tmp_path / "chunked.onnx", H * T * T // 4) == 1
    built = {}
    for name in ("plain", "chunked"):
        model, steps = _build(tmp_path / f"{name}.onnx", tmp_path / f"out-{name}")
        verify = steps["verify"]["metrics"]
        assert verify["verified_on"] == "qnn-htp" and verify["cpu_fallback_allowed"] is False
        built[name] = model
    x = {"x": np.random.default_rng(1).uniform(-1, 1, (1, T, C)).astype(np.float32)}
    reference = open_session(plain).run(x)
    runs = {n: open_session(m, "qnn-htp", fallback=False).run(x) for n, m in built.items()}
    sqnr = {n: compare_runs([reference], [out])["y"]["sqnr_db"] for n, out in runs.items()}
    between = compare_runs([runs["plain"]], [runs["chunked"]])["y"]["sqnr_db"]
    assert min(sqnr.values()) > 25, sqnr
    # the two quantized graphs differ only in the chunks' encodings
    assert between > 25


@pytest.mark.slow
def test_chunked_attention_is_exact_at_sam3_mid_size(tmp_path: Path) -> None:
    """sam3-mid's vision encoder at 1008 px (its global layer's scores: 16 x 5184 x 5184 =
    430 M) in chunks of at most 2^26 scores: the same embeddings on the CPU EP."""
    from tests.sam3_blocks import export_block
    from winml_recipes.onnx.metrics import compare_runs
    from winml_recipes.runtime.sessions import run_model

    plain = export_block(1008, "encoder2", tmp_path / "encoder.onnx")
    bound = 1 << 26
    assert _chunk(plain, tmp_path / "chunked.onnx", bound) == 1  # the windowed layer fits
    chunked = onnx.load(tmp_path / "chunked.onnx", load_external_data=False)
    assert sum(n.op_type == "Softmax" for n in chunked.graph.node) == 1 + 7
    x = {"pixel_values": np.random.default_rng(0).uniform(-1, 1, (1, 3, 1008, 1008))}
    x = {k: v.astype(np.float32) for k, v in x.items()}
    before = run_model(plain, [x])
    after = run_model(tmp_path / "chunked.onnx", [x])
    for name, metrics in compare_runs(before, after).items():
        assert metrics["max_abs"] < 1e-4 and metrics["sqnr_db"] > 100, (name, metrics)
