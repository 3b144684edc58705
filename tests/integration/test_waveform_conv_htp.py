"""wav2vec2's first layer on HTP: a single-channel stride-5 Conv1d over a waveform.

Measured (onnxruntime-qnn 2.7.0, w8a16): over 20,000 or 32,000 samples HTP's result has
0 dB SQNR against the CPU EP's simulation of the same QDQ graph (54-69 dB at 16,000 or 24,000
samples). `prepare` writes it as a stride-1 Conv over the waveform's 5 phases
(waveform_conv_to_polyphase), exact in float, right on HTP."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import cli
from tests.integration.test_qnn import QNN_WHEELS
from winml_recipes.eps.qnn import PLUGIN as QNN
from winml_recipes.graph.pipeline import prepare
from winml_recipes.runtime.sessions import run_model


def _conv(path: Path, samples: int, kernel: int, stride: int, bias: bool = False) -> Path:
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (16, 1, kernel)).astype(np.float32), "w")]
    if bias:
        inits.append(numpy_helper.from_array(rng.normal(0, 0.1, 16).astype(np.float32), "b"))
    frames = (samples - kernel) // stride + 1
    node = helper.make_node("Conv", ["x", "w", *(["b"] if bias else [])], ["y"],
                            kernel_shape=[kernel], strides=[stride])  # fmt: skip
    graph = helper.make_graph(
        [node], "waveform",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, samples])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, frames])], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.save(model, path)
    return path


@pytest.mark.parametrize(
    ("samples", "kernel", "stride", "bias"),
    [(20000, 10, 5, False), (20003, 10, 5, True), (101, 3, 2, False), (64, 8, 4, True)],
)
def test_polyphase_conv_is_exact_in_float(tmp_path: Path, samples, kernel, stride, bias) -> None:
    """Cropped (20,003: 3 samples no window reads), zero-padded (kernel 3, stride 2: one
    zero tap), with and without bias: the CPU EP computes the same numbers."""
    path = _conv(tmp_path / "conv.onnx", samples, kernel, stride, bias)
    x = {"x": np.random.default_rng(1).normal(0, 1, (1, 1, samples)).astype(np.float32)}
    before = run_model(path, [x])[0]["y"]
    done = prepare(onnx.load(path), ["ep"], ep_rules=QNN.graph_rules())
    assert done.log.count("waveform_conv_to_polyphase") == 1
    ops = [n.op_type for n in done.model.graph.node]
    assert ops[-4:] == ["Reshape", "Transpose", "Reshape", "Conv"], ops
    onnx.save(done.model, tmp_path / "after.onnx")
    after = run_model(tmp_path / "after.onnx", [x])[0]["y"]
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5)


def test_multichannel_conv1d_is_left_alone(tmp_path: Path) -> None:
    """Whisper's stride-2 Conv1d reads 80 mel bands: not a waveform, not rewritten."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(0, 0.3, (8, 4, 3)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3], strides=[2])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 50])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 24])], [w],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    done = prepare(model, ["ep"], ep_rules=QNN.graph_rules())
    assert done.log.count("waveform_conv_to_polyphase") == 0


@pytest.mark.skipif(not QNN_WHEELS, reason="no onnxruntime-qnn wheel here")
def test_waveform_conv_agrees_with_the_simulation_on_htp(tmp_path: Path) -> None:
    """Before the rewrite this build failed verify on HTP (0 dB against the float model)."""
    path = _conv(tmp_path / "conv.onnx", 20000, 10, 5)
    done = cli("build", "--onnx", path, "--device", "npu", "--precision", "w8a16",
               "-o", tmp_path / "out", "--json")  # fmt: skip
    assert done.exit_code == 0, done.stderr[-2000:]
    steps = {s["pass"]: s for s in json.loads(done.stdout)["components"]["model"]["steps"]}
    rewrites = {r["rule"]: r["count"] for r in steps["prepare"]["metrics"]["rewrites"]}
    assert rewrites == {"waveform_conv_to_polyphase": 1}
    verify = steps["verify"]["metrics"]
    assert verify["verified_on"] == "qnn-htp" and verify["cpu_fallback_allowed"] is False
    on_htp = verify["outputs"]["y"]["sqnr_db"]
    simulated = verify["cpu_simulation"]["outputs"]["y"]["sqnr_db"]
    assert on_htp > 40 and abs(on_htp - simulated) < 6, (on_htp, simulated)
