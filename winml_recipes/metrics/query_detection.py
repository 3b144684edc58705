"""object-detection by query heads (DETR, YOLOS, RT-DETR): box F1 after their own decoding.

Outputs `logits` [batch, queries, classes] and `pred_boxes` [batch, queries, 4] (cx, cy, w,
h in [0, 1] of the input). Decoded as the processors' `post_process_object_detection` does:

- `object-detection` (DETR, YOLOS): softmax over the classes, the last meaning "no object";
  each query's best real class, kept above 0.5;
- `object-detection-sigmoid` (RT-DETR and the other focal-loss heads): a sigmoid per class,
  the top `queries` (query, class) pairs over all, kept above 0.5.

Boxes become (x1, y1, x2, y2) in input pixels; no NMS (set prediction). A target box matches
an unused float box of the same class at IoU >= 0.5.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from winml_recipes.metrics.boxes import Detections, match_counts
from winml_recipes.sdk.contract import IOContract
from winml_recipes.sdk.metrics import DefaultGate, Outputs, TaskMetric

THRESHOLD = 0.5
MATCH_IOU = 0.5
OUTPUTS = ("logits", "pred_boxes")


def is_query_head(contract: IOContract) -> bool:
    """Outputs `logits` [b, q, c] and `pred_boxes` [b, q, 4]."""
    shapes = {s.name: s.shape for s in contract.outputs}
    return (
        all(n in shapes for n in OUTPUTS)
        and len(shapes["logits"]) == 3
        and len(shapes["pred_boxes"]) == 3
        and shapes["pred_boxes"][-1] == 4
    )


def corners(boxes: np.ndarray, size: tuple[int, int] | None) -> np.ndarray:
    """(cx, cy, w, h) in [0, 1] -> (x1, y1, x2, y2), in pixels of a (height, width) input."""
    cx, cy, w, h = (boxes[:, i] for i in range(4))
    xyxy = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1)
    if size is not None:
        xyxy = xyxy * np.array([size[1], size[0], size[1], size[0]], np.float64)
    return xyxy


def decode(outputs: Outputs, sigmoid: bool, size: tuple[int, int] | None) -> Detections:
    """One sample's boxes and labels."""
    logits = np.asarray(outputs["logits"], np.float64).reshape(-1, np.shape(outputs["logits"])[-1])
    boxes = corners(np.asarray(outputs["pred_boxes"], np.float64).reshape(-1, 4), size)
    if sigmoid:
        probs = 1.0 / (1.0 + np.exp(-logits))
        flat = probs.ravel()
        top = np.argsort(-flat, kind="stable")[: len(logits)]
        keep = top[flat[top] > THRESHOLD]
        return boxes[keep // logits.shape[1]], keep % logits.shape[1]
    e = np.exp(logits - logits.max(-1, keepdims=True))
    probs = (e / e.sum(-1, keepdims=True))[:, :-1]
    scores, labels = probs.max(-1), probs.argmax(-1)
    keep = scores > THRESHOLD
    return boxes[keep], labels[keep]


class QueryBoxF1(TaskMetric):
    """Boxes decoded from both sides as the family's processor does (module docstring);
    F1, precision and recall of the target's boxes against the float model's."""

    name = "query-box-f1"
    tasks = frozenset({"object-detection"})
    description = (
        "logits + pred_boxes decoded as the processor does (softmax with a no-object class, "
        "score > 0.5, cxcywh -> xyxy): box_f1 against the float model's boxes (same class, "
        "IoU >= 0.5), box_precision, box_recall; float_boxes: how many the float model found"
    )
    gates = {"box_f1": DefaultGate(0.8)}
    sigmoid = False

    def __init__(self, size: tuple[int, int] | None = None) -> None:
        self.size = size  # the image input's (height, width)

    def outputs_used(self, contract: IOContract) -> tuple[str, ...] | None:
        return OUTPUTS if is_query_head(contract) else None

    def for_contract(self, contract: IOContract) -> QueryBoxF1:
        for spec in contract.inputs:
            dims = [d if isinstance(d, int) else contract.dims.get(d) for d in spec.shape]
            if len(dims) == 4 and all(isinstance(d, int) and d > 0 for d in dims[2:]):
                return type(self)((int(dims[2]), int(dims[3])))
        return self

    def values(
        self, reference: Sequence[Outputs], candidate: Sequence[Outputs]
    ) -> dict[str, float]:
        tp = fp = fn = 0
        for ref, cand in zip(reference, candidate, strict=True):
            counts = match_counts(
                decode(ref, self.sigmoid, self.size),
                decode(cand, self.sigmoid, self.size),
                MATCH_IOU,
            )
            tp, fp, fn = tp + counts[0], fp + counts[1], fn + counts[2]
        found = tp + fp
        return {
            "box_f1": 1.0 if tp + fp + fn == 0 else 2 * tp / (2 * tp + fp + fn),
            "box_precision": tp / found if found else 1.0,
            "box_recall": tp / (tp + fn) if tp + fn else 1.0,
            "float_boxes": float(tp + fn),
        }


class SigmoidQueryBoxF1(QueryBoxF1):
    """QueryBoxF1 for focal-loss heads: a sigmoid per class, top-k (query, class) pairs."""

    name = "sigmoid-query-box-f1"
    tasks = frozenset({"object-detection-sigmoid"})
    description = (
        "logits + pred_boxes decoded as the processor does (sigmoid per class, top queries x "
        "classes pairs, score > 0.5, cxcywh -> xyxy): box_f1 against the float model's boxes "
        "(same class, IoU >= 0.5), box_precision, box_recall; float_boxes"
    )
    sigmoid = True
