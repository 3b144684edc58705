"""Plugins from entry-point groups: passes and exporter families are found the same way."""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata
from typing import Any

from winml_recipes.sdk.errors import PlanError


def load_entry_points(group: str, accept: Callable[[Any], bool], what: str) -> dict[str, Any]:
    """Every object the installed distributions declare in `group`, by entry-point name.

    Built-ins are declared in pyproject.toml like a third party's, so nothing is found by
    a name written in the code. An object `accept` refuses is an error naming the entry.
    """
    found: dict[str, Any] = {}
    for ep in metadata.entry_points(group=group):
        obj = ep.load()
        if not accept(obj):
            raise PlanError(f"entry point '{ep.name}' in {group} is not {what}")
        found[ep.name] = obj
    return found
