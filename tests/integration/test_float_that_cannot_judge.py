"""verify refuses to judge against a float model that answers every input alike.

Before (main at 58e3ab6): a tiny EfficientNet with transformers' default init has logits 0
for every image (its features shrink ~1e4x per block), and its cpu/int8 build passed with
SQNR 200 dB (identical zeros) and top-1 agreement 1.0. Here the same situation in a small
graph: the classifier's input is multiplied by 0 (as vanished features are), so every
sample gets the bias alone."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import cli


def _classifier(path: Path, feature_scale: float) -> Path:
    rng = np.random.default_rng(0)
    weight = rng.normal(0, 1, (16, 4)).astype(np.float32)
    bias = np.array([0.5, -0.25, 0.125, 0.0], np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "scale"], ["features"]),
            helper.make_node("Gemm", ["features", "w", "b"], ["logits"]),
        ],
        "classifier",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 4])],
        [
            numpy_helper.from_array(np.array(feature_scale, np.float32), "scale"),
            numpy_helper.from_array(weight, "w"),
            numpy_helper.from_array(bias, "b"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, path)
    return path


def _build(tmp_path: Path, scale: float):
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "calib.npz", x=rng.normal(0, 1, (16, 1, 16)).astype(np.float32))
    np.savez(tmp_path / "heldout.npz", x=rng.normal(0, 1, (8, 1, 16)).astype(np.float32))
    model = _classifier(tmp_path / f"model{scale}.onnx", scale)
    return cli("build", "--onnx", model, "--device", "cpu", "--precision", "int8",
               "--calibration-data", tmp_path / "calib.npz", "--eval-data",
               tmp_path / "heldout.npz", "--task", "image-classification",
               "-o", tmp_path / f"out{scale}")  # fmt: skip


def _float_gate(out: Path) -> dict:
    (manifest,) = out.glob("*/cpu-int8*/manifest.json")
    verify = next(s for s in json.loads(manifest.read_text())["components"]["model"]["steps"]
                  if s["pass"] == "verify")  # fmt: skip
    return next(g for g in verify["metrics"]["gates"] if g["output"] == "float model")


def test_a_float_model_blind_to_its_input_cannot_pass(tmp_path: Path) -> None:
    done = _build(tmp_path, 0.0)
    assert done.exit_code == 3, done.stderr
    assert "held-out samples it tells apart 1 (gate >= 2" in done.stderr
    assert "same outputs for all 8 held-out samples (logits the same array)" in done.stderr
    gate = _float_gate(tmp_path / "out0.0")
    assert (gate["metric"], gate["value"], gate["passed"]) == ("distinct_samples", 1.0, False)


def test_the_same_graph_seeing_its_input_is_judged(tmp_path: Path) -> None:
    done = _build(tmp_path, 1.0)
    assert done.exit_code == 0, done.stderr
    gate = _float_gate(tmp_path / "out1.0")
    assert (gate["value"], gate["passed"]) == (8.0, True)  # 8 random samples, 8 answers


def test_held_out_inputs_all_alike_are_named(tmp_path: Path) -> None:
    """The same refusal when the data, not the model, gives nothing to tell apart."""
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "calib.npz", x=rng.normal(0, 1, (16, 1, 16)).astype(np.float32))
    one = rng.normal(0, 1, (1, 1, 16)).astype(np.float32)
    np.savez(tmp_path / "heldout.npz", x=np.repeat(one, 4, axis=0))
    model = _classifier(tmp_path / "model.onnx", 1.0)
    done = cli("build", "--onnx", model, "--device", "cpu", "--precision", "int8",
               "--calibration-data", tmp_path / "calib.npz", "--eval-data",
               tmp_path / "heldout.npz", "-o", tmp_path / "out")  # fmt: skip
    assert done.exit_code == 3, done.stderr
    assert "the 4 held-out inputs are all the same" in done.stderr
