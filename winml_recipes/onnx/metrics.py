"""Numerical comparison of candidate outputs against reference outputs.

All sums are accumulated in float64 across every batch, so the metrics of several input
sets are those of their concatenation. SQNR is capped at +/-SQNR_CAP_DB so identical
outputs give a finite number and the result stays valid JSON.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

SQNR_CAP_DB = 200.0
DECISION = 0.5  # where a score map's decisions are read (decision_iou)


class _Acc:
    """Running sums for one output."""

    def __init__(self) -> None:
        self.n = 0
        self.max_abs = 0.0
        self.sum_abs = 0.0
        self.dot = 0.0
        self.ref2 = 0.0
        self.cand2 = 0.0
        self.err2 = 0.0
        self.nonfinite = 0
        self.ref_min = math.inf
        self.ref_max = -math.inf
        self.above_both = 0  # elements above 0.5 on both sides (decisions of a score map)
        self.above_either = 0

    def add(self, ref: np.ndarray, cand: np.ndarray) -> None:
        r = np.asarray(ref, dtype=np.float64).ravel()
        c = np.asarray(cand, dtype=np.float64).ravel()
        same = (r == c) | (np.isnan(r) & np.isnan(c))
        finite = np.isfinite(r) & np.isfinite(c)
        self.nonfinite += int(np.count_nonzero(~finite & ~same))
        r, c = r[finite], c[finite]
        err = r - c
        self.n += r.size
        if r.size:
            self.max_abs = max(self.max_abs, float(np.max(np.abs(err))))
            self.ref_min = min(self.ref_min, float(r.min()))
            self.ref_max = max(self.ref_max, float(r.max()))
            r_up, c_up = r > DECISION, c > DECISION
            self.above_both += int(np.count_nonzero(r_up & c_up))
            self.above_either += int(np.count_nonzero(r_up | c_up))
        self.sum_abs += float(np.sum(np.abs(err)))
        self.dot += float(np.dot(r, c))
        self.ref2 += float(np.dot(r, r))
        self.cand2 += float(np.dot(c, c))
        self.err2 += float(np.dot(err, err))

    def result(self) -> dict[str, float]:
        if self.ref2 == 0.0 and self.cand2 == 0.0:
            cosine = 1.0
        elif self.ref2 == 0.0 or self.cand2 == 0.0:
            cosine = 0.0
        else:
            cosine = self.dot / (math.sqrt(self.ref2) * math.sqrt(self.cand2))
        if self.nonfinite:
            sqnr = -SQNR_CAP_DB
        elif self.err2 == 0.0:
            sqnr = SQNR_CAP_DB
        elif self.ref2 == 0.0:
            sqnr = -SQNR_CAP_DB
        else:
            sqnr = 10.0 * math.log10(self.ref2 / self.err2)
        return {
            "max_abs": self.max_abs,
            "mean_abs": self.sum_abs / self.n if self.n else 0.0,
            "cosine": max(-1.0, min(1.0, cosine)),
            "sqnr_db": max(-SQNR_CAP_DB, min(SQNR_CAP_DB, sqnr)),
            "nonfinite": float(self.nonfinite),
            # the float output's value range (what kind of output it is: scores, offsets)
            **({"ref_min": self.ref_min, "ref_max": self.ref_max} if self.n else {}),
            # read as scores: IoU of the elements above 0.5 on each side (1: none on either)
            "decision_iou": self.above_both / self.above_either if self.above_either else 1.0,
        }


def compare_runs(
    refs: Sequence[Mapping[str, np.ndarray]], cands: Sequence[Mapping[str, np.ndarray]]
) -> dict[str, dict[str, float]]:
    """Per reference output: max_abs, mean_abs, cosine, sqnr_db, nonfinite, the reference's
    finite range (ref_min, ref_max) and decision_iou (of the elements above 0.5 on each
    side), over all batches.

    `nonfinite` counts candidate/reference elements where one side is NaN/inf and the other
    differs; any such element sets sqnr_db to -SQNR_CAP_DB. Candidate outputs that the
    reference lacks are ignored.
    """
    if len(refs) != len(cands):
        raise ValueError(f"{len(refs)} reference runs but {len(cands)} candidate runs")
    accs: dict[str, _Acc] = {}
    for i, (ref, cand) in enumerate(zip(refs, cands, strict=True)):
        for name, r in ref.items():
            if name not in cand:
                raise ValueError(f"output '{name}': missing from the candidate (run {i})")
            r_arr, c_arr = np.asarray(r), np.asarray(cand[name])
            if r_arr.shape != c_arr.shape:
                raise ValueError(
                    f"output '{name}': shape {list(c_arr.shape)} differs from the "
                    f"reference {list(r_arr.shape)} (run {i})"
                )
            accs.setdefault(name, _Acc()).add(r_arr, c_arr)
    return {name: acc.result() for name, acc in accs.items()}


def compare_outputs(
    reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray]
) -> dict[str, dict[str, float]]:
    """`compare_runs` for a single batch."""
    return compare_runs([reference], [candidate])


def output_metrics(
    refs: Sequence[Mapping[str, np.ndarray]], cands: Sequence[Mapping[str, np.ndarray]]
) -> dict[str, dict[str, float]]:
    """compare_runs, with each softmax output's whole-sample `argmax_agreement`: what
    verify's per-output gates read."""
    metrics = compare_runs(refs, cands)
    for name, agreement in argmax_agreement(refs, cands).items():
        metrics[name]["argmax_agreement"] = agreement
    return metrics


DISTRIBUTION_TOLERANCE = 1e-3  # how far from 1 a softmax row's sum may be (float rounding)


def argmax_agreement(
    refs: Sequence[Mapping[str, np.ndarray]], cands: Sequence[Mapping[str, np.ndarray]]
) -> dict[str, float]:
    """For each output the reference keeps as distributions over its last axis (every row
    >= 0 and summing to 1: a softmax over classes), the share of samples whose WHOLE argmax
    over that axis equals the reference's (a classifier's top-1; a sequence model's every
    step). Other outputs are left out.

    A softmax can keep most decisions (elements above 0.5) at 9 dB SQNR while the classes
    it picks at a few steps change, and one changed step changes a decoded line."""
    same: dict[str, int] = {}
    count: dict[str, int] = {}
    skip: set[str] = set()
    for ref, cand in zip(refs, cands, strict=True):
        for name, r in ref.items():
            r_arr = np.asarray(r)
            if name in skip or name not in cand or not _distribution(r_arr):
                skip.add(name)
                continue
            c_arr = np.asarray(cand[name])
            same[name] = same.get(name, 0) + bool(
                c_arr.shape == r_arr.shape and np.array_equal(r_arr.argmax(-1), c_arr.argmax(-1))
            )
            count[name] = count.get(name, 0) + 1
    return {n: same[n] / count[n] for n in count if n not in skip}


def _distribution(x: np.ndarray) -> bool:
    if not np.issubdtype(x.dtype, np.floating) or x.ndim < 2 or x.shape[-1] < 2 or not x.size:
        return False
    if not np.all(np.isfinite(x)) or x.min() < 0:
        return False
    return bool(np.all(np.abs(x.sum(-1, dtype=np.float64) - 1.0) <= DISTRIBUTION_TOLERANCE))
