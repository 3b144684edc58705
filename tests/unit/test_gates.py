"""Quality gates as records (sdk/gates.py): thresholds, margins, verdicts, output kinds."""

from __future__ import annotations

import numpy as np

from winml_recipes.onnx.metrics import compare_runs
from winml_recipes.sdk.gates import PROBABILITY, Gate, gates_for


def _sparse_scores() -> tuple[np.ndarray, np.ndarray]:
    """A detector's score map: 20,000 anchors near 0, five near 0.9; the candidate adds
    +-0.004 of noise (one u8 step of [0, 1]) everywhere."""
    rng = np.random.default_rng(0)
    ref = rng.uniform(0.0, 0.01, (1, 20000)).astype(np.float32)
    ref[0, :5] = 0.9
    noise = rng.choice([-0.004, 0.004], ref.shape).astype(np.float32)
    return ref, np.clip(ref + noise, 0, 1)


def test_a_sparse_probability_map_is_held_to_its_decisions_not_sqnr() -> None:
    """Its SQNR is low (little signal power) though no score moved more than 0.004; with
    probability_decision_iou it is gated by the IoU of the scores above 0.5 (the five
    detections, all kept), without it by SQNR and cosine."""
    ref, cand = _sparse_scores()
    metrics = compare_runs([{"scores": ref}], [{"scores": cand}])["scores"]
    assert metrics["sqnr_db"] < 20  # what made the detector fail its gate
    limits = {"min_sqnr_db": 20.0, "min_cosine": 0.99, "max_abs": None}
    plain = gates_for("scores", metrics, limits)
    assert [(g.metric, g.passed) for g in plain] == [("sqnr_db", False), ("cosine", False)]
    kinded = gates_for("scores", metrics, limits, probability_decision_iou=0.8)
    assert [(g.metric, g.kind, g.value) for g in kinded] == [("decision_iou", PROBABILITY, 1.0)]


def test_a_lost_detection_fails_the_decision_gate_whatever_the_background() -> None:
    """Two of five detections dropped below 0.5: IoU 3/5, below 0.8, although 19,998 of
    20,000 scores agree (a share of agreeing elements would pass a dead detector)."""
    ref, cand = _sparse_scores()
    cand[0, :2] = 0.3
    metrics = compare_runs([{"scores": ref}], [{"scores": cand}])["scores"]
    gate = gates_for("scores", metrics, {}, probability_decision_iou=0.8)[0]
    assert gate.value == 3 / 5 and not gate.passed
    assert (
        gate.line() == "scores (probability map): decision IoU 0.6 (gate >= 0.8, margin -0.2) FAIL"
    )


def test_values_outside_unit_range_keep_sqnr() -> None:
    ref, cand = _sparse_scores()
    metrics = compare_runs([{"boxes": ref * 640 - 3}], [{"boxes": cand * 640 - 3}])["boxes"]
    gates = gates_for("boxes", metrics, {"min_sqnr_db": 20.0}, probability_decision_iou=0.8)
    assert [g.metric for g in gates] == ["sqnr_db"] and gates[0].kind is None


def test_gate_records_round_trip_and_read_as_verdicts() -> None:
    gate = Gate("pred_masks", "sqnr_db", 25.3, 20.0)
    assert gate.passed and abs(gate.margin - 5.3) < 1e-9
    assert Gate.from_manifest(gate.to_manifest()) == gate
    assert gate.line() == "pred_masks: SQNR 25.3 dB (gate >= 20 dB, margin +5.3 dB) pass"
    tight = Gate("object_score_logits", "sqnr_db", 15.1, 15.0)
    assert tight.line().endswith("(gate >= 15 dB, margin +0.1 dB) pass")
    assert not Gate("o", "cosine", 0.98, 0.99).passed
