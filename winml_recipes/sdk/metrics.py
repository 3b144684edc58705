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
