"""Executors run target tasks: `local` (this process, one after another), `pool` (N
processes on this machine) and `ray` (a Ray cluster, see ray_executor.py).

Every executor reports each outcome through `on_done(index, outcome)` as it arrives, so
the matrix driver holds every finished result when a Ctrl-C stops the rest. Without
`keep_going` the first failure stops the tasks not yet started (they are reported as
not run); tasks already running finish.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from winml_recipes.exec.task import FAILED, TargetOutcome, TargetTask, not_run, run_target

OnDone = Callable[[int, TargetOutcome], None]
STOPPED = "not started: an earlier target failed (--keep-going builds every target)"


class Executor(Protocol):
    name: str
    startup_seconds: float  # time to reach workers that can run a task (Ray's start-up)

    def run(self, tasks: Sequence[TargetTask], *, keep_going: bool, on_done: OnDone) -> None:
        """Run every task; report each outcome through `on_done` as it arrives."""
        ...


class LocalExecutor:
    """Today's behaviour: one target after another in this process."""

    name = "local"
    startup_seconds = 0.0

    def __init__(self, raise_errors: bool = False) -> None:
        self.raise_errors = raise_errors

    def run(self, tasks: Sequence[TargetTask], *, keep_going: bool, on_done: OnDone) -> None:
        stopped = False
        for index, task in enumerate(tasks):
            if stopped:
                on_done(index, not_run(task, STOPPED))
                continue
            outcome = run_target(task, raise_errors=self.raise_errors)
            on_done(index, outcome)
            stopped = outcome.status == FAILED and not keep_going


def worker_failed(task: TargetTask, what: str) -> TargetOutcome:
    """A task whose worker died or could not run it: a fault of the machinery, exit 1."""
    return TargetOutcome(
        task.recipe, task.device, task.precision, FAILED, exit_code=1, error=what[:500]
    )


class PoolExecutor:
    """`jobs` worker processes on this machine (spawned, so nothing of the parent's state,
    threads or locks is inherited; the same on Windows)."""

    name = "pool"
    startup_seconds = 0.0

    def __init__(self, jobs: int) -> None:
        self.jobs = max(1, jobs)

    def run(self, tasks: Sequence[TargetTask], *, keep_going: bool, on_done: OnDone) -> None:
        import multiprocessing
        from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

        pool = ProcessPoolExecutor(self.jobs, mp_context=multiprocessing.get_context("spawn"))
        futures = {pool.submit(run_target, task): i for i, task in enumerate(tasks)}
        pending = set(futures)
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                failed = False
                for future in done:
                    index = futures[future]
                    try:
                        outcome = future.result()
                    except Exception as exc:  # BrokenProcessPool: a worker died
                        outcome = worker_failed(tasks[index], f"worker process failed: {exc}")
                    on_done(index, outcome)
                    failed |= outcome.status == FAILED
                if failed and not keep_going:
                    for future in sorted(pending, key=futures.__getitem__):
                        index = futures[future]
                        if future.cancel():
                            on_done(index, not_run(tasks[index], STOPPED))
                        else:  # already running: let it finish
                            on_done(index, _result(future, tasks[index]))
                    pending = set()
        except KeyboardInterrupt:
            _terminate_workers(pool)
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


def _result(future, task: TargetTask) -> TargetOutcome:
    try:
        return future.result()
    except Exception as exc:
        return worker_failed(task, f"worker process failed: {exc}")


def _terminate_workers(pool) -> None:
    """Stop the workers now: their builds stop before the output swap or after it (the
    swap defers termination), never between; staging folders are swept by the next build.

    concurrent.futures has no public way to do this before Python 3.14
    (`terminate_workers`); its process table is the only handle.
    """
    terminate = getattr(pool, "terminate_workers", None)
    if terminate is not None:
        terminate()
        return
    for process in list(getattr(pool, "_processes", {}).values()):
        if process.is_alive():
            process.terminate()
    for process in list(getattr(pool, "_processes", {}).values()):
        process.join(timeout=30)
