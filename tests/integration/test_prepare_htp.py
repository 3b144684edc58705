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


@pytest.mark.parametrize("precision", ["w8a16", "uint8"])
def test_a_gru_over_the_unroll_budget_stops_at_prepare_with_the_same_diagnosis(
    tmp_path: Path, precision: str
) -> None:
    """A GRU longer than the step budget measured on HTP: at either precision the build stops
    at `prepare`, before calibration or any HTP session, with one line naming the node and
    the next step (before: the GRU was kept, HTP failed to finalize it with MEM_ALLOC after
    quantization, and at uint8 the failure surfaced inside quantize's candidate search)."""
    from winml_recipes.graph.recurrent import MAX_MODEL_STEPS

    seq = MAX_MODEL_STEPS + 8
    model = prepare_models.recurrent(tmp_path / "gru.onnx", "GRU", False, seq=seq, opset=14)
    done = cli("build", "--onnx", model, "--device", "npu", "--precision", precision,
               "-o", tmp_path / "o")  # fmt: skip
    assert done.exit_code != 0
    (line,) = [s for s in done.stderr.splitlines() if s.startswith("error:")]
    assert f"model/prepare [npu/{precision}]: recurrent node '/rnn/GRU' (GRU, {seq} steps" in line
    assert f"next step: export the model over windows of at most {MAX_MODEL_STEPS} steps" in line
    assert "model: quantize" not in done.stderr
