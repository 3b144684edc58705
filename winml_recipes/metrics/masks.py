"""mask-generation (SAM-style prompt decoders): do the target's masks match the float's?"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from winml_recipes.sdk.contract import IOContract
from winml_recipes.sdk.metrics import DefaultGate, Outputs, TaskMetric

MASK_THRESHOLD = 0.0  # SAM binarizes mask logits at 0
# Predicted IoUs closer than this are a tie: either mask is the float model's choice (a
# user cannot tell 0.50004 from 0.50006; random-weight heads score every mask about 0.5).
CHOICE_TIE = 0.01


def mask_iou_dice(ref: np.ndarray, cand: np.ndarray) -> tuple[float, float]:
    """IoU and Dice of two boolean masks (two empty masks agree: 1, 1)."""
    inter = float(np.count_nonzero(ref & cand))
    union = float(np.count_nonzero(ref | cand))
    total = float(np.count_nonzero(ref) + np.count_nonzero(cand))
    return (inter / union if union else 1.0), (2 * inter / total if total else 1.0)


class MaskAgreement(TaskMetric):
    """Per prompt: the mask the float model ranks best (argmax of `iou_scores`), binarized
    at logit 0 on both sides: IoU and Dice; and whether the target ranks the same mask best
    (or one the float model scores within CHOICE_TIE of it, counted in chosen_mask_ties)."""

    name = "mask-agreement"
    tasks = frozenset({"mask-generation"})
    description = (
        "per prompt, the float model's best mask (argmax iou_scores) binarized at logit 0: IoU "
        "and Dice vs the target's same mask; chosen_mask_agreement: the target ranks it best too "
        "(or a mask the float model scores within 0.01 of it: chosen_mask_ties)"
    )
    gates = {"mask_iou": DefaultGate(0.9), "chosen_mask_agreement": DefaultGate(0.9)}

    def outputs_used(self, contract: IOContract) -> tuple[str, ...] | None:
        names = {s.name for s in contract.outputs}
        return ("iou_scores", "pred_masks") if {"iou_scores", "pred_masks"} <= names else None

    def values(
        self, reference: Sequence[Outputs], candidate: Sequence[Outputs]
    ) -> dict[str, float]:
        ious, dices, agree = [], [], []
        ties = 0
        for ref, cand in zip(reference, candidate, strict=True):
            r_scores, c_scores = np.asarray(ref["iou_scores"]), np.asarray(cand["iou_scores"])
            r_masks, c_masks = np.asarray(ref["pred_masks"]), np.asarray(cand["pred_masks"])
            count = r_scores.shape[-1]  # masks per prompt
            r_scores, c_scores = r_scores.reshape(-1, count), c_scores.reshape(-1, count)
            r_masks = r_masks.reshape(-1, count, *r_masks.shape[-2:])
            c_masks = c_masks.reshape(-1, count, *c_masks.shape[-2:])
            for p in range(r_scores.shape[0]):  # every prompt of every sample
                best = int(np.argmax(r_scores[p]))
                iou, dice = mask_iou_dice(
                    r_masks[p, best] > MASK_THRESHOLD, c_masks[p, best] > MASK_THRESHOLD
                )
                ious.append(iou)
                dices.append(dice)
                chosen = int(np.argmax(c_scores[p]))
                tie = r_scores[p, best] - r_scores[p, chosen] < CHOICE_TIE
                ties += chosen != best and tie
                agree.append(float(chosen == best or tie))
        return {
            "mask_iou": float(np.mean(ious)),
            "mask_iou_worst": float(np.min(ious)),
            "dice": float(np.mean(dices)),
            "dice_worst": float(np.min(dices)),
            "chosen_mask_agreement": float(np.mean(agree)),
            "chosen_mask_ties": float(ties),  # another mask chosen, scored within CHOICE_TIE
            "prompts": float(len(ious)),
        }
