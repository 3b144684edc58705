"""A product of attention weights and 1e-7 values stays quantized and right on HTP
(eps/qnn/rules/products.py).

HTP's MatMul of two 16-bit activations loses an operand's values far below 1e-3 (the tiny
random-weight MobileViT's attention read values at 1e-8). Here a real torch export,
`(softmax(scores) @ (values * 1e-7)) * 1e7`, built npu/w8a16 with CPU fallback off. Before
the rescale: HTP 0.4 dB against 83 dB simulated on the first held-out sample, and the build's
divergence repair left the MatMul in float.
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


class TinyProduct(torch.nn.Module):
    """Attention weights times values at 1e-7 (as the tiny MobileViT's), then scaled back."""

    def forward(self, scores: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return (torch.softmax(scores, dim=-1) @ (values * 1e-7)) * 1e7


def test_an_attention_product_of_1e_minus_8_values_agrees_on_htp(tmp_path: Path) -> None:
    model = tmp_path / "product.onnx"
    shapes = {"scores": (1, 2, 16, 16), "values": (1, 2, 16, 8)}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            TinyProduct().eval(), tuple(torch.randn(s) for s in shapes.values()), str(model),
            input_names=list(shapes), output_names=["y"], dynamo=False, opset_version=17,
        )  # fmt: skip
    for name, seed, n in (("calib.npz", 0, 8), ("eval.npz", 1, 2)):
        rng = np.random.default_rng(seed)
        np.savez(tmp_path / name, **{
            k: rng.normal(size=(n, *s)).astype(np.float32) for k, s in shapes.items()
        })  # fmt: skip
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
    simulated = verify["cpu_simulation"]["outputs"]["y"]["sqnr_db"]
    repair = steps["quantize"]["metrics"]["divergence_repair"]
    # before the rescale: HTP 0.4 dB against 83 dB simulated on the first held-out sample,
    # and the build's repair left the MatMul in float
    assert repair["before"]["target_vs_simulation_db"]["y"] > 40
    assert repair["repaired"] == [] and not steps["quantize"]["metrics"]["float_nodes"]
    assert simulated > 20
    assert verify["outputs"]["y"]["sqnr_db"] > simulated - 3
    rescaled = steps["quantize"]["metrics"]["htp_rescaled_products"]
    assert len(rescaled) == 1 and 20 <= next(iter(rescaled.values())) <= 24  # values ~1e-7
