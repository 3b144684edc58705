"""Plugins from entry-point groups: passes and exporter families are found the same way."""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata
from typing import Any

from winml_recipes.sdk.errors import PlanError


def load_entry_points(
    group: str, accept: Callable[[Any], bool], what: str, skip_missing: bool = False
) -> dict[str, Any]:
    """Every object the installed distributions declare in `group`, by entry-point name.

    Built-ins are declared in pyproject.toml like a third party's, so nothing is found by
    a name written in the code. An object `accept` refuses is an error naming the entry.
    `skip_missing`: an entry whose module does not exist (a stale declaration, e.g. an
    editable install older than the source tree) is left out instead of failing.
    """
    found: dict[str, Any] = {}
    for ep in metadata.entry_points(group=group):
        try:
            obj = ep.load()
        except ModuleNotFoundError as exc:
            if skip_missing and exc.name == ep.module:
                continue
            raise
        if not accept(obj):
            raise PlanError(f"entry point '{ep.name}' in {group} is not {what}")
        found[ep.name] = obj
    return found
