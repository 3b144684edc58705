"""LayerNormalization inputs with rows too narrow for one 8-bit encoding (quant/narrow_rows.py):
a token layout like a ViT's CLS row beside patch rows, through `build --onnx` at cpu/int8
with real calibration data. Before: the narrow row kept 1-2 steps of the input's 8-bit
encoding and came out of the normalization as noise (tiny DINOv2: pooled cosine 0.897)."""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper

from tests.conftest import cli

ROWS, WIDTH = 5, 32
# a learned row-0 token (like a random ViT's CLS token, std 0.02) and small offsets
OFFSET = np.random.default_rng(0).normal(size=(ROWS, WIDTH)).astype(np.float32) * 0.01
OFFSET[0] *= 2


def _model(path) -> None:
    """tokens [1, 5, 32] (row 0 empty: the CLS slot) -> + learned tokens (Add) ->
    LayerNormalization -> MatMul."""
    rng = np.random.default_rng(1)
    inits = [
        helper.make_tensor("offset", TensorProto.FLOAT, [ROWS, WIDTH], OFFSET.ravel()),
        helper.make_tensor("gamma", TensorProto.FLOAT, [WIDTH], np.ones(WIDTH, np.float32)),
        helper.make_tensor("beta", TensorProto.FLOAT, [WIDTH], np.zeros(WIDTH, np.float32)),
        helper.make_tensor("w", TensorProto.FLOAT, [WIDTH, 8],
                           rng.normal(size=(WIDTH, 8)).astype(np.float32).ravel()),
    ]  # fmt: skip
    nodes = [
        helper.make_node("Add", ["tokens", "offset"], ["residual"], name="add"),
        helper.make_node("LayerNormalization", ["residual", "gamma", "beta"], ["normed"],
                         name="norm", axis=-1, epsilon=1e-6),
        helper.make_node("MatMul", ["normed", "w"], ["out"], name="proj"),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes,
        "narrow",
        [helper.make_tensor_value_info("tokens", TensorProto.FLOAT, [1, ROWS, WIDTH])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, ROWS, 8])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, path)


def _tokens(n: int, seed: int) -> np.ndarray:
    """Rows 1-4 wide (patch tokens, std 0.5), row 0 zero (the slot the learned token fills)."""
    x = np.random.default_rng(seed).normal(size=(n, 1, ROWS, WIDTH)) * 0.5
    x[:, :, 0] = 0.0
    return x.astype(np.float32)


def test_narrow_layernorm_rows_get_16_bit_and_the_output_keeps_them(tmp_path) -> None:
    _model(tmp_path / "model.onnx")
    calib = _tokens(16, 1)
    held = _tokens(4, 2) * 0.8  # well inside the calibrated ranges: no clipping error
    np.savez(tmp_path / "calib.npz", tokens=calib)
    np.savez(tmp_path / "eval.npz", tokens=held)
    done = cli("build", "--onnx", tmp_path / "model.onnx", "--device", "cpu", "--precision",
               "int8", "--calibration-data", tmp_path / "calib.npz", "--eval-data",
               tmp_path / "eval.npz", "-o", tmp_path / "out")  # fmt: skip
    manifest = next((tmp_path / "out").rglob("manifest.json"))
    steps = next(iter(json.loads(manifest.read_text())["components"].values()))["steps"]
    quantize = next(s for s in steps if s["pass"] == "quantize")["metrics"]
    verify = next(s for s in steps if s["pass"] == "verify")["metrics"]
    chosen = quantize.get("layernorm_rows_16bit") or {}
    assert list(chosen) == ["residual"], quantize.get("layernorm_rows_16bit")
    # the steps the narrow row spans, from the data and the weights alone: its std over the
    # 8-bit step of the calibration range (min/max over the samples calibration read)
    residual = calib[: quantize["calibration_samples"]] + OFFSET
    step = (residual.max() - min(residual.min(), 0.0)) / 255
    expected = OFFSET[0].std() / step
    assert abs(chosen["residual"]["steps_at_8_bit"] - expected) < 0.01 * expected
    assert chosen["residual"]["steps_at_8_bit"] < 8 <= chosen["residual"]["median_row_steps"]
    # at 8 bit the narrow row spans ~1.3 steps: ~13 dB for that row after the division, one
    # row of five, so the output stays under 20 dB (measured 17.4); at 16 bit the output is
    # limited by the other 8-bit tensors instead (measured 23.3)
    assert verify["outputs"]["out"]["sqnr_db"] >= 21, verify["outputs"]
    assert done.exit_code == 0, done.stderr[-1500:]
