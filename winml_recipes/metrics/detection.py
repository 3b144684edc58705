"""object-detection: does the target find the float model's boxes (box F1 at IoU 0.5)?

Boxes are decoded from the raw outputs as the model's own post-processing does, for the
output layouts below (recognised from the outputs' shapes), then NMS'd per class:

- `score-map`: a [1, 2, h, w] face/object probability map and [1, 4, h, w] box offsets
  (MTCNN's P-Net: a 12-pixel cell at stride 2 per map cell, probability > 0.6, NMS 0.5);
- `yolox`: one raw [1, n, 5 + classes] head output over stride 8/16/32 grids (YOLOX with
  decoding left out of the graph: centre/size per cell, objectness x class > 0.1, NMS 0.45);
- `gfl`: k [1, n_i, classes] score outputs then k [1, n_i, 4 * bins] distance
  distributions, strides doubling (PP-PicoDet/GFL: score > 0.4, NMS 0.5);
- `boxes`: already decoded boxes [.., n, 4] (xyxy) and scores [.., n] or [.., n, classes]
  (score > 0.5, no NMS: the graph did it).

Grids are sized from the component's image input (the contract), else assumed square.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from winml_recipes.metrics.boxes import Detections, match_counts, nms, per_class_nms
from winml_recipes.sdk.contract import IOContract
from winml_recipes.sdk.metrics import DefaultGate, Outputs, TaskMetric

MATCH_IOU = 0.5


def layout(outputs: Sequence[np.ndarray]) -> str | None:
    """Which decoder reads these outputs (None: none does)."""
    shapes = [np.shape(x) for x in outputs]
    maps = [s for s in shapes if len(s) == 4 and s[0] == 1]
    if len(maps) == 2 and sorted(s[1] for s in maps) == [2, 4] and maps[0][2:] == maps[1][2:]:
        return "score-map"
    if len(shapes) == 1 and len(shapes[0]) == 3 and shapes[0][0] == 1 and shapes[0][2] >= 6:
        return "yolox"
    half = len(shapes) // 2
    if (
        half
        and len(shapes) == 2 * half
        and all(len(s) == 3 and s[0] == 1 for s in shapes)
        and all(shapes[i][1] == shapes[half + i][1] for i in range(half))
        and all(shapes[half + i][2] % 4 == 0 and shapes[half + i][2] > 4 for i in range(half))
    ):
        return "gfl"
    box = [i for i, s in enumerate(shapes) if len(s) >= 2 and s[-1] == 4]
    if len(box) == 1 and len(shapes) >= 2:
        return "boxes"
    return None


def _score_map(values: list[np.ndarray]) -> Detections:
    """MTCNN detect_face.generateBoundingBox at one scale."""
    prob = next(v for v in values if v.ndim == 4 and v.shape[1] == 2)[0, 1]
    reg = next(v for v in values if v.ndim == 4 and v.shape[1] == 4)[0]
    ys, xs = np.nonzero(prob > 0.6)
    cells = np.stack([xs * 2 + 1, ys * 2 + 1, xs * 2 + 12, ys * 2 + 12], 1).astype(np.float64)
    boxes = cells + reg[:, ys, xs].T * 12
    keep = nms(boxes, prob[ys, xs], 0.5) if len(boxes) else np.zeros(0, np.int64)
    return boxes[keep], np.zeros(len(keep), np.int64)


def _grid(n: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    yy, xx = np.meshgrid(np.arange(n[0]), np.arange(n[1]), indexing="ij")
    return xx.reshape(-1), yy.reshape(-1)


def _yolox(values: list[np.ndarray], size: tuple[int, int] | None) -> Detections:
    pred = values[0][0].astype(np.float64)
    h, w = size or (int(math.isqrt(round(pred.shape[0] * 16 / 21)) * 8),) * 2
    grids, strides = [], []
    for s in (8, 16, 32):
        xs, ys = _grid((h // s, w // s))
        grids.append(np.stack([xs, ys], 1))
        strides.append(np.full((len(xs), 1), s))
    grid, stride = np.concatenate(grids), np.concatenate(strides)
    if len(grid) != len(pred):
        raise ValueError(f"yolox layout: {len(pred)} rows, a {h}x{w} input gives {len(grid)}")
    xy = (pred[:, :2] + grid) * stride
    wh = np.exp(np.clip(pred[:, 2:4], -10, 10)) * stride
    boxes = np.concatenate([xy - wh / 2, xy + wh / 2], 1)
    return per_class_nms(boxes, pred[:, 4:5] * pred[:, 5:], 0.1, 0.45)


def _gfl(values: list[np.ndarray], size: tuple[int, int] | None) -> Detections:
    half = len(values) // 2
    first = values[0].shape[1]
    h, w = size or (math.isqrt(first) * 8,) * 2  # square at stride 8 when not told
    stride = next((s for s in (4, 8, 16, 32) if math.ceil(h / s) * math.ceil(w / s) == first), 0)
    if not stride:
        raise ValueError(f"gfl layout: {first} cells at the finest level fit no stride of {h}x{w}")
    boxes, scores = [], []
    for level in range(half):
        s = stride * 2**level
        xs, ys = _grid((math.ceil(h / s), math.ceil(w / s)))
        cx, cy = (xs + 0.5) * s, (ys + 0.5) * s
        bins = values[half + level].shape[-1] // 4
        d = values[half + level][0].reshape(-1, bins).astype(np.float64)
        d = np.exp(d - d.max(1, keepdims=True))
        d = (d / d.sum(1, keepdims=True) @ np.arange(bins)).reshape(-1, 4) * s
        boxes.append(np.stack([cx - d[:, 0], cy - d[:, 1], cx + d[:, 2], cy + d[:, 3]], 1))
        scores.append(values[level][0])
    return per_class_nms(np.concatenate(boxes), np.concatenate(scores), 0.4, 0.5)


def _decoded(values: list[np.ndarray]) -> Detections:
    at = next(i for i, v in enumerate(values) if v.ndim >= 2 and v.shape[-1] == 4)
    boxes = values[at].reshape(-1, 4).astype(np.float64)
    n = len(boxes)
    rest = [v for i, v in enumerate(values) if i != at and n and v.size % n == 0 and v.size]
    if not rest:
        return boxes[:0], np.zeros(0, np.int64)
    scores = rest[0].reshape(n, -1).astype(np.float64)
    keep = scores.max(1) > 0.5
    return boxes[keep], scores[keep].argmax(1)


def decode(outputs: Outputs, size: tuple[int, int] | None = None) -> Detections:
    """Boxes and labels from one sample's raw outputs, as the model's post-processing does."""
    names = list(outputs)
    values = [np.asarray(outputs[n]) for n in names]
    kind = layout(values)
    if kind == "score-map":
        return _score_map(values)
    if kind == "yolox":
        return _yolox(values, size)
    if kind == "gfl":
        return _gfl(values, size)
    if kind == "boxes":
        return _decoded(values)
    shapes = ", ".join(f"{n} {list(v.shape)}" for n, v in zip(names, values, strict=True))
    raise ValueError(f"box-f1: no known detection layout in the outputs ({shapes})")


class BoxF1(TaskMetric):
    """Boxes decoded from both sides' outputs (see the module); a target box matches an
    unused float box of the same class at IoU >= 0.5: F1, precision and recall over all
    held-out samples (the float boxes are the truth)."""

    name = "box-f1"
    tasks = frozenset({"object-detection", "face-detection"})
    description = (
        "boxes decoded as the model's post-processing does (score threshold, NMS per class); "
        "box_f1: F1 of the target's boxes against the float model's (same class, IoU >= 0.5), "
        "box_precision, box_recall; float_boxes: how many the float model found"
    )
    gates = {"box_f1": DefaultGate(0.8)}

    def __init__(self, size: tuple[int, int] | None = None) -> None:
        self.size = size  # the image input's (height, width)

    def outputs_used(self, contract: IOContract) -> tuple[str, ...] | None:
        from winml_recipes.metrics.query_detection import is_query_head

        if is_query_head(contract):  # DETR-style heads: query-box-f1 decodes those
            return None
        names = tuple(s.name for s in contract.outputs)
        return names or None

    def for_contract(self, contract: IOContract) -> BoxF1:
        for spec in contract.inputs:
            dims = [d if isinstance(d, int) else contract.dims.get(d) for d in spec.shape]
            if len(dims) == 4 and all(isinstance(d, int) and d > 0 for d in dims[2:]):
                return BoxF1((int(dims[2]), int(dims[3])))
        return self

    def values(
        self, reference: Sequence[Outputs], candidate: Sequence[Outputs]
    ) -> dict[str, float]:
        tp = fp = fn = 0
        for ref, cand in zip(reference, candidate, strict=True):
            counts = match_counts(decode(ref, self.size), decode(cand, self.size), MATCH_IOU)
            tp, fp, fn = tp + counts[0], fp + counts[1], fn + counts[2]
        found = tp + fp
        return {
            "box_f1": 1.0 if tp + fp + fn == 0 else 2 * tp / (2 * tp + fp + fn),
            "box_precision": tp / found if found else 1.0,
            "box_recall": tp / (tp + fn) if tp + fn else 1.0,
            "float_boxes": float(tp + fn),
        }
