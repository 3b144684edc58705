"""Zero-shot image classification across a two-tower model's two graphs: does the target
pick the float model's label for each image?

Each image's label is the prompt whose text embedding is most similar (cosine) to the
image's embedding, as CLIP and SigLIP classify (SigLIP's sigmoid and CLIP's softmax are
monotonic in it). The towers are two components, verified one by one on their embeddings
(embedding-cosine); this compares their product, float towers against target towers.
"""

from __future__ import annotations

import numpy as np


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64).reshape(len(x), -1)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def labels(image_embeds: np.ndarray, text_embeds: np.ndarray) -> np.ndarray:
    """Each image's label: the index of the most similar prompt embedding."""
    return (_unit(image_embeds) @ _unit(text_embeds).T).argmax(axis=1)


def zero_shot_agreement(
    reference: tuple[np.ndarray, np.ndarray], candidate: tuple[np.ndarray, np.ndarray]
) -> dict[str, float]:
    """(image_embeds, text_embeds) of the float towers and of the target's: top1_agreement
    of the labels; similarity_max_abs, the largest change of an image-prompt similarity;
    flip_margin_max, the largest float margin (best minus second-best similarity) among the
    images whose label changed (0 without a change): a change of at most e in every
    similarity can only flip a margin below 2e, so a flip above that is not noise."""
    want = labels(*reference)
    got = labels(*candidate)
    ref_sim = _unit(reference[0]) @ _unit(reference[1]).T
    cand_sim = _unit(candidate[0]) @ _unit(candidate[1]).T
    ranked = np.sort(ref_sim, axis=1)
    margins = ranked[:, -1] - ranked[:, -2] if ref_sim.shape[1] > 1 else ranked[:, -1]
    flipped = margins[want != got]
    return {
        "top1_agreement": float(np.mean(want == got)),
        "similarity_max_abs": float(np.max(np.abs(ref_sim - cand_sim))),
        "flip_margin_max": float(flipped.max()) if flipped.size else 0.0,
        "images": float(len(want)),
        "labels": float(ref_sim.shape[1]),
    }
