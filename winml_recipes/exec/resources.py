"""What a task expects to need, so a scheduler (Ray) never puts two large builds on a node
that holds one.

The estimate is the largest of the steps' own estimates (`Pass.estimate_memory`, the same
numbers the memory budget checks) for components whose source is on disk, and of the
estimates the previous build of the same target recorded in its manifest (a
model the build exports is known only once exported). Never below DEFAULT_TASK_MB.
"""

from __future__ import annotations

import json
from pathlib import Path

from winml_recipes.engine.budget import RUNTIME_MB, EstimateInputs
from winml_recipes.exec.task import TargetTask

# A small build: the runtime, a tiny model and its sessions (sam3-tiny peaks near 1 GB).
DEFAULT_TASK_MB = 1024.0


def expected_memory_mb(task: TargetTask) -> float:
    """The task's expected peak in MB (a planning error leaves the default: the task
    itself then reports the error)."""
    from winml_recipes.engine.plan import make_plan
    from winml_recipes.engine.run import output_dir_for
    from winml_recipes.recipe import load_recipe
    from winml_recipes.sdk.errors import WinmlError

    try:
        plan = make_plan(
            load_recipe(
                task.recipe,
                device=task.device,
                precision=task.precision,
                defines=task.defines,
                catalog_dir=Path(task.catalog_dir) if task.catalog_dir else None,
                source=task.source,
            ),
            fetch=False,
        )
    except (WinmlError, OSError):
        return DEFAULT_TASK_MB
    found = [DEFAULT_TASK_MB, float(RUNTIME_MB)]
    for comp in plan.components:
        path = comp.source.path
        if path is None or not comp.facts.is_onnx:
            continue
        for step in comp.steps:
            if step.skip:
                continue
            inputs = EstimateInputs(
                plan.target, comp.contract, path if comp.facts.has_reference else None
            )
            try:
                estimate = step.impl.estimate_memory(path, step.config, inputs)
            except (WinmlError, OSError):  # e.g. a model not made yet: known at build time
                continue
            if estimate is not None:
                found.append(estimate.mb)
    found += _recorded(output_dir_for(plan, Path(task.output_root)) / "manifest.json")
    return max(found)


def _recorded(manifest: Path) -> list[float]:
    """The step estimates of the last build of this target, if any."""
    try:
        data = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return []
    out = []
    for comp in (data.get("components") or {}).values():
        for step in comp.get("steps", []):
            value = step.get("memory_estimate_mb")  # not peak_rss_mb: a process's, not a step's
            if isinstance(value, int | float):
                out.append(float(value))
    return out
