"""Fixed-range activations (Tanh, Sigmoid) on QNN HTP, from real torch.onnx exports built
with `build --onnx --device npu` (CPU fallback off).

- A frame decoder ending in Tanh on [1, T, C, H, W] tensors: HTP refuses Tanh at rank 5
  (and with it the graph input's QuantizeLinear), so the `htp` prepare stage computes it at
  rank 4 (`high_rank_unary_to_rank4`); the build places every node on HTP.
- The encodings QNN documents for 16-bit Sigmoid / Tanh outputs (scale 1/65536 offset 0,
  scale 2/65536 zero point 32768) are what w8a16 writes: a guard, since a calibrated
  encoding there is what onnxruntime's own QNN config replaces.
"""

from __future__ import annotations

import platform
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from winml_recipes import api

QNN_WHEELS = platform.system() == "Windows" or (
    platform.system() == "Linux" and platform.machine() == "x86_64"
)
pytestmark = pytest.mark.skipif(not QNN_WHEELS, reason="no onnxruntime-qnn wheel here")
torch = pytest.importorskip("torch")


class FrameDecoder(torch.nn.Module):
    """Latent frames [1, T, 8, 4, 4] -> images [1, T, 3, 16, 16] in [-1, 1]."""

    def __init__(self) -> None:
        super().__init__()
        self.gain = torch.nn.Parameter(torch.full((1, 1, 8, 1, 1), 0.7))
        self.up1 = torch.nn.ConvTranspose2d(8, 8, 4, 2, 1)
        self.up2 = torch.nn.ConvTranspose2d(8, 3, 4, 2, 1)

    def forward(self, frame: torch.Tensor) -> torch.Tensor:
        b, t = frame.shape[:2]
        h = torch.tanh(frame * self.gain).reshape(b * t, 8, 4, 4)
        h = self.up2(torch.relu(self.up1(h)))
        return torch.tanh(h.reshape(b, t, 3, 16, 16))


class SigmoidGate(torch.nn.Module):
    """A gated conv block (x * sigmoid(gate)) and a sigmoid head: a probability map."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.b = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.head = torch.nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.a(x)) * torch.sigmoid(self.b(x))
        return torch.sigmoid(self.head(h))


def _export(module: torch.nn.Module, shape: tuple[int, ...], path: Path) -> Path:
    torch.manual_seed(0)
    module.eval()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            module, (torch.randn(*shape),), str(path), input_names=["x"], output_names=["y"],
            dynamo=False, opset_version=17,
        )  # fmt: skip
    return path


def _build(tmp_path: Path, model: Path, shape: tuple[int, ...], precision: str):
    def npz(name: str, seed: int, n: int) -> str:
        x = np.random.default_rng(seed).normal(size=(n, *shape)).astype(np.float32) * 1.5
        np.savez(tmp_path / name, x=x)
        return str(tmp_path / name)

    result = api.build_onnx(
        model,
        device="npu",
        precision=precision,
        calibration_data=npz("calib.npz", 0, 8),
        eval_data=npz("eval.npz", 1, 2),
        output_root=tmp_path / "out",
    )
    steps = {s["pass"]: s for s in result.manifest["components"]["model"]["steps"]}
    verify = steps["verify"]["metrics"]
    assert verify["verified_on"] == "qnn-htp"
    assert set(verify["placement"]["nodes"]) == {"QNNExecutionProvider"}
    quantized = next((tmp_path / "out").glob(f"*/npu-{precision}/model/model.onnx"))
    return steps, verify, onnx.load(str(quantized), load_external_data=False)


def _output_encodings(model: onnx.ModelProto, op_type: str) -> list[tuple[float, int]]:
    """(scale, zero point) of the QuantizeLinear after each `op_type` node."""
    init = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    outs = {n.output[0] for n in model.graph.node if n.op_type == op_type}
    return [
        (float(init[q.input[1]]), int(init[q.input[2]]))
        for q in model.graph.node
        if q.op_type == "QuantizeLinear" and q.input[0] in outs
    ]


# uint8 runs `algorithms: auto` (candidates scored on HTP): behind slow for the suite's time
@pytest.mark.parametrize("precision", ["w8a16", pytest.param("uint8", marks=pytest.mark.slow)])
def test_frame_decoder_with_rank5_tanh_places_on_htp(tmp_path: Path, precision: str) -> None:
    model = _export(FrameDecoder(), (1, 2, 8, 4, 4), tmp_path / "decoder.onnx")
    steps, verify, quantized = _build(tmp_path, model, (1, 2, 8, 4, 4), precision)
    rewrites = {r["rule"]: r["count"] for r in steps["prepare"]["metrics"]["rewrites"]}
    assert rewrites.get("high_rank_unary_to_rank4") == 2
    # close to the float decoder on HTP, and to the CPU EP's run of the same QDQ model
    assert verify["outputs"]["y"]["sqnr_db"] > 25
    simulation = verify["cpu_simulation"]["outputs"]["y"]["sqnr_db"]
    assert abs(verify["outputs"]["y"]["sqnr_db"] - simulation) < 3
    if precision == "w8a16":
        assert set(_output_encodings(quantized, "Tanh")) == {(2 / 65536, 32768)}


@pytest.mark.slow  # a guard (main already got these right): kept out of CI's wall time
def test_sigmoid_and_tanh_outputs_get_qnn_fixed_16bit_encodings(tmp_path: Path) -> None:
    model = _export(SigmoidGate(), (1, 3, 16, 16), tmp_path / "gate.onnx")
    _, verify, quantized = _build(tmp_path, model, (1, 3, 16, 16), "w8a16")
    assert set(_output_encodings(quantized, "Sigmoid")) == {(1 / 65536, 0)}
    assert set(_output_encodings(quantized, "Tanh")) == {(2 / 65536, 32768)}
    assert len(_output_encodings(quantized, "Sigmoid")) == 2
    assert verify["outputs"]["y"]["sqnr_db"] > 40
