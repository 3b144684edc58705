"""text-recognition (CTC line recognizers): does the target read the float model's text?"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from winml_recipes.sdk.contract import IOContract
from winml_recipes.sdk.metrics import DefaultGate, Outputs, TaskMetric

BLANK = 0  # the CTC blank class (PaddleOCR, ddddocr, CRNN exports put it first)


def ctc_decode(ids: np.ndarray, blank: int = BLANK) -> list[int]:
    """Greedy CTC of one line's class ids per step: repeats merged, blanks dropped."""
    out, last = [], None
    for k in np.asarray(ids).reshape(-1).tolist():
        if k != last and k != blank:
            out.append(k)
        last = k
    return out


def lines(output: np.ndarray) -> list[list[int]]:
    """Every line of one sample's output, decoded: class scores [T, 1, C], [1, T, C] or
    [B, T, C] (argmax per step), or class ids [1, T] / [B, T] when the graph took the argmax."""
    x = np.asarray(output)
    if np.issubdtype(x.dtype, np.floating) and x.ndim >= 2 and x.shape[-1] > 1:
        x = x.argmax(-1)
        if x.ndim == 2 and x.shape[1] == 1:  # [T, 1, C]: time first, one line
            x = x.T
    x = x.reshape(-1, x.shape[-1]) if x.ndim >= 2 else x.reshape(1, -1)
    return [ctc_decode(row) for row in x]


def edit_distance(a: list[int], b: list[int]) -> int:
    """Levenshtein distance of two label sequences."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


class CharacterAgreement(TaskMetric):
    """Both sides' outputs greedy CTC-decoded (argmax per step, repeats merged, blank 0
    dropped): 1 - character error rate of the target's text against the float model's, and
    the share of lines read exactly alike."""

    name = "ctc-character-agreement"
    tasks = frozenset({"text-recognition", "optical-character-recognition"})
    description = (
        "greedy CTC decoding (argmax per step, repeats merged, blank 0 dropped) of the first "
        "output: character_agreement = 1 - edit distance / float text length; "
        "line_agreement: the share of whole decoded lines read exactly as float reads them"
    )
    # A line is read right or wrong as a whole: a model that misreads one line in eight
    # keeps 95 % of its characters, so line_agreement (every line, exactly) gates too, at
    # 0.9: one misread line in 8 fails, one in 16 (a w8a16 build's rounding on a near-tie)
    # passes; PaddleOCR's recognizer broken on HTP read 3-4 lines in 8 as float did.
    gates = {"character_agreement": DefaultGate(0.9), "line_agreement": DefaultGate(0.9)}

    def outputs_used(self, contract: IOContract) -> tuple[str, ...] | None:
        # the first output: declared shapes of CTC heads are often wrong (ddddocr declares
        # [1, seqlen] and computes [T, 1, classes]), so its rank is read at run time
        return (contract.outputs[0].name,) if contract.outputs else None

    def values(
        self, reference: Sequence[Outputs], candidate: Sequence[Outputs]
    ) -> dict[str, float]:
        errors = total = same = count = 0
        for ref, cand in zip(reference, candidate, strict=True):
            name = next(iter(ref))
            want, got = lines(ref[name]), lines(cand[name])
            for w, g in zip(want, got, strict=True):
                errors += edit_distance(w, g)
                total += max(1, len(w))
                same += w == g
                count += 1
        return {
            "character_agreement": max(0.0, 1.0 - errors / total) if total else 1.0,
            "line_agreement": same / count if count else 1.0,
            "characters": float(total),
        }
