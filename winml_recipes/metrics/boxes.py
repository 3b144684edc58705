"""Box geometry for detection metrics: IoU, greedy NMS, and F1 of two detection sets."""

from __future__ import annotations

import numpy as np

Detections = tuple[np.ndarray, np.ndarray]  # boxes [n, 4] xyxy, labels [n]


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU matrix of xyxy boxes [n, 4] x [m, 4]."""
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), -1)

    def area(x: np.ndarray) -> np.ndarray:
        return np.prod(np.clip(x[:, 2:] - x[:, :2], 0, None), -1)

    return inter / (area(a)[:, None] + area(b)[None] - inter + 1e-9)


def nms(boxes: np.ndarray, scores: np.ndarray, iou: float) -> np.ndarray:
    """Indices kept by greedy non-maximum suppression, best score first."""
    order, keep = np.argsort(-scores, kind="stable"), []
    while order.size:
        i = order[0]
        keep.append(i)
        order = order[1:][box_iou(boxes[i : i + 1], boxes[order[1:]])[0] <= iou]
    return np.asarray(keep, np.int64)


def per_class_nms(
    boxes: np.ndarray, scores: np.ndarray, threshold: float, iou: float
) -> Detections:
    """Per class (column of `scores` [n, classes]): boxes scoring over `threshold`, NMS'd."""
    kept, labels = [np.zeros((0, 4))], [np.zeros(0, np.int64)]
    for k in range(scores.shape[1]):
        mask = scores[:, k] > threshold
        if mask.any():
            keep = nms(boxes[mask], scores[mask, k], iou)
            kept.append(boxes[mask][keep])
            labels.append(np.full(len(keep), k, np.int64))
    return np.concatenate(kept), np.concatenate(labels)


def match_counts(reference: Detections, candidate: Detections, iou: float) -> tuple[int, int, int]:
    """(true positives, false positives, false negatives): each candidate box matches the
    unused reference box of its label with the highest IoU at or above `iou`, greedily."""
    (rb, rl), (cb, cl) = reference, candidate
    m = box_iou(cb, rb) if len(cb) and len(rb) else np.zeros((len(cb), len(rb)))
    used: set[int] = set()
    tp = fp = 0
    for i in range(len(cb)):
        ok = [j for j in np.argsort(-m[i]) if j not in used and m[i, j] >= iou and rl[j] == cl[i]]
        if ok:
            used.add(int(ok[0]))
            tp += 1
        else:
            fp += 1
    return tp, fp, len(rb) - len(used)
