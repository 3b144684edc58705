"""Task metrics between the float model's outputs and a candidate's, on held-out samples.

Each takes two lists of output dicts (float reference, candidate), one per sample, and
returns a score in [0, 1] where 1 means the candidate does the task exactly as float does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from winml_recipes.sdk.metrics import TaskMetric

Outputs = dict[str, np.ndarray]
Metric = Callable[[Sequence[Outputs], Sequence[Outputs]], float]


def _out(feed: Outputs, name: str | int) -> np.ndarray:
    if isinstance(name, int):
        return np.asarray(list(feed.values())[name])
    return np.asarray(feed[name])


def top1(output: str | int = 0) -> Metric:
    """Share of samples whose arg-max class is the float model's."""

    def score(ref: Sequence[Outputs], cand: Sequence[Outputs]) -> float:
        hits = [
            np.array_equal(_out(r, output).argmax(-1), _out(c, output).argmax(-1))
            for r, c in zip(ref, cand, strict=True)
        ]
        return float(np.mean(hits))

    return score


def cosine(output: str | int = 0) -> Metric:
    """Mean cosine of the output's last-axis vectors (embeddings)."""

    def score(ref: Sequence[Outputs], cand: Sequence[Outputs]) -> float:
        out = []
        for r, c in zip(ref, cand, strict=True):
            a = _out(r, output).astype(np.float64)
            a = a.reshape(-1, a.shape[-1])
            b = _out(c, output).astype(np.float64).reshape(a.shape)
            den = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1) + 1e-30
            out += list((a * b).sum(-1) / den)
        return float(np.mean(out))

    return score


def plugin(metric: TaskMetric, value: str) -> Metric:
    """One value of the tool's task metric plugin (what `build --task` judges by): box F1
    (winml_recipes/metrics/detection.py), CTC character agreement (metrics/text.py)."""

    def score(ref: Sequence[Outputs], cand: Sequence[Outputs]) -> float:
        return float(metric.values(ref, cand)[value])

    return score


def mask_iou(output: str | int = 0, threshold: float = 0.5) -> Metric:
    """IoU of the foreground (output > threshold) over all held-out samples."""

    def score(ref: Sequence[Outputs], cand: Sequence[Outputs]) -> float:
        inter = union = 0
        for r, c in zip(ref, cand, strict=True):
            a, b = _out(r, output) > threshold, _out(c, output) > threshold
            inter += int((a & b).sum())
            union += int((a | b).sum())
        return 1.0 if union == 0 else inter / union

    return score


def within(output: str | int, tolerance: float, of_argmax: bool = False) -> Metric:
    """Share of values (or arg-max bins) within `tolerance` of float's: pitch bins for CREPE
    (1 bin = 20 cents), speech probabilities for a VAD."""

    def score(ref: Sequence[Outputs], cand: Sequence[Outputs]) -> float:
        hits = []
        for r, c in zip(ref, cand, strict=True):
            a, b = _out(r, output), _out(c, output)
            if of_argmax:
                a, b = a.argmax(-1), b.argmax(-1)
            hits += list(np.abs(a.astype(np.float64) - b).reshape(-1) <= tolerance)
        return float(np.mean(hits))

    return score


def sequence_agreement(output: str | int, end: int) -> Metric:
    """Share of decoded positions whose arg-max token is float's, over each sample's
    positions up to and including float's first `end` token (greedy decoding, teacher-forced
    on float's own tokens: a g2p model's phoneme agreement)."""

    def score(ref: Sequence[Outputs], cand: Sequence[Outputs]) -> float:
        hits: list[bool] = []
        for r, c in zip(ref, cand, strict=True):
            a = _out(r, output).argmax(-1).reshape(-1)
            b = _out(c, output).argmax(-1).reshape(-1)
            stop = np.flatnonzero(a == end)
            n = int(stop[0]) + 1 if len(stop) else len(a)
            hits += list(a[:n] == b[:n])
        return float(np.mean(hits))

    return score
