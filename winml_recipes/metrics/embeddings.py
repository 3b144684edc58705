"""feature-extraction: is each sample's embedding where the float model puts it?"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from winml_recipes.sdk.contract import IOContract
from winml_recipes.sdk.metrics import DefaultGate, Outputs, TaskMetric

PREFERRED = (
    "sentence_embedding",
    "image_embeds",
    "text_embeds",
    "pooler_output",
    "embeddings",
    "last_hidden_state",
)


class EmbeddingCosine(TaskMetric):
    """Cosine between the float and target embedding of each sample (each batch row)."""

    name = "embedding-cosine"
    tasks = frozenset(
        {
            "feature-extraction",
            "sentence-similarity",
            "audio-feature-extraction",
            "image-feature-extraction",
            "image-embedding",
            "text-embedding",
            # a two-tower model's components (each tower's embedding; metrics/zeroshot.py
            # compares the towers' similarities)
            "zero-shot-image-classification",
        }
    )
    description = "cosine of each sample's embedding, float vs target: mean and worst"
    gates = {"cosine_worst": DefaultGate(0.95)}

    def outputs_used(self, contract: IOContract) -> tuple[str, ...] | None:
        names = [s.name for s in contract.outputs]
        chosen = next((n for n in PREFERRED if n in names), names[0] if names else None)
        return (chosen,) if chosen else None

    def values(
        self, reference: Sequence[Outputs], candidate: Sequence[Outputs]
    ) -> dict[str, float]:
        names = list(reference[0])
        name = next((n for n in PREFERRED if n in names), names[0])
        cosines = []
        for ref, cand in zip(reference, candidate, strict=True):
            r = np.asarray(ref[name], np.float64)
            c = np.asarray(cand[name], np.float64)
            r, c = r.reshape(r.shape[0], -1), c.reshape(c.shape[0], -1)
            norms = np.linalg.norm(r, axis=1) * np.linalg.norm(c, axis=1)
            dots = np.sum(r * c, axis=1)
            cosines.extend(np.where(norms > 0, dots / np.maximum(norms, 1e-300), 1.0).tolist())
        return {
            "cosine_mean": float(np.mean(cosines)),
            "cosine_worst": float(np.min(cosines)),
            "samples": float(len(cosines)),
        }
