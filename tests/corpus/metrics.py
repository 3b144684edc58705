"""Task metrics between the float model's outputs and a candidate's, on held-out samples.

Each takes two lists of output dicts (float reference, candidate), one per sample, and
returns a score in [0, 1] where 1 means the candidate does the task exactly as float does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

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


def ctc_decode(ids: np.ndarray, blank: int = 0) -> list[int]:
    """Greedy CTC: repeats merged, blanks dropped."""
    out, last = [], None
    for k in np.asarray(ids).reshape(-1).tolist():
        if k != last and k != blank:
            out.append(k)
        last = k
    return out


def edit_distance(a: list[int], b: list[int]) -> int:
    """Levenshtein distance of two label sequences."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def characters(output: str | int = 0, argmax: bool = True, blank: int = 0) -> Metric:
    """1 - character error rate of the candidate's CTC-decoded text against float's.
    `argmax=False` when the model already outputs class ids."""

    def decode(x: np.ndarray) -> list[int]:
        return ctc_decode(x.argmax(-1) if argmax else x, blank)

    def score(ref: Sequence[Outputs], cand: Sequence[Outputs]) -> float:
        errors = total = 0
        for r, c in zip(ref, cand, strict=True):
            want = decode(_out(r, output))
            errors += edit_distance(want, decode(_out(c, output)))
            total += max(1, len(want))
        return max(0.0, 1.0 - errors / total)

    return score


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU matrix of xyxy boxes [n, 4] x [m, 4]."""
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), -1)
    area = lambda x: np.prod(np.clip(x[:, 2:] - x[:, :2], 0, None), -1)  # noqa: E731
    return inter / (area(a)[:, None] + area(b)[None] - inter + 1e-9)


def nms(boxes: np.ndarray, scores: np.ndarray, iou: float) -> np.ndarray:
    """Indices kept by greedy non-maximum suppression."""
    order, keep = np.argsort(-scores), []
    while order.size:
        i = order[0]
        keep.append(i)
        order = order[1:][box_iou(boxes[i : i + 1], boxes[order[1:]])[0] <= iou]
    return np.asarray(keep, np.int64)


Detections = tuple[np.ndarray, np.ndarray]  # boxes [n, 4] xyxy, labels [n]


def box_f1(decode: Callable[[Outputs], Detections], iou: float = 0.5) -> Metric:
    """F1 of the candidate's detections against float's (after the model's own decoding and
    NMS): a detection matches a float one of the same label at IoU >= `iou`, greedily."""

    def score(ref: Sequence[Outputs], cand: Sequence[Outputs]) -> float:
        tp = fp = fn = 0
        for r, c in zip(ref, cand, strict=True):
            (rb, rl), (cb, cl) = decode(r), decode(c)
            used: set[int] = set()
            m = box_iou(cb, rb) if len(cb) and len(rb) else np.zeros((len(cb), len(rb)))
            for i in range(len(cb)):
                ok = [j for j in np.argsort(-m[i]) if j not in used and m[i, j] >= iou
                      and rl[j] == cl[i]]  # fmt: skip
                if ok:
                    used.add(ok[0])
                    tp += 1
                else:
                    fp += 1
            fn += len(rb) - len(used)
        return 1.0 if tp + fp + fn == 0 else 2 * tp / (2 * tp + fp + fn)

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
