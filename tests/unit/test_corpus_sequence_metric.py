"""The corpus's phoneme agreement (tests/corpus/metrics.py sequence_agreement): greedy
decoding's arg-max agreement counted up to and including float's end token, never after."""

from __future__ import annotations

import numpy as np

from tests.corpus.metrics import sequence_agreement


def _logits(tokens: list[int], classes: int = 6) -> dict[str, np.ndarray]:
    return {"logits": np.eye(classes, dtype=np.float32)[tokens][None]}


def test_positions_after_float_end_token_do_not_count() -> None:
    score = sequence_agreement("logits", end=3)
    ref = [_logits([4, 5, 3, 0, 0])]  # two phonemes then </s>: 3 positions count
    assert score(ref, [_logits([4, 5, 3, 1, 2])]) == 1.0  # differs only after </s>
    assert score(ref, [_logits([4, 1, 3, 0, 0])]) == 2 / 3
    assert score(ref, [_logits([4, 5, 5, 0, 0])]) == 2 / 3  # a missed </s> counts


def test_samples_are_pooled_by_position() -> None:
    score = sequence_agreement("logits", end=3)
    ref = [_logits([3, 0, 0]), _logits([4, 4, 3])]  # 1 + 3 positions
    assert score(ref, [_logits([4, 0, 0]), _logits([4, 4, 3])]) == 3 / 4
