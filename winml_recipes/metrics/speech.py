"""automatic-speech-recognition (CTC): does the target transcribe what the float model does?"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from winml_recipes.metrics.text import ctc_decode, edit_distance
from winml_recipes.sdk.contract import IOContract
from winml_recipes.sdk.metrics import DefaultGate, Outputs, TaskMetric


def transcripts(logits: np.ndarray, blank: int) -> list[list[int]]:
    """Greedy CTC of logits [batch, frames, vocab]: argmax per frame, repeats merged, the
    blank dropped; one token sequence per row."""
    ids = np.asarray(logits).argmax(-1)
    return [ctc_decode(row, blank) for row in ids.reshape(-1, ids.shape[-1])]


@dataclass(frozen=True)
class SequenceAgreement(TaskMetric):
    """Both sides' logits greedy CTC-decoded with the model's own blank (its pad token): the
    share of utterances transcribed exactly alike (whole sequences), and 1 - token error rate
    of the target against the float model (characters, for a character vocabulary)."""

    blank: int = 0
    output: str = "logits"

    name = "ctc-sequence-agreement"
    tasks = frozenset({"automatic-speech-recognition"})
    description = (
        "greedy CTC decoding (argmax per frame, repeats merged, the blank/pad token dropped): "
        "sequence_agreement = utterances whose whole token sequence equals the float model's; "
        "character_agreement = 1 - edit distance / float sequence length, over all utterances"
    )
    # a model whose transcripts differ fails, even when most characters agree
    gates = {"sequence_agreement": DefaultGate(0.75), "character_agreement": DefaultGate(0.9)}

    def outputs_used(self, contract: IOContract) -> tuple[str, ...] | None:
        ranked = [s for s in contract.outputs if len(s.shape) == 3]
        named = [s for s in ranked if s.ctc_blank is not None] or ranked
        return (named[0].name,) if named else None

    def for_contract(self, contract: IOContract) -> TaskMetric:
        used = self.outputs_used(contract)
        assert used is not None
        spec = next(s for s in contract.outputs if s.name == used[0])
        return SequenceAgreement(blank=spec.ctc_blank or 0, output=spec.name)

    def values(
        self, reference: Sequence[Outputs], candidate: Sequence[Outputs]
    ) -> dict[str, float]:
        errors = total = same = count = 0
        for ref, cand in zip(reference, candidate, strict=True):
            want = transcripts(ref[self.output], self.blank)
            got = transcripts(cand[self.output], self.blank)
            for w, g in zip(want, got, strict=True):
                errors += edit_distance(w, g)
                total += max(1, len(w))
                same += w == g
                count += 1
        return {
            "sequence_agreement": same / count if count else 1.0,
            "character_agreement": max(0.0, 1.0 - errors / total) if total else 1.0,
            "utterances": float(count),
            "characters": float(total),
        }
