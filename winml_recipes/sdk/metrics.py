"""Task metrics: what a user checks (mask IoU, top-1 agreement, embedding cosine), as plugins.

A task metric compares the float reference's outputs with the candidate's on every
held-out sample and returns named values, each with a default gate. Plugins come from the
`winml_recipes.metrics` entry-point group (the built-ins are declared in pyproject.toml
like a third party's); `verify` picks the first whose tasks include the catalog entry's
task and whose outputs the component has.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from winml_recipes.sdk.contract import IOContract
from winml_recipes.sdk.plugins import load_entry_points

ENTRY_POINT_GROUP = "winml_recipes.metrics"
Outputs = Mapping[str, np.ndarray]
Values = dict[str, float]


@dataclass(frozen=True)
class DefaultGate:
    threshold: float
    higher_is_better: bool = True


class TaskMetric(ABC):
    """One task's metric. `values` are named floats; `gates` the default threshold of some."""

    name: ClassVar[str]
    tasks: ClassVar[frozenset[str]]
    description: ClassVar[str] = ""
    gates: ClassVar[Mapping[str, DefaultGate]] = {}
    lower_is_better: ClassVar[frozenset[str]] = frozenset()  # values where less is better

    @abstractmethod
    def outputs_used(self, contract: IOContract) -> tuple[str, ...] | None:
        """The outputs this metric reads, or None when the component lacks them."""

    def for_contract(self, contract: IOContract) -> TaskMetric:
        """This metric bound to one component (e.g. its input size, for a metric that sizes
        anchor grids); the default needs nothing from it."""
        return self

    @abstractmethod
    def values(
        self, reference: Sequence[Outputs], candidate: Sequence[Outputs]
    ) -> dict[str, float]:
        """Named values over all samples (means and worst cases), reference vs candidate."""


def task_metrics() -> dict[str, TaskMetric]:
    """Every registered task metric, by entry-point name."""
    found = load_entry_points(
        ENTRY_POINT_GROUP,
        lambda cls: isinstance(cls, type) and issubclass(cls, TaskMetric),
        "a TaskMetric",
        claims=lambda cls: (cls.name, *cls.tasks),
    )
    return {name: cls() for name, cls in found.items()}


def metric_for(task: str | None, contract: IOContract) -> TaskMetric | None:
    """The task metric for a component of a `task` model, None where none applies."""
    if not task:
        return None
    for metric in task_metrics().values():
        if task in metric.tasks and metric.outputs_used(contract) is not None:
            return metric.for_contract(contract)
    return None


# Zero-shot image classification across a two-tower model's two graphs (verify.zero_shot_with;
# metrics/zeroshot.py re-exports it): each image's label is the prompt whose text embedding is
# most similar (cosine) to its embedding, as CLIP and SigLIP classify (SigLIP's sigmoid and
# CLIP's softmax are monotonic in it).


def _unit_rows(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64).reshape(len(x), -1)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def zero_shot_labels(image_embeds: np.ndarray, text_embeds: np.ndarray) -> np.ndarray:
    """Each image's label: the index of the most similar prompt embedding."""
    return (_unit_rows(image_embeds) @ _unit_rows(text_embeds).T).argmax(axis=1)


DECISIVE_FRACTION = 0.1  # of an image's similarity spread: a label the float towers decide


def zero_shot_agreement(
    reference: tuple[np.ndarray, np.ndarray], candidate: tuple[np.ndarray, np.ndarray]
) -> dict[str, float]:
    """(image_embeds, text_embeds) of the float towers and of the target's: top1_agreement
    of the labels; similarity_max_abs, the largest change of an image-prompt similarity;
    flip_margin_max, the largest float margin (best minus second-best similarity) among the
    images whose label changed (0 without a change): a change of at most e in every
    similarity can only flip a margin below 2e, so a flip above that is not noise;
    top1_agreement_decisive, the agreement over the images the float towers decide (their
    margin at least DECISIVE_FRACTION of the image's spread of similarities over the
    prompts; 1.0 where none is), decisive_images how many: a near-tie the float model
    hardly decides is reported, not held against the target."""
    want = zero_shot_labels(*reference)
    got = zero_shot_labels(*candidate)
    ref_sim = _unit_rows(reference[0]) @ _unit_rows(reference[1]).T
    cand_sim = _unit_rows(candidate[0]) @ _unit_rows(candidate[1]).T
    ranked = np.sort(ref_sim, axis=1)
    margins = ranked[:, -1] - ranked[:, -2] if ref_sim.shape[1] > 1 else ranked[:, -1]
    flipped = margins[want != got]
    decisive = margins >= DECISIVE_FRACTION * (ranked[:, -1] - ranked[:, 0])
    kept = (want == got)[decisive]
    return {
        "top1_agreement": float(np.mean(want == got)),
        "top1_agreement_decisive": float(kept.mean()) if kept.size else 1.0,
        "decisive_images": float(decisive.sum()),
        "similarity_max_abs": float(np.max(np.abs(ref_sim - cand_sim))),
        "flip_margin_max": float(flipped.max()) if flipped.size else 0.0,
        "images": float(len(want)),
        "labels": float(ref_sim.shape[1]),
    }
