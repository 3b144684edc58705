"""The data of a pass's memory estimate (the engine's budget checks it; passes build it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from winml_recipes.sdk.contract import IOContract
from winml_recipes.sdk.target import Target


@dataclass(frozen=True)
class EstimateInputs:
    """What a pass's memory estimate may read besides its input model."""

    target: Target
    contract: IOContract
    reference: Path | None = None  # the component's float reference model
    upstream: Mapping[str, tuple[Path, IOContract]] = field(default_factory=dict)
    budget_mb: float | None = None  # the build's memory budget (None: not known here)


@dataclass(frozen=True)
class MemoryEstimate:
    """A step's expected peak resident memory, what it is made of and how to lower it."""

    mb: float
    made_of: str
    lower_by: str = ""
