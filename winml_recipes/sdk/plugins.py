"""Plugins from entry-point groups: EPs, task metrics, passes and exporter families.

The built-ins are declared by winml-recipes itself (pyproject.toml) like a third party's;
they load first and a broken one is an error. A third-party entry point never breaks a
command that does not need it: one that fails to load (raises on import, lacks its
attribute, is not the kind of object the group holds) is skipped with one warning line
naming its distribution and entry point, and recorded so that a command naming it fails
with that line (`unavailable`). One that claims a built-in's name (entry-point name, EP
key, pass name, exporter family, task metric name or task) is refused the same way: a
built-in is never silently replaced, and a plugin is never silently ignored.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable
from importlib import metadata
from typing import Any

from winml_recipes.sdk.errors import PlanError

BUILTIN_DIST = "winml-recipes"

_skipped: dict[str, dict[str, str]] = {}  # group -> entry-point name -> why (one line)
_warned: set[str] = set()


def _dist_name(ep: metadata.EntryPoint) -> str:
    dist = ep.dist
    name = dist.metadata["Name"] if dist is not None else None
    return re.sub(r"[-_.]+", "-", str(name or "?")).lower()


def _dist_label(ep: metadata.EntryPoint) -> str:
    dist = ep.dist
    version = dist.version if dist is not None else None
    return f"{_dist_name(ep)} {version}" if version else _dist_name(ep)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())[:300]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _skip(group: str, ep: metadata.EntryPoint, why: str) -> None:
    """Record and warn (once per process) that a third-party entry point is not used."""
    line = (
        f"plugin '{ep.name}' ({ep.value}) of distribution '{_dist_label(ep)}' in {group} "
        f"not used: {why}"
    )
    _skipped.setdefault(group, {}).setdefault(ep.name, line)
    if line not in _warned:
        _warned.add(line)
        print(f"warning: {line}", file=sys.stderr)


def unavailable(group: str, name: str) -> str | None:
    """Why a third-party entry point `name` of `group` was skipped or refused, or None."""
    return _skipped.get(group, {}).get(name)


def check_available(group: str, name: str, what: str) -> None:
    """A PlanError naming the skipped plugin when `name` is one (call before check_known)."""
    why = unavailable(group, name)
    if why is not None:
        raise PlanError(f"{what} '{name}' is not available: {why}")


def _check(
    obj: Any,
    name: str,
    accept: Callable[[Any], bool],
    what: str,
    claims: Callable[[Any], Iterable[str]],
    named: Callable[[Any], str] | None,
) -> tuple[str | None, list[str]]:
    """(why the object is refused or None, the names it claims)."""
    try:
        if not accept(obj):
            return f"it is not {what}", []
        if named is not None and named(obj) != name:
            return f"it declares the name '{named(obj)}'", []
        return None, sorted({str(n) for n in claims(obj)})
    except Exception as exc:  # a half-made plugin (no `name`, a `tasks` that is no set)
        return f"it is not {what} ({_one_line(exc)})", []


def load_entry_points(
    group: str,
    accept: Callable[[Any], bool],
    what: str,
    skip_missing: bool = False,
    claims: Callable[[Any], Iterable[str]] = lambda obj: (),
    named: Callable[[Any], str] | None = None,
) -> dict[str, Any]:
    """Every object the installed distributions declare in `group`, by entry-point name.

    Built-ins come first. An object `accept` refuses is an error for a built-in, a skipped
    plugin (one warning line) for a third party. `claims`: the names an object registers
    besides its entry-point name (an EP key, a pass name, a metric's tasks); a third
    party claiming one a built-in holds is refused. `skip_missing`: a built-in entry whose
    module does not exist (a stale declaration, e.g. an editable install older than the
    source tree) is left out instead of failing. `named`: the name an object declares,
    which must be its entry-point name.
    """
    points = sorted(metadata.entry_points(group=group), key=lambda e: _dist_name(e) != BUILTIN_DIST)
    found: dict[str, Any] = {}
    owned: dict[str, str] = {}  # a claimed name -> who holds it ("built-in 'cpu'")
    for ep in points:
        builtin = _dist_name(ep) == BUILTIN_DIST
        if not builtin and ep.name in found:
            _skip(group, ep, f"its name '{ep.name}' is taken by {owned[ep.name]}; rename it")
            continue
        try:
            obj = ep.load()
        except ModuleNotFoundError as exc:
            if builtin and skip_missing and exc.name == ep.module:
                continue
            if builtin:
                raise
            _skip(group, ep, f"it failed to load ({_one_line(exc)}); fix or uninstall it")
            continue
        except Exception as exc:  # a third party's import error is its own, not ours
            if builtin:
                raise
            _skip(group, ep, f"it failed to load ({_one_line(exc)}); fix or uninstall it")
            continue
        wrong, names = _check(obj, ep.name, accept, what, claims, named)
        if wrong is not None:
            if builtin:
                raise PlanError(f"entry point '{ep.name}' in {group}: {wrong}")
            _skip(group, ep, wrong)
            continue
        taken = [n for n in names if n in owned]
        if not builtin and taken:
            clash = ", ".join(f"'{n}' (held by {owned[n]})" for n in taken)
            _skip(group, ep, f"it claims {clash}; rename it")
            continue
        found[ep.name] = obj
        holder = f"{'built-in' if builtin else _dist_name(ep)} '{ep.name}'"
        for n in {ep.name, *names}:
            owned.setdefault(n, holder)
    return found
