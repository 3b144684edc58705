"""Question answering and token classification: does the target pick the float model's
answer span, and each token's label?"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from winml_recipes.metrics.classification import logits_output
from winml_recipes.sdk.contract import IOContract
from winml_recipes.sdk.metrics import DefaultGate, Outputs, TaskMetric


def _rows(samples: Sequence[Outputs], name: str) -> np.ndarray:
    """Every sample's `name` output, its rows stacked: [rows, ...]."""
    arrays = [np.asarray(s[name], np.float64) for s in samples]
    return np.concatenate([a.reshape(-1, a.shape[-1]) for a in arrays])


class SpanAgreement(TaskMetric):
    """The answer span (argmax of start_logits, argmax of end_logits) of each sample, float
    vs target."""

    name = "span-agreement"
    tasks = frozenset({"question-answering"})
    description = (
        "span_agreement: the target's answer span (argmax start, argmax end) is the float "
        "model's; start_agreement / end_agreement: each end alone"
    )
    gates = {"span_agreement": DefaultGate(0.8)}

    def outputs_used(self, contract: IOContract) -> tuple[str, ...] | None:
        names = {s.name for s in contract.outputs}
        wanted = ("start_logits", "end_logits")
        return wanted if set(wanted) <= names else None

    def values(
        self, reference: Sequence[Outputs], candidate: Sequence[Outputs]
    ) -> dict[str, float]:
        same = {}
        for end in ("start_logits", "end_logits"):
            ref, cand = _rows(reference, end), _rows(candidate, end)
            same[end] = ref.argmax(-1) == cand.argmax(-1)
        both = same["start_logits"] & same["end_logits"]
        return {
            "span_agreement": float(np.mean(both)),
            "start_agreement": float(np.mean(same["start_logits"])),
            "end_agreement": float(np.mean(same["end_logits"])),
            "samples": float(both.size),
        }


class TokenLabelAgreement(TaskMetric):
    """Each token's label (argmax of logits [batch, sequence, labels]), float vs target."""

    name = "token-label-agreement"
    tasks = frozenset({"token-classification"})
    description = (
        "token_agreement: share of tokens whose label (argmax) is the float model's; "
        "token_agreement_worst: the worst sample's share"
    )
    gates = {"token_agreement": DefaultGate(0.9)}

    def outputs_used(self, contract: IOContract) -> tuple[str, ...] | None:
        return logits_output(contract, rank=3)

    def values(
        self, reference: Sequence[Outputs], candidate: Sequence[Outputs]
    ) -> dict[str, float]:
        name = "logits" if "logits" in reference[0] else next(iter(reference[0]))
        per_sample = []
        for ref, cand in zip(reference, candidate, strict=True):
            r, c = np.asarray(ref[name]), np.asarray(cand[name])
            per_sample.append(r.argmax(-1) == c.argmax(-1))
        tokens = np.concatenate([s.reshape(-1) for s in per_sample])
        return {
            "token_agreement": float(np.mean(tokens)),
            "token_agreement_worst": float(min(np.mean(s) for s in per_sample)),
            "tokens": float(tokens.size),
        }
