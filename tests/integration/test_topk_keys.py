"""TopK keys that sit within a few 8-bit steps of each other (a score head whose bias
dominates: the tiny RT-DETR's anchor scorer) are kept float at cpu/int8, so the QDQ model
selects what the float model selects (quant/selection_keys.py)."""

from __future__ import annotations

import contextlib
import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from winml_recipes import api
from winml_recipes.sdk.errors import QualityGateError

torch = pytest.importorskip("torch")
SHAPE = (1, 84, 16)  # [batch, anchors, hidden]


class AnchorSelection(torch.nn.Module):
    """Scores per anchor (a bias of -0.693 and a small spread), the top 10, their boxes."""

    def __init__(self, spread: float) -> None:
        super().__init__()
        self.score = torch.nn.Linear(16, 2)
        self.box = torch.nn.Linear(16, 4)
        with torch.no_grad():
            self.score.weight.mul_(spread)
            self.score.bias.fill_(-0.693)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.score(x).max(-1).values
        top = torch.topk(scores, 10, dim=1).indices
        return torch.gather(self.box(x), 1, top.unsqueeze(-1).repeat(1, 1, 4))


def _build(tmp_path: Path, spread: float) -> dict:
    torch.manual_seed(0)
    path = tmp_path / f"m{spread}.onnx"
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            AnchorSelection(spread).eval(), (torch.randn(*SHAPE),), str(path),
            input_names=["x"], output_names=["y"], dynamo=False, opset_version=17,
        )  # fmt: skip

    def npz(name: str, seed: int, n: int) -> str:
        x = np.random.default_rng(seed).normal(size=(n, *SHAPE)).astype(np.float32)
        np.savez(tmp_path / name, x=x)
        return str(tmp_path / name)

    out = tmp_path / f"out{spread}"
    with contextlib.suppress(QualityGateError):  # judged below, from the manifest
        api.build_onnx(
            path, device="cpu", precision="int8", calibration_data=npz("calib.npz", 0, 8),
            eval_data=npz("eval.npz", 1, 4), output_root=out,
        )  # fmt: skip
    manifest = json.loads(next(out.glob("*/cpu-int8*/manifest.json")).read_text())
    return {s["pass"]: s.get("metrics", {}) for s in manifest["components"]["model"]["steps"]}


def test_tied_topk_keys_stay_float_and_the_selection_holds(tmp_path: Path) -> None:
    steps = _build(tmp_path, 0.002)  # keys within about 1 step of their 8-bit encoding
    (chain,) = steps["quantize"]["topk_keys_float"].values()
    assert chain["span_steps"] < 8 and len(chain["nodes"]) == 2  # the bias Add, the ReduceMax
    assert set(chain["nodes"]) <= set(steps["quantize"]["float_nodes"])
    # the boxes of the anchors float selects (measured: 19.6 dB with the keys float, -1.4 dB
    # with them quantized, where rounding picks among ties: other anchors, other boxes)
    assert steps["verify"]["outputs"]["y"]["sqnr_db"] > 15 and steps["verify"]["passed"]


def test_spread_topk_keys_stay_quantized(tmp_path: Path) -> None:
    steps = _build(tmp_path, 3.0)  # a trained scorer's spread: keys over their encoding
    assert "topk_keys_float" not in steps["quantize"]
