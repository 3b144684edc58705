"""What must not depend on the executor: an output folder's bytes, and its manifest without
the fields that describe one run (times anywhere, e.g. a step's `wall_seconds` or the
export's `export_seconds`; memory peaks; whether a step ran or came from the cache)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from winml_recipes.onnx.io import file_sha256

# Step fields that say how this run went, not what it made. memory_estimate_mb is recorded
# only when a step ran (a cached step has no estimate to make).
RUN_FIELDS = ("wall_seconds", "peak_rss_mb", "memory_estimate_mb")


def _without_times(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: _without_times(v)
            for k, v in value.items()
            if not (k == "seconds" or k.endswith("_seconds"))
        }
    if isinstance(value, list):
        return [_without_times(v) for v in value]
    return value


def comparable_manifest(manifest: dict[str, Any]) -> dict[str, Any]:
    manifest = _without_times(manifest)
    out = dict(manifest)
    out["components"] = {}
    for name, comp in manifest["components"].items():
        steps = []
        for step in comp["steps"]:
            step = {k: v for k, v in step.items() if k not in RUN_FIELDS}
            if step.get("status") in ("ran", "cached"):
                step["status"] = "built"
            steps.append(step)
        out["components"][name] = {**comp, "steps": steps}
    return out


def fingerprint(out_dir: Path) -> dict[str, Any]:
    """Every file of a target's output folder by its sha256; the manifest as comparable."""
    out: dict[str, Any] = {}
    for path in sorted(p for p in Path(out_dir).rglob("*") if p.is_file()):
        rel = path.relative_to(out_dir).as_posix()
        if rel == "manifest.json":
            out[rel] = comparable_manifest(json.loads(path.read_text()))
        else:
            out[rel] = file_sha256(path)
    return out
