"""What a worker runs for one task of the graph (exec/graph.py): a stretch of one
component's steps, or the assembly of one target's output folder.

The argument and the result are plain, picklable data (paths as the driver sees them,
chain states that point into the shared step cache), so the same functions run in this
process, a pool process or on a Ray worker. A worker plans the target itself from the
recipe (memoized per process) and checks that its plan keys are the driver's: a recipe
that changed under a running matrix fails its tasks instead of building something else.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from winml_recipes.engine.plan import Plan, PlannedStep
from winml_recipes.engine.run import EVIDENCE, ChainState, Reporter
from winml_recipes.exec.task import (
    FAILED,
    OK,
    TargetOutcome,
    TargetTask,
    as_winml_error,
    key_metrics,
)
from winml_recipes.sdk.errors import WinmlError
from winml_recipes.sdk.records import StepRecord


@dataclass(frozen=True)
class StepsTask:
    """Run `steps` (indices) of `component` in `spec`'s plan, from `state` (None: the
    component's source), with the final states of the components it reads."""

    spec: TargetTask
    component: str
    steps: tuple[int, ...]
    state: ChainState | None  # None: the component's source
    upstream: dict[str, ChainState | None]  # None: that component's source (it has no steps)
    fingerprint: str  # of the driver's plan (exec/keys.py; the worker's must match)
    label: str = ""  # the recipe and the targets it builds for (progress lines)
    raise_errors: bool = False


@dataclass(frozen=True)
class AssembleTask:
    """Ship each component's final state into `spec`'s output folder, with the manifest
    built from the steps' records."""

    spec: TargetTask
    chains: dict[str, tuple[list[StepRecord], ChainState | None]]  # None: no steps
    started_at: float  # when the target's first task started (the manifest's wall time)
    fingerprint: str
    raise_errors: bool = False


@dataclass
class TaskResult:
    status: str  # ok, failed
    # failed steps task: the records up to the failed step's, and the state before it
    records: list[StepRecord] = field(default_factory=list)
    state: ChainState | None = None
    outcome: TargetOutcome | None = None  # assemble: the target's outcome
    error: str | None = None
    exit_code: int = 0
    failing_step: str | None = None
    error_data: dict[str, Any] = field(default_factory=dict)  # WinmlError.data (bisection)
    wall_seconds: float = 0.0
    worker_pid: int | None = None
    started_at: float | None = None
    finished_at: float | None = None
    resources: dict[str, float] = field(default_factory=dict)


class StepTracker(Reporter):
    """Forwards to the progress reporter and remembers the step that has not finished."""

    def __init__(self, inner: Reporter) -> None:
        self.inner = inner
        self.current: str | None = None

    def step_started(self, component: str, step: PlannedStep) -> None:
        self.current = f"{component}/{step.name}"
        self.inner.step_started(component, step)

    def step_progress(
        self, component: str, step: PlannedStep, what: str, done: int, total: int | None
    ) -> None:
        self.inner.step_progress(component, step, what, done, total)

    def step_finished(self, component: str, step: PlannedStep, record: StepRecord) -> None:
        self.current = None
        self.inner.step_finished(component, step, record)

    def message(self, text: str) -> None:
        self.inner.message(text)


def reporter_for(task: TargetTask, label: str) -> Reporter | None:
    from winml_recipes.progress import make_reporter, step_lines

    if task.progress == "rich":
        return make_reporter(enabled=True)
    if task.progress in ("stdout", "stderr"):
        return step_lines(getattr(sys, task.progress), prefix=label)
    return None


@contextlib.contextmanager
def working_dir(path: str | None):
    """Run in the driver's working directory when this machine has it (a pool process or a
    worker on the same host or a shared mount), so relative paths mean the same thing."""
    if path is None or not Path(path).is_dir() or Path.cwd() == Path(path):
        yield
        return
    before = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


_PLANS: dict[str, Plan] = {}
PLANS_KEPT = 256  # a long-lived worker (Ray) plans many recipes over its life


def plan_of(spec: TargetTask, *, fresh: bool = False) -> Plan:
    """The target's plan, made once per process (`fresh`: made again)."""
    import json

    memo = json.dumps([spec.recipe, spec.device, spec.precision, spec.defines, spec.catalog_dir,
                       spec.source, spec.cwd], sort_keys=True, default=str)  # fmt: skip
    if fresh or memo not in _PLANS:
        while len(_PLANS) >= PLANS_KEPT:
            _PLANS.pop(next(iter(_PLANS)))
        _PLANS.pop(memo, None)
        _PLANS[memo] = spec.plan()
    return _PLANS[memo]


def checked_plan(spec: TargetTask, fingerprint: str) -> Plan:
    """The worker's plan of the target, which must be the driver's: planned again once if
    not (a memo from an earlier run), then an error (the recipe changed meanwhile)."""
    from winml_recipes.exec.keys import plan_fingerprint

    plan = plan_of(spec)
    if plan_fingerprint(plan) != fingerprint:
        plan = plan_of(spec, fresh=True)
        if plan_fingerprint(plan) != fingerprint:
            raise WinmlError(
                "the recipe, its catalog or a source changed while the matrix ran; run it again",
                where=spec.recipe,
            )
    return plan


def cache_of(spec: TargetTask):
    from winml_recipes.engine.cache import StepCache

    return StepCache(Path(spec.cache_dir) if spec.cache_dir else None, enabled=True)


def run_steps_task(task: StepsTask) -> TaskResult:
    """Run a stretch of steps; every failure becomes a failed result (KeyboardInterrupt is
    never caught: it cancels the whole matrix)."""
    from winml_recipes.engine.budget import resolve_budget
    from winml_recipes.engine.run import Reporter as Silent
    from winml_recipes.engine.run import begin_chain, run_steps, upstream_of

    started, started_at = time.perf_counter(), time.time()
    tracker = StepTracker(Silent())
    cache = cache_of(task.spec)
    try:
        with working_dir(task.spec.cwd):
            plan = checked_plan(task.spec, task.fingerprint)
            comps = {c.name: c for c in plan.components}
            comp = comps[task.component]
            built = {
                name: upstream_of(comps[name], state or begin_chain(comps[name]))
                for name, state in task.upstream.items()
            }
            progress = reporter_for(task.spec, task.label or plan.recipe.name)
            tracker.inner = progress or Silent()
            with progress or contextlib.nullcontext(), cache.scratch() as work_root:
                try:
                    records, state = run_steps(
                        comp,
                        [comp.steps[i] for i in task.steps],
                        plan,
                        work_root,
                        cache,
                        task.state or begin_chain(comp),
                        built,
                        resolve_budget(task.spec.memory_budget),
                        tracker,
                    )
                finally:
                    cache.release_claims()
    except Exception as exc:
        if task.raise_errors:
            raise
        failed = _failed(exc, tracker.current, started, started_at)
        # the records of this stretch with the failed step's, and the state before it
        records, state = getattr(exc, EVIDENCE, {}).get(task.component, ([], None))
        failed.records, failed.state = records, state
        return failed
    return TaskResult(
        OK,
        records=records,
        state=state,
        wall_seconds=round(time.perf_counter() - started, 3),
        worker_pid=os.getpid(),
        started_at=started_at,
        finished_at=time.time(),
    )


def assemble(task: AssembleTask) -> TaskResult:
    """Write one target's output folder from its finished steps."""
    from winml_recipes.engine.run import begin_chain, write_output

    started, started_at = time.perf_counter(), time.time()
    spec = task.spec
    try:
        with working_dir(spec.cwd):
            plan = checked_plan(spec, task.fingerprint)
            comps = {c.name: c for c in plan.components}

            def chains(_staging: Path) -> dict[str, tuple[list[dict[str, Any]], ChainState]]:
                return {
                    name: (records, state or begin_chain(comps[name]))
                    for name, (records, state) in task.chains.items()
                }

            result = write_output(
                plan,
                Path(spec.output_root),
                chains,
                _lines(spec, plan.recipe.name),
                wait_seconds=spec.wait_seconds,
                wall_seconds=time.time() - task.started_at,
            )
    except Exception as exc:
        if task.raise_errors:
            raise
        return _failed(exc, None, started, started_at)
    manifest = result.manifest
    outcome = TargetOutcome(
        spec.recipe,
        plan.target.device,
        plan.target.precision,
        OK,
        ep=plan.target.ep or None,
        wall_seconds=round(time.perf_counter() - started, 3),
        output_dir=str(result.output_dir),
        manifest_path=str(result.output_dir / "manifest.json"),
        metrics=key_metrics(manifest),
        name=manifest["recipe"]["name"],
        worker_pid=os.getpid(),
        started_at=started_at,
        finished_at=time.time(),
    )
    return TaskResult(
        OK,
        outcome=outcome,
        wall_seconds=outcome.wall_seconds,
        worker_pid=os.getpid(),
        started_at=started_at,
        finished_at=outcome.finished_at,
    )


def keep_failed_evidence(
    spec: TargetTask,
    plan: Plan,
    chains: dict[str, tuple[list[StepRecord], ChainState | None]],
    error: str,
    wall: float,
) -> str | None:
    """A failed target's evidence (engine.run.keep_evidence) from the records and states
    of its tasks, written by the driver as the failure comes in (it holds the target's
    build lock until then): the folder, or None when nothing ran or it could not be kept."""
    from winml_recipes.engine.run import begin_chain, keep_evidence

    if not any(records for records, _ in chains.values()):
        return None
    comps = {c.name: c for c in plan.components}
    with working_dir(spec.cwd):
        folder = keep_evidence(
            plan,
            Path(spec.output_root),
            {n: (r, s or begin_chain(comps[n])) for n, (r, s) in chains.items() if r},
            error,
            wall,
            spec.wait_seconds,
        )
    return str(folder)


def _lines(spec: TargetTask, label: str) -> Reporter:
    """Messages of an assembly (waiting for another build's lock) as lines: it has no
    steps to show in a live view."""
    from dataclasses import replace

    return reporter_for(replace(spec, progress="stderr") if spec.progress == "rich" else spec,
                     label) or Reporter()  # fmt: skip


def _failed(exc: Exception, step: str | None, started: float, started_at: float) -> TaskResult:
    error = exc if isinstance(exc, WinmlError) else as_winml_error(exc)
    return TaskResult(
        FAILED,
        error=str(error),
        exit_code=error.exit_code,
        failing_step=step,
        error_data=dict(error.data),
        wall_seconds=round(time.perf_counter() - started, 3),
        worker_pid=os.getpid(),
        started_at=started_at,
        finished_at=time.time(),
    )
