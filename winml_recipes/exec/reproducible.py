"""What must not depend on the executor: an output folder's bytes, and its manifest without
the fields that describe one run (times anywhere, e.g. a step's `wall_seconds` or the
export's `export_seconds`; memory peaks; whether a step ran or came from the cache, and
whether the upstream forwards a calibration needs were computed or read from the store).

One exception, outside this tool's reach: an EP's serializer may copy some of the compiling
process's memory into padding of its context binaries (the EP's plugin names them:
`unreproducible_artifacts`; e.g. the NPU's HTP binaries of the sam3-tiny decoder, compiled
twice in fresh processes, have the same size and differ in 70-78 bytes of one region: heap
and stack pointers, a code address, a per-process random value; overwriting them all
leaves the outputs on HTP bit-identical; no provider option changes it). They count by size
only; the EPContext model that points
at them must still be identical, and the compile step checks each binary against the
uncompiled model on the EP.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from winml_recipes.onnx.io import file_sha256

# Step fields that say how this run went, not what it made. memory_estimate_mb is recorded
# only when a step ran (a cached step has no estimate to make).
RUN_FIELDS = ("wall_seconds", "peak_rss_mb", "memory_estimate_mb")


def _not_reproduced(name: str) -> bool:
    """Whether an EP plugin says files named so are not reproducible byte for byte."""
    from winml_recipes.sdk.ep import execution_providers

    patterns = [ep.unreproducible_artifacts for ep in execution_providers().values()]
    return any(re.fullmatch(p, name) for p in patterns if p)


def _without_unreproduced_digests(value: Any) -> Any:
    """File records ({name or path, size_bytes, sha256}) of unreproducible binaries keep
    their size."""
    if isinstance(value, dict):
        name = str(value.get("name") or value.get("path") or "")
        return {
            k: _without_unreproduced_digests(v)
            for k, v in value.items()
            if not (k == "sha256" and _not_reproduced(Path(name).name))
        }
    if isinstance(value, list):
        return [_without_unreproduced_digests(v) for v in value]
    return value


RUN_METRICS = ("upstream_forwards", "reference_forwards")  # computed vs reused: the cache's state


def _without_times(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: _without_times(v)
            for k, v in value.items()
            if not (k == "seconds" or k.endswith("_seconds") or k in RUN_METRICS)
        }
    if isinstance(value, list):
        return [_without_times(v) for v in value]
    return value


def comparable_manifest(manifest: dict[str, Any]) -> dict[str, Any]:
    manifest = _without_unreproduced_digests(_without_times(manifest))
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
    """Every file of a target's output folder by its sha256; the manifest as comparable; the
    report (which shows the run's times and the folder's path) by its presence."""
    out: dict[str, Any] = {}
    for path in sorted(p for p in Path(out_dir).rglob("*") if p.is_file()):
        rel = path.relative_to(out_dir).as_posix()
        if rel == "manifest.json":
            out[rel] = comparable_manifest(json.loads(path.read_text()))
        elif rel == "report.html":  # a view of the manifest with its times and paths
            out[rel] = "present"
        elif _not_reproduced(path.name):
            out[rel] = {"size_bytes": path.stat().st_size}
        else:
            out[rel] = file_sha256(path)
    return out
