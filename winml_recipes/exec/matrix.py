"""Recipes x targets through an executor: expand the tasks, run them, and report.

The report is written whatever happens (every target built, some failed, Ctrl-C): per
target its status, the step that failed and the one-line error, the wall time, key
metrics and where the manifest is. Its exit code says what CI needs to know: 0 all built,
3 a quality gate failed, 2 bad input, 1 an internal fault (the worst of the targets', in
that order of precedence), 130 interrupted.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from winml_recipes.engine.plan import Plan
from winml_recipes.exec.executors import Executor
from winml_recipes.exec.task import FAILED, OK, TargetOutcome, TargetTask, not_run
from winml_recipes.sdk.errors import RecipeError, WinmlError

REPORT_VERSION = 1
EXIT_INTERRUPTED = 130
INTERRUPTED = "not finished: the matrix was interrupted (Ctrl-C)"


@dataclass
class MatrixReport:
    executor: str
    outcomes: list[TargetOutcome]
    wall_seconds: float = 0.0
    startup_seconds: float = 0.0
    interrupted: bool = False
    error: WinmlError | None = None  # the run itself failed (e.g. Ray missing)
    tasks: list[dict[str, Any]] = field(default_factory=list)  # the graph's tasks

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return EXIT_INTERRUPTED
        if self.error is not None:
            return self.error.exit_code
        codes = {o.exit_code for o in self.outcomes if o.status == FAILED}
        for code in (1, 2, 3):  # a fault first, then bad input, then a quality gate
            if code in codes:
                return code
        return max(codes, default=0)

    @property
    def status(self) -> str:
        if self.interrupted:
            return "interrupted"
        if self.error is not None:
            return FAILED
        return OK if all(o.status == OK for o in self.outcomes) else FAILED

    def to_dict(self) -> dict[str, Any]:
        return {
            "report_version": REPORT_VERSION,
            "status": self.status,
            "exit_code": self.exit_code,
            "executor": self.executor,
            "wall_seconds": round(self.wall_seconds, 3),
            "startup_seconds": round(self.startup_seconds, 3),
            "error": str(self.error) if self.error is not None else None,
            "targets": [o.to_dict() for o in self.outcomes],
            "tasks": self.tasks,
        }

    def write(self, path: Path) -> None:
        """Atomically: a reader sees the previous report or this one, never half."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        os.replace(tmp, path)

    def table(self) -> str:
        """A summary: recipe, target, status, wall, size, lowest SQNR; then the errors."""
        rows = [("recipe", "target", "status", "wall s", "size MB", "min SQNR dB", "step")]
        for o in self.outcomes:
            m = o.metrics
            sqnr = m.get("min_sqnr_db")
            rows.append(
                (
                    o.name or Path(o.recipe).stem,
                    o.target,
                    o.status,
                    f"{o.wall_seconds:.1f}",
                    f"{m['size_mb']:.2f}" if "size_mb" in m else "-",
                    f"{sqnr:.1f}" if sqnr is not None else "-",
                    o.failing_step or "-",
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                 for r in rows]  # fmt: skip
        built = sum(o.status == OK for o in self.outcomes)
        lines.append(
            f"{built}/{len(self.outcomes)} built with {self.executor} in "
            f"{self.wall_seconds:.1f} s"
            + (f" (start-up {self.startup_seconds:.1f} s)" if self.startup_seconds else "")
        )
        return "\n".join(lines)


# A target as the matrix names it: device, precision and the EP the recipe named (None:
# the device's default EP).
TargetKey = tuple[str, str, str | None]


def parse_targets(text: str | None) -> list[TargetKey] | None:
    """`all` (or nothing): None; else "cpu/int8,npu/uint8/openvino" as (device, precision,
    ep) triples (ep None when not given)."""
    if text is None or text.strip() == "all":
        return None
    out: list[TargetKey] = []
    for item in text.split(","):
        parts = item.strip().split("/")
        if len(parts) not in (2, 3) or not all(parts):
            raise RecipeError(
                f"--targets {text!r}: expected all or DEVICE/PRECISION[/EP][,...], e.g. "
                "cpu/int8 or npu/uint8/openvino"
            )
        out.append((parts[0], parts[1], parts[2] if len(parts) == 3 else None))
    return out


def _as_key(target: Sequence[str | None]) -> TargetKey:
    device, precision, *rest = target
    return (str(device), str(precision), (rest[0] or None) if rest else None)


def _wants(wanted: list[TargetKey] | None, target: TargetKey, declared: list[TargetKey]) -> bool:
    """Whether `target` (declared) is asked for. DEVICE/PRECISION without an EP names the
    target built for the device's default EP (the one without `ep:`), else any of them."""
    if wanted is None:
        return True
    device, precision, ep = target
    for w_device, w_precision, w_ep in wanted:
        if (w_device, w_precision) != (device, precision):
            continue
        if w_ep is not None:
            if w_ep == ep:
                return True
        elif ep is None or not any(d[:2] == target[:2] and d[2] is None for d in declared):
            return True
    return False


def expand(
    recipes: Sequence[Path | str],
    wanted: list[TargetKey] | None,
    base: TargetTask,
    declared: Callable[[str], Sequence[Sequence[str | None]]],
) -> tuple[list[TargetTask], list[TargetOutcome]]:
    """One task per recipe x declared target (filtered by `wanted`); a recipe that cannot
    even be read fails as one outcome of its own, the others go on."""
    tasks, failed = [], []
    matched: set[TargetKey] = set()
    for recipe in recipes:
        try:
            targets = declared(str(recipe))
        except WinmlError as exc:
            failed.append(
                TargetOutcome(
                    str(recipe), None, None, FAILED, exit_code=exc.exit_code, error=str(exc)
                )
            )
            continue
        keys = [_as_key(t) for t in targets]
        for key in keys:
            if _wants(wanted, key, keys):
                device, precision, ep = key
                matched.update({key, (device, precision, None)})
                tasks.append(
                    replace(base, recipe=str(recipe), device=device, precision=precision, ep=ep)
                )
    missing = [
        f"{d}/{p}" + (f"/{e}" if e else "") for d, p, e in wanted or [] if (d, p, e) not in matched
    ]
    if missing and not failed:
        raise RecipeError(f"--targets: no recipe declares {', '.join(missing)}")
    return tasks, failed


def plan_targets(
    tasks: Sequence[TargetTask],
) -> tuple[dict[int, Plan], dict[int, TargetOutcome]]:
    """Plan every target in the driver (the graph is cut from the plans); a target that
    cannot be planned, or whose steps on a source on disk exceed the memory budget, fails
    on its own."""
    from winml_recipes.engine.budget import resolve_budget
    from winml_recipes.engine.run import check_sources_fit
    from winml_recipes.exec.task import as_winml_error
    from winml_recipes.exec.work import plan_of

    plans, failed = {}, {}
    for index, task in enumerate(tasks):
        try:
            plan = plan_of(task, fresh=True)
            check_sources_fit(plan, resolve_budget(task.memory_budget))
            plans[index] = plan
        except Exception as exc:
            error = exc if isinstance(exc, WinmlError) else as_winml_error(exc)
            failed[index] = TargetOutcome(
                task.recipe,
                task.device,
                task.precision,
                FAILED,
                ep=task.ep,
                exit_code=error.exit_code,
                error=str(error),
            )
    return plans, failed


def run_tasks(
    tasks: Sequence[TargetTask],
    executor: Executor,
    *,
    keep_going: bool,
    failed_before: Sequence[TargetOutcome] = (),
    on_outcome: Callable[[TargetOutcome], None] | None = None,
    report_path: Path | None = None,
    raise_errors: bool = False,
) -> MatrixReport:
    """Plan `tasks`, cut the plans into a graph of tasks and run it. The report (also
    written to `report_path`, if given) holds one outcome per target in task order, after
    the recipes that failed before any task, and every task of the graph. Ctrl-C stops
    the executor, writes the report with the unfinished targets as not run, and
    re-raises."""
    from winml_recipes.exec.graph import STOPPED, TaskGraph
    from winml_recipes.exec.resources import TaskMemory

    outcomes: dict[int, TargetOutcome] = {}
    for outcome in failed_before:
        if on_outcome is not None:
            on_outcome(outcome)

    locks = TargetLocks()

    def done(index: int, outcome: TargetOutcome) -> None:
        locks.release(index)  # its output is final: another build of it may start
        outcomes[index] = outcome
        if on_outcome is not None:
            on_outcome(outcome)

    started = time.perf_counter()
    report = MatrixReport(executor.name, [])
    tasks, remove_store = _with_store(list(tasks))
    graph: TaskGraph | None = None
    try:
        plans, failed = plan_targets(tasks)
        locks.take(tasks, plans, failed)
        memory = {i: TaskMemory(tasks[i], plan) for i, plan in plans.items()}
        graph = TaskGraph(
            tasks,
            plans,
            keep_going=keep_going,
            on_target=done,
            memory=lambda i, _plan, comp, steps: (
                memory[i].of_steps(comp, steps) if comp else memory[i].of_assembly()
            ),
            raise_errors=raise_errors,
        )
        for index in sorted(failed):
            done(index, failed[index])
            if not keep_going:
                graph.stop(STOPPED)
        executor.run(graph)
        graph.settle(STOPPED)
    except KeyboardInterrupt:
        report.interrupted = True
        raise
    except WinmlError as exc:
        report.error = exc
        raise
    finally:
        locks.close()
        report.outcomes = [*failed_before] + [
            outcomes.get(i) or not_run(t, INTERRUPTED) for i, t in enumerate(tasks)
        ]
        report.tasks = graph.summary(len(failed_before)) if graph is not None else []
        report.wall_seconds = time.perf_counter() - started
        report.startup_seconds = executor.startup_seconds
        if remove_store is not None:
            remove_store()
        if report_path is not None:
            report.write(report_path)
    return report


class TargetLocks:
    """Each target's build lock, held by the driver from before its first task until its
    outcome: a second build of a target (another matrix, another `build`) waits, saying
    for whom, then reads the steps the first one stored. Free locks are taken first, then
    the busy ones within one --wait for all (never a wait per target); a target whose lock
    does not come fails alone (exit 2). Two targets of one matrix that would write one
    folder fail at once."""

    def __init__(self) -> None:
        self.held: dict[int, contextlib.ExitStack] = {}

    def take(
        self,
        tasks: Sequence[TargetTask],
        plans: dict[int, Plan],
        failed: dict[int, TargetOutcome],
    ) -> None:
        from winml_recipes.engine.run import output_dir_for

        outs = {i: output_dir_for(plan, Path(tasks[i].output_root)) for i, plan in plans.items()}
        first: dict[Path, int] = {}
        for index in sorted(outs):
            other = first.setdefault(outs[index].resolve(), index)
            if other != index:
                error = RecipeError(
                    f"{tasks[other].recipe} writes the same folder for the same target; "
                    "give the recipes different names",
                    where=tasks[index].recipe,
                )
                self._fail(index, tasks, plans, failed, error)
        busy = [i for i in sorted(plans, key=lambda i: str(outs[i])) if not self._lock(i, tasks,
                outs[i], plans, failed, 0.0)]  # fmt: skip
        started = time.monotonic()
        for index in busy:
            wait = max(0.0, tasks[index].wait_seconds - (time.monotonic() - started))
            self._lock(index, tasks, outs[index], plans, failed, wait, last_try=True)

    def _lock(self, index, tasks, out: Path, plans, failed, wait: float, last_try=False) -> bool:
        import sys

        from winml_recipes.engine.lock import exclusive
        from winml_recipes.engine.run import lock_path_for, recover_output
        from winml_recipes.sdk.errors import BuildLockedError

        task = tasks[index]
        stack = contextlib.ExitStack()
        try:
            stack.enter_context(
                exclusive(
                    lock_path_for(out, "build"),
                    out,
                    wait_seconds=wait,
                    on_wait=(lambda text: print(text, file=sys.stderr, flush=True))
                    if task.progress != "none" and last_try
                    else None,
                )
            )
            recover_output(out, task.wait_seconds)
        except BuildLockedError as exc:
            stack.close()
            if last_try:
                self._fail(index, tasks, plans, failed, exc)
            return False
        except WinmlError as exc:
            stack.close()
            self._fail(index, tasks, plans, failed, exc)
            return True
        self.held[index] = stack
        return True

    @staticmethod
    def _fail(index, tasks, plans, failed, exc: WinmlError) -> None:
        plan = plans.pop(index)
        task = tasks[index]
        failed[index] = TargetOutcome(
            task.recipe,
            plan.target.device,
            plan.target.precision,
            FAILED,
            ep=plan.target.ep or None,
            exit_code=exc.exit_code,
            error=str(exc),
            name=plan.recipe.name,
        )

    def release(self, index: int) -> None:
        stack = self.held.pop(index, None)
        if stack is not None:
            stack.close()

    def close(self) -> None:
        for index in list(self.held):
            self.release(index)


def _with_store(tasks: list[TargetTask]) -> tuple[list[TargetTask], Any]:
    """Tasks hand models to each other through the step cache; without the cache
    (--no-cache) a private store beside the outputs serves, held by a lock while the run
    lasts and removed after it (a store whose lock is free was left by a killed run and
    is swept). Returns the tasks and what removes the store (None: no store)."""
    if not tasks or all(t.use_cache for t in tasks):
        return tasks, None
    from winml_recipes.engine.lock import held_folder

    held = contextlib.ExitStack()
    store = held.enter_context(held_folder(Path(tasks[0].output_root), ".store-", ".store-*"))
    tasks = [t if t.use_cache else replace(t, cache_dir=str(store)) for t in tasks]
    return tasks, held.close
