"""Memory estimates for passes: `RewritesGraph` (the estimate of a pass that loads and
rewrites a graph), a forward pass's estimate, and how to combine them; the engine checks
each step's estimate against the memory budget before it runs (sdk/estimates.py has the
records).

A facade over engine/budget.py (see services/models.py for why passes import from here).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names, for type checkers and editors
    from winml_recipes.engine.budget import (
        RUNTIME_MB,
        RewritesGraph,
        contract_shapes,
        forward_estimate,
        graph_preparation_estimate,
        larger,
        preparation_estimate,
        quantized_later,
        resolve_budget,
        rewrite_estimate,
    )

__all__ = [
    "RUNTIME_MB",
    "RewritesGraph",
    "contract_shapes",
    "forward_estimate",
    "graph_preparation_estimate",
    "larger",
    "preparation_estimate",
    "quantized_later",
    "resolve_budget",
    "rewrite_estimate",
]


def __getattr__(name: str) -> Any:
    """The implementation of `name`, imported when first asked for."""
    if name in __all__:
        import winml_recipes.engine.budget as module

        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
