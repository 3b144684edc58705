"""Activations far below onnxruntime's QNN range floor (1e-4) keep their precision on HTP.

The tiny MobileViT's encoder runs at 1e-8 (random weights shrink each 1x1 conv): with the
floor, a 16-bit step of 1.5e-9 leaves a few levels of such a tensor, and its segmentation
failed on the CPU simulation as on HTP. Here a pair of 1x1 convs takes a signal down by 1e-7
and back up (a real torch export), built npu/w8a16 with CPU fallback off.
"""

from __future__ import annotations

import platform
import warnings
from pathlib import Path

import numpy as np
import pytest

from winml_recipes import api

QNN_WHEELS = platform.system() == "Windows" or (
    platform.system() == "Linux" and platform.machine() == "x86_64"
)
pytestmark = pytest.mark.skipif(not QNN_WHEELS, reason="no onnxruntime-qnn wheel here")
torch = pytest.importorskip("torch")


class Shrink(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.down = torch.nn.Conv2d(8, 16, 1)
        self.up = torch.nn.Conv2d(16, 8, 1)
        with torch.no_grad():
            self.down.weight.mul_(1e-7)
            self.down.bias.mul_(1e-7)
            self.up.weight.mul_(1e6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(torch.relu(self.down(x)))


def test_a_tensor_at_1e_minus_7_keeps_its_precision_on_htp(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = tmp_path / "shrink.onnx"
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            Shrink().eval(), (torch.randn(1, 8, 16, 16),), str(model), input_names=["x"],
            output_names=["y"], dynamo=False, opset_version=17,
        )  # fmt: skip
    for name, seed, n in (("calib.npz", 0, 8), ("eval.npz", 1, 2)):
        x = np.random.default_rng(seed).normal(size=(n, 1, 8, 16, 16)).astype(np.float32)
        np.savez(tmp_path / name, x=x)
    result = api.build_onnx(
        model,
        device="npu",
        precision="w8a16",
        calibration_data=str(tmp_path / "calib.npz"),
        eval_data=str(tmp_path / "eval.npz"),
        output_root=tmp_path / "out",
    )
    steps = {s["pass"]: s for s in result.manifest["components"]["model"]["steps"]}
    verify = steps["verify"]["metrics"]
    assert verify["verified_on"] == "qnn-htp"
    assert set(verify["placement"]["nodes"]) == {"QNNExecutionProvider"}
    # 16-bit activations over the tensor's own range: well above 30 dB (0 dB with the floor)
    assert verify["cpu_simulation"]["outputs"]["y"]["sqnr_db"] > 30
    assert verify["outputs"]["y"]["sqnr_db"] > 30
