"""An AveragePool whose window overhangs the whole map (EfficientNet's head:
`nn.AvgPool2d(hidden_dim, ceil_mode=True)`, kernel 1280 on a 7x7 map) through `build --onnx`
at cpu/int8 (graph/pooling.py). onnxruntime's CPU EP fuses the quantized pool into
QLinearAveragePool at its default optimization level and then averages as if the window
were inside the map: before, the tiny EfficientNet's int8 logits were 0 for every photo
there (while the BASIC level the build verifies at was right). Quantize now rewrites such a
pool to GlobalAveragePool (the same average) before calibrating."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from tests.conftest import cli

CHANNELS, MAP, KERNEL, CLASSES = 8, 2, 32, 10


def _model(path) -> None:
    """features [1, 8, 2, 2] -> Conv 1x1 -> AveragePool (kernel 32, ceil_mode) -> Flatten ->
    Gemm, the pattern transformers' EfficientNet exports (torch.onnx, opset 20)."""
    rng = np.random.default_rng(1)
    inits = [
        helper.make_tensor("w", TensorProto.FLOAT, [16, CHANNELS, 1, 1],
                           rng.normal(size=(16, CHANNELS, 1, 1)).astype(np.float32).ravel()),
        helper.make_tensor("fc", TensorProto.FLOAT, [CLASSES, 16],
                           rng.normal(size=(CLASSES, 16)).astype(np.float32).ravel()),
    ]  # fmt: skip
    nodes = [
        helper.make_node("Conv", ["features", "w"], ["conv"], name="conv"),
        helper.make_node("AveragePool", ["conv"], ["pooled"], name="pool", ceil_mode=1,
                         count_include_pad=1, kernel_shape=[KERNEL] * 2, strides=[KERNEL] * 2,
                         pads=[0] * 4),
        helper.make_node("Flatten", ["pooled"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "fc"], ["logits"], name="fc", transB=1),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes,
        "head",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, [1, CHANNELS, MAP, MAP])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, CLASSES])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    onnx.save(model, path)


def _run(path, x: np.ndarray, level) -> np.ndarray:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = level
    session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    return np.concatenate([session.run(None, {"features": s})[0] for s in x]).astype(np.float64)


def _sqnr(ref: np.ndarray, y: np.ndarray) -> float:
    return float(10 * np.log10((ref**2).mean() / max(((ref - y) ** 2).mean(), 1e-30)))


def test_overhanging_pool_is_global_and_int8_runs_right_at_ort_default_level(tmp_path) -> None:
    _model(tmp_path / "model.onnx")
    rng = np.random.default_rng(2)
    calib = rng.normal(size=(16, 1, CHANNELS, MAP, MAP)).astype(np.float32)
    held = (rng.normal(size=(4, 1, CHANNELS, MAP, MAP)) * 0.8).astype(np.float32)
    np.savez(tmp_path / "calib.npz", features=calib)
    np.savez(tmp_path / "eval.npz", features=held)
    done = cli("build", "--onnx", tmp_path / "model.onnx", "--device", "cpu", "--precision",
               "int8", "--calibration-data", tmp_path / "calib.npz", "--eval-data",
               tmp_path / "eval.npz", "-o", tmp_path / "out")  # fmt: skip
    assert done.exit_code == 0, done.stderr[-1500:]
    manifest = next((tmp_path / "out").rglob("manifest.json"))
    steps = next(iter(json.loads(manifest.read_text())["components"].values()))["steps"]
    quantize = next(s for s in steps if s["pass"] == "quantize")["metrics"]
    assert quantize.get("whole_map_average_pools") == ["pool"], quantize
    built = manifest.parent / "model" / "model.onnx"
    ops = {n.op_type for n in onnx.load(built).graph.node}
    assert "GlobalAveragePool" in ops and "AveragePool" not in ops, ops
    # float: the mean of each channel's 4 values (the window overhangs; torch and onnxruntime
    # average the elements inside), computed here without the pool
    w = onnx.numpy_helper.to_array(onnx.load(tmp_path / "model.onnx").graph.initializer[0])
    fc = onnx.numpy_helper.to_array(onnx.load(tmp_path / "model.onnx").graph.initializer[1])
    conv = np.einsum("oc,nbchw->nbohw", w[:, :, 0, 0], held.astype(np.float64))
    ref = conv.mean(axis=(3, 4)).reshape(len(held), -1) @ fc.T.astype(np.float64)
    basic = _run(built, held, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC)
    default = _run(built, held, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)  # what users get
    # the QDQ model at 8 bit (four tensors, per-channel weights): ~30 dB either way; before,
    # the default level gave 0 (every logit 0: -0.0 dB)
    assert _sqnr(ref, basic) > 25, _sqnr(ref, basic)
    assert _sqnr(ref, default) > 25, _sqnr(ref, default)
    assert np.abs(default - basic).max() <= 0.05 * np.abs(basic).max()
