"""A digest of the code a pass runs, for its cache keys.

A hand-bumped `version` let the cache serve results of older code (quantize stayed at
version 1 through two commits that changed its output). The key therefore holds the
sha256 of the pass's module and of every module of the same package it imports,
transitively (imports found in the source text, at module level or inside functions).
Third-party libraries are covered by the library versions already in every key.
"""

from __future__ import annotations

import hashlib
import re
import sys
from functools import cache
from pathlib import Path

# The names of a `from` import end with its line unless they are in parentheses (`\s` would
# run on into the next lines and swallow the imports there).
_IMPORT = re.compile(
    r"^[ \t]*(?:from[ \t]+([\w.]+)[ \t]+import[ \t]+(\([\w\s,]+\)|[\w \t,]+)|import[ \t]+([\w.]+))",
    re.M,
)


def code_digest(cls: type) -> str:
    """sha256 over the sources of `cls`'s module and the package modules it imports."""
    module = cls.__module__
    return _closure_digest(module, module.split(".")[0])


@cache
def _closure_digest(module: str, package: str) -> str:
    seen: dict[str, Path] = {}
    pending = [module]
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        path = _source(name)
        if path is None:
            continue
        seen[name] = path
        pending.extend(_imports(path.read_text(encoding="utf-8"), name, package))
    h = hashlib.sha256()
    for name in sorted(seen):
        h.update(name.encode() + b"\0" + seen[name].read_bytes() + b"\0")
    return h.hexdigest()


@cache
def _source(name: str) -> Path | None:
    """The .py file of module `name`, found under its top-level package's folder (no import:
    find_spec would import parent packages, e.g. the exporters and torch)."""
    parts = name.split(".")
    top = sys.modules.get(parts[0])
    if top is None or not getattr(top, "__file__", None):
        return None
    file = Path(top.__file__)
    root = file.parent
    if len(parts) == 1:  # a top-level package, or a single-file module (a script's pass)
        return file if file.suffix == ".py" and file.is_file() else None
    rel = Path(*parts[1:])
    for candidate in (root / rel.with_suffix(".py"), root / rel / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(text: str, current: str, package: str) -> list[str]:
    out = []
    for match in _IMPORT.finditer(text):
        base = match.group(1) or match.group(3)
        if not base or base.split(".")[0] != package:
            continue
        out.append(base)
        if match.group(2):  # `from pkg.mod import sub`: sub may be a module
            for item in re.split(r"[\s,()]+", match.group(2)):
                if item and item != "as":
                    out.append(f"{base}.{item}")
    if current.count("."):
        out.append(current.rsplit(".", 1)[0])  # the package's __init__ runs first
    return out
