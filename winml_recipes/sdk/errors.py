"""One error hierarchy. Each error renders as a single line that says where and what to do."""

from __future__ import annotations

from typing import Any


class WinmlError(Exception):
    """Base class. `where` is a file:line, a component/step, or empty."""

    exit_code = 2

    def __init__(self, message: str, where: str = "", data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.where = where
        self.data: dict[str, Any] = dict(data or {})  # structured detail for reports (JSON)

    def __str__(self) -> str:
        return f"{self.where}: {self.message}" if self.where else self.message


class RecipeError(WinmlError):
    """The recipe (or its rendering, parsing or validation) is wrong."""


class CatalogError(WinmlError):
    """A catalog entry is missing or invalid."""


class SourceError(WinmlError):
    """A model source cannot be found, read or fetched."""


class ModelFileError(WinmlError):
    """A file is not a readable ONNX model."""


class PlanError(WinmlError):
    """The requested steps cannot be planned (unknown pass, unsupported target, ...)."""


class PassError(WinmlError):
    """A pass failed on valid input (e.g. verification below threshold).

    `metrics`: what the pass measured before it failed (verify's record: gates, outputs);
    a failed build's manifest keeps them with the failing step. An instance attribute, so
    it survives pickling to and from pool and Ray workers.
    """

    def __init__(
        self,
        message: str,
        where: str = "",
        data: dict[str, Any] | None = None,
        metrics: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message, where, data)
        self.metrics: dict[str, Any] = dict(metrics or {})


class QualityGateError(PassError):
    """The built model measured below a verify threshold: exit 3, so CI can tell a quality
    regression from bad input."""

    exit_code = 3


class MemoryBudgetError(WinmlError):
    """A step is estimated to need more memory than the build's budget."""


class BuildLockedError(WinmlError):
    """Another build holds the output directory."""


class InternalError(WinmlError):
    """A bug: exit 1."""

    exit_code = 1


class ExecutionProviderError(WinmlError):
    """The target's execution provider cannot load here, or cannot take the graph."""


def check_known(value: str, known: list[str], what: str) -> None:
    """PlanError for a name outside `known`: "unknown WHAT 'x' (did you mean 'y'?); known: ..."."""
    import difflib

    if value not in known:
        close = difflib.get_close_matches(value, known, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise PlanError(f"unknown {what} '{value}'{hint}; known: {', '.join(known)}")
