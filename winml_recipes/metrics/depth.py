"""depth-estimation: does the target see the float model's depth (AbsRel, delta < 1.25)?"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from winml_recipes.sdk.contract import IOContract
from winml_recipes.sdk.metrics import DefaultGate, Outputs, TaskMetric

# Pixels whose float depth is under this share of the sample's largest are left out (a
# ReLU head's zeros would make every relative error infinite).
VALID_SHARE = 0.01
# AbsRel of a sample with no such pixel whose maps differ: no finite ratio says it, and the
# manifest is JSON (no Infinity); far past any gate, as onnx/metrics.py caps SQNR.
ABS_REL_CAP = 1e6


def depth_values(reference: np.ndarray, candidate: np.ndarray) -> tuple[float, float]:
    """(AbsRel, share of pixels within a factor 1.25) of `candidate` against `reference`."""
    ref = np.asarray(reference, np.float64).ravel()
    cand = np.asarray(candidate, np.float64).ravel()
    top = float(np.max(np.abs(ref))) if ref.size else 0.0
    valid = ref > VALID_SHARE * top if top > 0 else np.zeros(ref.shape, bool)
    if not valid.any():
        same = np.array_equal(ref, cand)
        return 0.0 if same else ABS_REL_CAP, 1.0 * same
    r, c = ref[valid], cand[valid]
    abs_rel = min(float(np.mean(np.abs(c - r) / r)), ABS_REL_CAP)
    ratio = np.maximum(c / r, r / np.where(c > 0, c, np.inf))
    delta = float(np.mean((c > 0) & (ratio < 1.25)))
    return abs_rel, delta


class DepthAgreement(TaskMetric):
    """Per sample, the float model's depth map is the truth: AbsRel (mean |target - float|
    / float) and delta1 (share of pixels where max(target/float, float/target) < 1.25),
    over the pixels whose float depth is at least 1% of the sample's largest."""

    name = "depth-agreement"
    tasks = frozenset({"depth-estimation"})
    description = (
        "against the float depth map, pixels at >= 1% of its largest: abs_rel (mean |target - "
        "float| / float, mean and _worst over samples) and delta1 (share of pixels within a "
        "factor 1.25, mean and _worst)"
    )
    gates = {"abs_rel_worst": DefaultGate(0.1, higher_is_better=False),
             "delta1_worst": DefaultGate(0.9)}  # fmt: skip
    lower_is_better = frozenset({"abs_rel", "abs_rel_worst"})

    def outputs_used(self, contract: IOContract) -> tuple[str, ...] | None:
        names = [s.name for s in contract.outputs]
        if "predicted_depth" in names:
            return ("predicted_depth",)
        maps = [s.name for s in contract.outputs if len(s.shape) in (3, 4)]
        return (maps[0],) if len(names) == 1 and maps else None

    def values(
        self, reference: Sequence[Outputs], candidate: Sequence[Outputs]
    ) -> dict[str, float]:
        name = "predicted_depth" if "predicted_depth" in reference[0] else next(iter(reference[0]))
        rows = [
            depth_values(ref[name], cand[name])
            for ref, cand in zip(reference, candidate, strict=True)
        ]
        rel = [r for r, _ in rows]
        delta = [d for _, d in rows]
        return {
            "abs_rel": float(np.mean(rel)),
            "abs_rel_worst": float(np.max(rel)),
            "delta1": float(np.mean(delta)),
            "delta1_worst": float(np.min(delta)),
            "samples": float(len(rows)),
        }
