"""The normalize stamp: a metadata_props entry saying which tool normalized this graph.

The stamp records the graph fingerprint at normalization time, so a model edited
afterwards (any graph change) no longer counts as normalized.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import onnx

from winml_recipes.onnx.digest import graph_fingerprint

STAMP_KEY = "winml_recipes.normalized"


def write_stamp(
    model: onnx.ModelProto, tool: str, base_dir: Path | str | None = None
) -> dict[str, str]:
    """Store {"tool", "fingerprint"} under STAMP_KEY (replacing any old one); return it."""
    stamp = {"tool": tool, "fingerprint": graph_fingerprint(model, base_dir)}
    kept = [p for p in model.metadata_props if p.key != STAMP_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    model.metadata_props.add(key=STAMP_KEY, value=json.dumps(stamp, sort_keys=True))
    return stamp


def read_stamp(model: onnx.ModelProto) -> dict[str, Any] | None:
    """The stamp as a dict, or None when absent or unreadable."""
    for prop in model.metadata_props:
        if prop.key == STAMP_KEY:
            try:
                value = json.loads(prop.value)
            except ValueError:
                return None
            return value if isinstance(value, dict) else None
    return None


def is_normalized(model: onnx.ModelProto, base_dir: Path | str | None = None) -> bool:
    """True when a stamp exists and matches the model's current fingerprint."""
    stamp = read_stamp(model)
    if not stamp or not isinstance(stamp.get("fingerprint"), str):
        return False
    return stamp["fingerprint"] == graph_fingerprint(model, base_dir)
