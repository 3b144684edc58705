"""Zero-shot agreement of two towers (sdk.metrics.zero_shot_agreement): which label changes
count against the target. Embeddings are built so each image's similarities are known."""

from __future__ import annotations

import numpy as np

from winml_recipes.sdk.metrics import zero_shot_agreement

# 3 prompts as orthonormal text embeddings: an image's similarity to prompt k is its k-th
# coordinate over its norm
TEXT = np.eye(3)


def _images(rows: list[list[float]]) -> np.ndarray:
    return np.asarray(rows, np.float64)


def test_a_decided_label_that_changes_counts_and_a_near_tie_does_not() -> None:
    float_images = _images([
        [1.0, 0.2, 0.0],    # decided: margin 0.8 of a spread 1.0
        [1.0, 0.99, 0.0],   # near-tie: margin 0.01 of a spread 1.0 (< 10%)
        [0.0, 1.0, 0.3],    # decided
        [0.2, 0.0, 1.0],    # decided
    ])  # fmt: skip
    target_images = _images([
        [0.2, 1.0, 0.0],    # decided label changed
        [0.99, 1.0, 0.0],   # the near-tie flipped
        [0.0, 1.0, 0.3],
        [0.2, 0.0, 1.0],
    ])  # fmt: skip
    got = zero_shot_agreement((float_images, TEXT), (target_images, TEXT))
    assert got["top1_agreement"] == 0.5  # 2 of 4 images keep their label
    assert got["decisive_images"] == 3
    assert got["top1_agreement_decisive"] == 2 / 3  # the near-tie is not held against it
    assert got["images"] == 4 and got["labels"] == 3


def test_no_decided_image_agrees_by_definition() -> None:
    ties = _images([[1.0, 1.0, 0.0], [0.0, 0.5, 0.5]])
    got = zero_shot_agreement((ties, TEXT), (ties[:, ::-1].copy(), TEXT))
    assert got["decisive_images"] == 0 and got["top1_agreement_decisive"] == 1.0
