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


def test_a_sparse_probability_map_is_held_to_max_abs_not_sqnr() -> None:
    """Its SQNR is low (little signal power) though no score moved more than 0.004; with
    probability_max_abs it is gated by max_abs, without it by SQNR and cosine."""
    ref, cand = _sparse_scores()
    metrics = compare_runs([{"scores": ref}], [{"scores": cand}])["scores"]
    assert metrics["sqnr_db"] < 20  # what made the detector fail its gate
    limits = {"min_sqnr_db": 20.0, "min_cosine": 0.99, "max_abs": None}
    plain = gates_for("scores", metrics, limits)
    assert [(g.metric, g.passed) for g in plain] == [("sqnr_db", False), ("cosine", False)]
    kinded = gates_for("scores", metrics, limits, probability_max_abs=0.1)
    assert [(g.metric, g.kind, g.passed) for g in kinded] == [("max_abs", PROBABILITY, True)]
    assert abs(kinded[0].margin - (0.1 - metrics["max_abs"])) < 1e-12


def test_values_outside_unit_range_keep_sqnr_and_name_the_kind_on_failure() -> None:
    ref, cand = _sparse_scores()
    metrics = compare_runs([{"boxes": ref * 640 - 3}], [{"boxes": cand * 640 - 3}])["boxes"]
    gates = gates_for("boxes", metrics, {"min_sqnr_db": 20.0}, probability_max_abs=0.1)
    assert [g.metric for g in gates] == ["sqnr_db"] and gates[0].kind is None
    bad = gates_for(
        "s", {"max_abs": 0.3, "ref_min": 0.0, "ref_max": 1.0}, {}, probability_max_abs=0.1
    )
    assert bad[0].line() == "s (probability map): max_abs 0.3 (gate <= 0.1, margin -0.2) FAIL"


def test_gate_records_round_trip_and_read_as_verdicts() -> None:
    gate = Gate("pred_masks", "sqnr_db", 25.3, 20.0)
    assert gate.passed and abs(gate.margin - 5.3) < 1e-9
    assert Gate.from_manifest(gate.to_manifest()) == gate
    assert gate.line() == "pred_masks: SQNR 25.3 dB (gate >= 20 dB, margin +5.3 dB) pass"
    tight = Gate("object_score_logits", "sqnr_db", 15.1, 15.0)
    assert tight.line().endswith("(gate >= 15 dB, margin +0.1 dB) pass")
    assert not Gate("o", "cosine", 0.98, 0.99).passed
