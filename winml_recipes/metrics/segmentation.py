"""semantic-segmentation: does the target label each pixel as the float model does?"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from winml_recipes.sdk.contract import IOContract
from winml_recipes.sdk.metrics import DefaultGate, Outputs, TaskMetric


class PixelAgreement(TaskMetric):
    """Per pixel, argmax over the class axis (axis 1 of [batch, classes, H, W]): the share
    of pixels labelled alike, and the IoU per class averaged over the classes either side
    uses."""

    name = "pixel-agreement"
    tasks = frozenset({"semantic-segmentation", "image-segmentation"})
    description = (
        "argmax over the class axis: pixel_agreement (share of pixels labelled alike) and "
        "mean_iou (per-class IoU, float vs target, over the classes either side uses)"
    )
    gates = {"pixel_agreement": DefaultGate(0.9)}

    def outputs_used(self, contract: IOContract) -> tuple[str, ...] | None:
        chosen = next((s.name for s in contract.outputs if len(s.shape) == 4), None)
        return (chosen,) if chosen else None

    def values(
        self, reference: Sequence[Outputs], candidate: Sequence[Outputs]
    ) -> dict[str, float]:
        name = next(n for n in reference[0] if np.asarray(reference[0][n]).ndim == 4)
        same = total = 0
        inter: dict[int, int] = {}
        union: dict[int, int] = {}
        for ref, cand in zip(reference, candidate, strict=True):
            r = np.asarray(ref[name]).argmax(axis=1)
            c = np.asarray(cand[name]).argmax(axis=1)
            same += int(np.count_nonzero(r == c))
            total += r.size
            for k in np.union1d(np.unique(r), np.unique(c)).tolist():
                inter[k] = inter.get(k, 0) + int(np.count_nonzero((r == k) & (c == k)))
                union[k] = union.get(k, 0) + int(np.count_nonzero((r == k) | (c == k)))
        ious = [inter[k] / union[k] for k in union if union[k]]
        return {
            "pixel_agreement": same / total if total else 1.0,
            "mean_iou": float(np.mean(ious)) if ious else 1.0,
            "classes": float(len(ious)),
        }
