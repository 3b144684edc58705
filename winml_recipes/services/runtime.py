"""Sessions on a target for passes: the target's execution provider (its identity,
availability, options), sessions on it, runs on the target with placement and fallback,
EPContext compilation, bisection of what an EP refuses, the CPU EP's reference run and
output comparison metrics.

A facade over runtime/*.py and onnx/metrics.py (see services/models.py for
why passes import from here).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names, for type checkers and editors
    from winml_recipes.onnx.metrics import argmax_agreement, compare_runs, output_metrics
    from winml_recipes.runtime.bisect import explain
    from winml_recipes.runtime.epcontext import compile_epcontext
    from winml_recipes.runtime.providers import (
        availability,
        identity,
        provider_for,
        provider_for_device,
    )
    from winml_recipes.runtime.sessions import (
        open_session,
        optimize_offline,
        run_at_default_level,
        run_model,
    )
    from winml_recipes.runtime.sessions import run_model as run_reference
    from winml_recipes.runtime.splitcompile import (
        SPLIT_VERSION,
        SplitPlan,
        compile_parts,
        part_models,
        plan_split,
    )
    from winml_recipes.runtime.target import run_on_target
    from winml_recipes.sdk.types import StepResult

__all__ = [
    "SPLIT_VERSION",
    "SplitPlan",
    "argmax_agreement",
    "availability",
    "compare_runs",
    "compile_epcontext",
    "compile_parts",
    "explain",
    "identity",
    "open_session",
    "optimize_offline",
    "output_metrics",
    "part_models",
    "plan_split",
    "provider_for",
    "provider_for_device",
    "run_at_default_level",
    "run_model",
    "run_on_target",
    "run_reference",
    "skip_if_unavailable",
]


def skip_if_unavailable(ep: Any, *, required: bool = False) -> StepResult | None:
    """The skipped step's result where `ep` cannot be used on this host (None where it
    can); with `required`, a PassError instead."""
    from winml_recipes.runtime.providers import availability
    from winml_recipes.sdk.errors import PassError
    from winml_recipes.sdk.types import StepResult

    avail = availability(ep.key)
    if avail.available:
        return None
    if required:
        raise PassError(f"{ep.provider} cannot be used here: {avail.reason}")
    return StepResult(skipped=f"{ep.provider} not available here: {avail.reason}")


def __getattr__(name: str) -> Any:
    """The implementation of `name`, imported when first asked for."""
    if name in ("compare_runs", "argmax_agreement", "output_metrics"):
        from winml_recipes.onnx import metrics as module

        return getattr(module, name)
    if name == "run_reference":
        # the CPU EP's run (the default EP of runtime.sessions.run_model)
        from winml_recipes.runtime.sessions import run_model as run_reference

        return run_reference
    if name == "explain":
        from winml_recipes.runtime import bisect as module

        return getattr(module, name)
    if name == "compile_epcontext":
        from winml_recipes.runtime import epcontext as module

        return getattr(module, name)
    if name in ("availability", "identity", "provider_for", "provider_for_device"):
        from winml_recipes.runtime import providers as module

        return getattr(module, name)
    if name in ("open_session", "optimize_offline", "run_at_default_level", "run_model"):
        from winml_recipes.runtime import sessions as module

        return getattr(module, name)
    if name in ("SPLIT_VERSION", "SplitPlan", "compile_parts", "part_models", "plan_split"):
        from winml_recipes.runtime import splitcompile as module

        return getattr(module, name)
    if name == "run_on_target":
        from winml_recipes.runtime import target as module

        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
