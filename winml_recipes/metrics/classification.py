"""Classification (images, text, audio): does the target pick the float model's class?"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from winml_recipes.sdk.contract import IOContract
from winml_recipes.sdk.metrics import DefaultGate, Outputs, TaskMetric


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def logits_output(contract: IOContract, rank: int) -> tuple[str, ...] | None:
    """The output a logits metric reads: the one named `logits` of that rank, else the first
    output of that rank; None where there is none."""
    ranked = [s for s in contract.outputs if len(s.shape) == rank]
    chosen = [s for s in ranked if s.name == "logits"] or ranked
    return (chosen[0].name,) if chosen else None


class TopKAgreement(TaskMetric):
    """Top-1 and top-5 agreement with the float model's top-1 class, and the mean KL
    divergence of the softmax (float || target)."""

    name = "top-k-agreement"
    tasks = frozenset({"image-classification", "text-classification", "audio-classification"})
    description = (
        "top1_agreement: the target's top class is the float model's; top5_agreement: the "
        "float model's top class is among the target's top 5; kl_mean: KL(float || target) of "
        "the softmax"
    )
    gates = {"top1_agreement": DefaultGate(0.8)}
    lower_is_better = frozenset({"kl_mean"})

    def outputs_used(self, contract: IOContract) -> tuple[str, ...] | None:
        return logits_output(contract, rank=2)

    def values(
        self, reference: Sequence[Outputs], candidate: Sequence[Outputs]
    ) -> dict[str, float]:
        name = next(iter(n for n in reference[0] if np.asarray(reference[0][n]).ndim == 2))
        if "logits" in reference[0]:
            name = "logits"
        ref = np.concatenate([np.asarray(r[name], np.float64) for r in reference])
        cand = np.concatenate([np.asarray(c[name], np.float64) for c in candidate])
        top = ref.argmax(axis=-1)
        k = min(5, ref.shape[-1])
        top5 = np.argsort(-cand, axis=-1)[:, :k]
        p, q = _softmax(ref), _softmax(cand)
        kl = np.sum(p * (np.log(p + 1e-12) - np.log(q + 1e-12)), axis=-1)
        return {
            "top1_agreement": float(np.mean(cand.argmax(axis=-1) == top)),
            "top5_agreement": float(np.mean([t in row for t, row in zip(top, top5, strict=True)])),
            "kl_mean": float(np.mean(kl)),
            "samples": float(ref.shape[0]),
        }
