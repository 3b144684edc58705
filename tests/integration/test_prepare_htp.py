"""npu builds of graphs QNN HTP refuses or cannot finalize as exported, made runnable by the
`prepare` step: every node on QNN HTP with CPU fallback off, verified there.

Without `prepare` (the presets before it), the detector failed with `QNNExecutionProvider
(htp) refused 19 node(s): ... grid/range_x (Range) ...` and the LSTM and GRU models with
`Failed to finalize QNN graph. Error: QNN_COMMON_ERROR_MEM_ALLOC`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import prepare_models
from tests.conftest import cli
from tests.integration.test_qnn import QNN_WHEELS

pytestmark = pytest.mark.skipif(not QNN_WHEELS, reason="no onnxruntime-qnn wheel here")


def _build(model: Path, out: Path, *args: str) -> dict:
    done = cli("build", "--onnx", model, "--device", "npu", "--precision", "w8a16",
               "-o", out, "--json", *args)  # fmt: skip
    assert done.exit_code == 0, done.stderr
    return {s["pass"]: s for s in json.loads(done.stdout)["components"]["model"]["steps"]}


def _all_on_htp(steps: dict) -> None:
    verify = steps["verify"]["metrics"]
    assert verify["verified_on"] == "qnn-htp"
    assert verify["cpu_fallback_allowed"] is False
    assert set(verify["placement"]["nodes"]) == {"QNNExecutionProvider"}


def test_detector_anchor_grid_reaches_htp(tmp_path: Path) -> None:
    model = prepare_models.detector(tmp_path / "det.onnx")
    steps = _build(model, tmp_path / "o", "--shape", "images=1x3x64x64")
    assert list(steps) == [
        "export", "normalize", "fix_shapes", "prepare", "quantize", "verify", "compile"
    ]  # fmt: skip
    prepared = steps["prepare"]["metrics"]
    assert prepared["nodes_after"] < prepared["nodes_before"]
    assert prepared["folded"]["Range"] == 2
    rules = {r["rule"]: r for r in prepared["rewrites"]}
    assert "grid/range_y" in rules["fold_constants"]["nodes"]
    assert prepared["checked_samples"] == 1
    _all_on_htp(steps)


@pytest.mark.parametrize(
    ("kind", "bidirectional"), [("LSTM", False), ("GRU", True)], ids=["lstm", "gru-bidirectional"]
)
def test_recurrent_models_reach_htp(tmp_path: Path, kind: str, bidirectional: bool) -> None:
    model = prepare_models.recurrent(tmp_path / "rnn.onnx", kind, bidirectional, opset=13)
    steps = _build(model, tmp_path / "o")
    rewrites = steps["prepare"]["metrics"]["rewrites"]
    rule = "unroll_lstm" if kind == "LSTM" else "unroll_gru"
    assert [r["rule"] for r in rewrites] == [rule]
    _all_on_htp(steps)
    outputs = steps["verify"]["metrics"]["outputs"]
    assert min(o["sqnr_db"] for o in outputs.values()) > 20
