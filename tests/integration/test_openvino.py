"""The OpenVINO plugin EP (onnxruntime-ep-openvino) on this host's CPU device.

Real OpenVINO sessions: device selection (the plugin picks the device by EP device, not
by provider option), the quantization rules (OpenVINO's QDQ scheme, written by
onnxruntime's quantizer), and a QDQ sam3-tiny component opened with every node on
OpenVINO and verified against the float model. Facts: docs/eps/openvino.md.
"""

from __future__ import annotations

import platform
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from winml_recipes.eps import openvino
from winml_recipes.onnx.metrics import compare_runs
from winml_recipes.sdk.errors import ExecutionProviderError

# onnxruntime-ep-openvino ships wheels for Windows and Linux x86_64 (pyproject's `openvino`
# extra); there `make install` installs it and every test here must run.
OV_WHEELS = platform.system() == "Windows" or (
    platform.system() == "Linux" and platform.machine() == "x86_64"
)
pytestmark = pytest.mark.skipif(not OV_WHEELS, reason="no onnxruntime-ep-openvino wheel here")


def test_openvino_loads_and_records_its_device() -> None:
    ok, why = openvino.available()
    assert ok, why
    info = openvino.device_info("npu")
    assert info is not None
    # this host has no Intel NPU: the CPU device stands in, and says so
    assert (info.ov_device, info.requested, info.stand_in) == ("CPU", "NPU", True)
    assert "ran on CPU" in info.to_manifest()["stand_in"]
    assert info.name  # FULL_DEVICE_NAME, e.g. "Intel(R) Xeon(R) Processor"
    assert openvino.device_info("cpu").stand_in is False
    versions = openvino.versions()
    assert versions["onnxruntime-ep-openvino"] == "1.8.1"
    assert versions["openvino_ep_library"].startswith("1.8.1")
    assert versions["openvino_device"].startswith("CPU: ")
    assert versions["openvino_device"].endswith("(standing in for the NPU)")
    assert openvino.PLUGIN.emulation_note() == "OpenVINO CPU device standing in for the NPU"


def test_device_type_selects_the_ep_device_and_is_not_passed_on() -> None:
    """The plugin ignores a `device_type` provider option, so it is ours: it picks the EP
    device, and asking for a device by name allows no stand-in."""
    import onnxruntime as ort

    assert openvino.available()[0]
    devices = ort.get_ep_devices()
    assert openvino.choose_device(devices, "npu", {"device_type": "npu"}) is None
    found = openvino.choose_device(devices, "npu", {"device_type": "CPU"})
    assert found is not None and found[0].ep_metadata["ov_device"] == "CPU"
    assert found[0].ep_name == "OpenVINOExecutionProvider"  # not the .AUTO meta device
    options = openvino.PLUGIN.provider_options("npu", {"device_type": "CPU", "num_streams": "1"})
    assert options == {"num_streams": "1"}


def _add_concat_model() -> onnx.ModelProto:
    w = numpy_helper.from_array(np.ones((1, 4), np.float32), "w")
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Sigmoid", ["x"], ["b"]),
        helper.make_node("Tanh", ["x"], ["c"]),
        helper.make_node("Add", ["a", "b"], ["s"]),
        helper.make_node("Concat", ["b", "c"], ["k"], axis=1),
        helper.make_node("Mul", ["s", "w"], ["y"]),  # w is a weight: not an activation
        helper.make_node("MatMul", ["k", "k2"], ["z"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "z")],
        [w, numpy_helper.from_array(np.ones((8, 2), np.float32), "k2")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_unified_scales_share_one_range() -> None:
    model = _add_concat_model()
    acts = ["x", "a", "b", "c", "s", "k", "y", "z"]
    assert openvino.unified_scale_groups(model, acts) == [["a", "b", "c"]]
    ranges = {"a": (0.0, 1.0), "b": (0.0, 0.5), "c": (-2.0, 0.25), "s": (0.0, 3.0)}
    out, metrics = openvino.QUANT_RULES.adjust_ranges(model, ranges, acts)
    assert out["a"] == out["b"] == out["c"] == (-2.0, 1.0)
    assert out["s"] == (0.0, 3.0)
    assert metrics == {"unified_scales": [["a", "b", "c"]]}


class _Reader:
    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self._it = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)


def _quantize(src: Path, dst: Path, feeds: list[dict[str, np.ndarray]], **override) -> Path:
    from onnxruntime.quantization import quantize_static

    cfg = SimpleNamespace(
        **{**openvino.QUANT_RULES.defaults, "reduce_range": False, "op_types": (), **override}
    )
    args = openvino.QUANT_RULES.quantizer_args(src, cfg, {}, [])
    assert args is not None
    quantize_static(str(src), str(dst), _Reader(feeds), **args)
    return dst


def _pixels(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        {"pixel_values": rng.uniform(-1, 1, (1, 3, 112, 112)).astype(np.float32)} for _ in range(n)
    ]


def test_sam3_tiny_encoder_qdq_runs_on_openvino_cpu(tiny_build, tmp_path: Path) -> None:
    """OpenVINO's scheme on the float sam3-tiny vision encoder: u8 asymmetric activations,
    s8 symmetric per-channel weights; every node on OpenVINO; close to the float model."""
    import onnxruntime as ort

    src = tiny_build.output_dir / "vision_encoder" / "model.onnx"
    qdq = _quantize(src, tmp_path / "ve.onnx", _pixels(4, 0))
    model = onnx.load(qdq)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    weights = [
        n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits
    ]
    acts = [n for n in model.graph.node if n.op_type == "QuantizeLinear"]
    assert weights and acts
    conv_or_matmul_weights = [n for n in weights if inits[n.input[0]].dtype == np.int8]
    assert conv_or_matmul_weights
    for n in conv_or_matmul_weights:  # symmetric: zero points 0, values within -127..127
        assert not np.any(inits[n.input[2]]) and inits[n.input[0]].min() >= -127
    assert any(inits[n.input[1]].size > 1 for n in conv_or_matmul_weights)  # per channel
    assert {inits[n.input[2]].dtype for n in acts} == {np.dtype(np.uint8)}
    assert any(int(inits[n.input[2]]) != 128 for n in acts)  # asymmetric
    # ConvTranspose is not in OpenVINO's NPU list: its weights stay float
    deconvs = [n for n in model.graph.node if n.op_type == "ConvTranspose"]
    assert deconvs and all(n.input[1] in inits for n in deconvs)

    session, info = openvino.open_session(qdq, "npu")  # no CPU fallback
    assert list(openvino.placement(session)) == ["OpenVINOExecutionProvider"]
    assert (info.ov_device, info.requested) == ("CPU", "NPU")
    reference = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    held_out = _pixels(2, 7)
    ours = [dict(zip(names, session.run(names, f), strict=True)) for f in held_out]
    ref = [dict(zip(names, reference.run(names, f), strict=True)) for f in held_out]
    metrics = compare_runs(ref, ours)
    # measured 27-30 dB on random pixels (docs/eps/openvino.md); a broken scheme is < 10 dB
    assert min(m["sqnr_db"] for m in metrics.values()) > 20, metrics


def test_int8_activations_do_not_compile_on_openvino_cpu(tiny_build, tmp_path: Path) -> None:
    """Why the rules refuse int8 activations: OpenVINO's CPU device has no kernel for the
    encoder quantized that way."""
    src = tiny_build.output_dir / "vision_encoder" / "model.onnx"
    qdq = _quantize(src, tmp_path / "ve-s8.onnx", _pixels(2, 0), activation_type="int8")
    with pytest.raises(ExecutionProviderError, match="No suitable implementations"):
        openvino.open_session(qdq, "cpu")
    assert openvino.QUANT_RULES.check(SimpleNamespace(activation_type="int8")) is not None
