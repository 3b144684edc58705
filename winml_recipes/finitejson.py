"""JSON that is JSON: a non-finite float (NaN, Infinity) is refused with the path holding it.

Python's json writes bare `NaN`/`Infinity`, which no other JSON reader accepts. Records
whose schema says `number` (the manifest) are written through `dumps_finite`: a non-finite
value there is a bug upstream (config numbers are checked finite when read, metrics are
capped), so it is named and refused rather than written as null, which the schema refuses
too and which would hide the bug.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

from winml_recipes.sdk.errors import InternalError


def nonfinite_paths(
    value: Any, path: str = "$", step: str = ""
) -> Iterator[tuple[str, float, str]]:
    """(JSON path, value, the step record's pass holding it or "") of every non-finite float
    inside `value` (dicts, lists, tuples)."""
    if isinstance(value, float):
        if not math.isfinite(value):
            yield path, value, step
    elif isinstance(value, dict):
        step = str(value["pass"]) if isinstance(value.get("pass"), str) else step
        for key, item in value.items():
            yield from nonfinite_paths(item, f"{path}.{key}", step)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from nonfinite_paths(item, f"{path}[{i}]", step)


def dumps_finite(data: Any, what: str, **kwargs: Any) -> str:
    """`json.dumps(data, allow_nan=False, **kwargs)`; a non-finite number raises one line
    naming `what` (the file) and the first path that holds one (and its step's pass)."""
    try:
        return json.dumps(data, allow_nan=False, **kwargs)
    except ValueError:
        found = next(nonfinite_paths(data), None)
        if found is None:
            raise
        path, value, step = found
        made_by = f" (made by the {step} step)" if step else ""
        raise InternalError(
            f"{path} is {value}{made_by}, which JSON cannot hold; nothing was written (a bug "
            "in that step: please report it with the recipe)",
            where=what,
        ) from None
