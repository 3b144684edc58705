"""What a task expects to need, so a scheduler (Ray) never puts two large tasks on a node
that holds one.

A steps task expects the largest of its steps' own estimates (`Pass.estimate_memory`, the
same numbers the memory budget checks) when the component's source is on disk, and of the
estimates the previous build of the same target recorded for those steps in its manifest
(a model the build exports is known only once exported). An assembly (copying the final
models and reading each graph once) expects the size of the largest model the previous
build shipped. Never below DEFAULT_TASK_MB. A target's `memory_mb`, when given, is what
each of its tasks declares.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from winml_recipes.engine.budget import RUNTIME_MB, EstimateInputs
from winml_recipes.engine.plan import Plan
from winml_recipes.exec.task import TargetTask

# A small build: the runtime, a tiny model and its sessions (sam3-tiny peaks near 1 GB).
DEFAULT_TASK_MB = 1024.0
MB = 1e6


class TaskMemory:
    """Expected peaks of a target's tasks, from its plan and its last manifest (read once)."""

    def __init__(self, task: TargetTask, plan: Plan) -> None:
        from winml_recipes.engine.run import output_dir_for

        self.task, self.plan = task, plan
        self.last = _read(output_dir_for(plan, Path(task.output_root)) / "manifest.json")

    def of_steps(self, component: str, steps: tuple[int, ...]) -> float:
        if self.task.memory_mb is not None:
            return self.task.memory_mb
        found = [DEFAULT_TASK_MB, float(RUNTIME_MB)]
        found += [self._estimate(component, i) for i in steps]
        recorded = ((self.last.get("components") or {}).get(component) or {}).get("steps", [])
        for i in steps:
            value = recorded[i].get("memory_estimate_mb") if i < len(recorded) else None
            if isinstance(value, int | float):  # not peak_rss_mb: a process's, not a step's
                found.append(float(value))
        return max(found)

    def of_assembly(self) -> float:
        if self.task.memory_mb is not None:
            return self.task.memory_mb
        shipped = [
            float(c.get("artifact", {}).get("size_bytes", 0)) / MB
            for c in (self.last.get("components") or {}).values()
        ]
        return max([DEFAULT_TASK_MB, float(RUNTIME_MB) + max(shipped, default=0.0)])

    def _estimate(self, component: str, index: int) -> float:
        from winml_recipes.sdk.errors import WinmlError

        comp = next(c for c in self.plan.components if c.name == component)
        path, step = comp.source.path, comp.steps[index]
        if path is None or not comp.facts.is_onnx or step.skip:
            return 0.0
        inputs = EstimateInputs(
            self.plan.target, comp.contract, path if comp.facts.has_reference else None
        )
        try:
            estimate = step.impl.estimate_memory(path, step.config, inputs)
        except (WinmlError, OSError):  # e.g. a model not made yet: known at build time
            return 0.0
        return estimate.mb if estimate is not None else 0.0


def expected_memory_mb(task: TargetTask) -> float:
    """The most any task of this target expects, in MB (a planning error leaves the
    default: the build itself then reports the error)."""
    from winml_recipes.sdk.errors import WinmlError

    try:
        plan = task.plan(fetch=False)
    except (WinmlError, OSError):
        return DEFAULT_TASK_MB
    memory = TaskMemory(task, plan)
    steps = [memory.of_steps(c.name, tuple(range(len(c.steps)))) for c in plan.components]
    return max([memory.of_assembly(), *steps])


def _read(manifest: Path) -> dict[str, Any]:
    """The last build's manifest through the bounded reader ({} when absent or unreadable)."""
    from winml_recipes.untrusted import UntrustedInputError, read_json_bounded

    if not manifest.is_file():
        return {}
    try:
        return read_json_bounded(manifest)
    except UntrustedInputError:
        return {}
