"""Executors run target tasks: `local` (this process, one after another), `pool` (N
processes on this machine) and `ray` (a Ray cluster, see ray_executor.py).

Every executor reports each outcome through `on_done(index, outcome)` as it arrives, so
the matrix driver holds every finished result when a Ctrl-C stops the rest. Without
`keep_going` the first failure stops the tasks not yet started (they are reported as
not run); tasks already running finish.
"""

from __future__ import annotations

import os
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


STOP_GRACE_SECONDS = 30.0
# As many as Ray gets (ray_executor.MAX_RETRIES): a task whose worker died runs again.
MAX_WORKER_RETRIES = 3


class PoolExecutor:
    """`jobs` worker processes on this machine (spawned, so nothing of the parent's state,
    threads or locks is inherited; the same on Windows). Ctrl-C reaches the driver (the
    workers ignore SIGINT), which stops the workers once, gracefully (see `_stop`)."""

    name = "pool"
    startup_seconds = 0.0

    def __init__(self, jobs: int) -> None:
        self.jobs = max(1, jobs)

    def run(self, tasks: Sequence[TargetTask], *, keep_going: bool, on_done: OnDone) -> None:
        """Each round runs on a fresh pool; the tasks of a pool whose worker died (killed,
        out of memory) run again on the next one, up to MAX_WORKER_RETRIES times each. The
        rebuild reads what the dead worker had already stored in the cache."""
        retries = dict.fromkeys(range(len(tasks)), 0)
        todo = list(range(len(tasks)))
        while todo:
            todo = self._round(tasks, todo, retries, keep_going, on_done)

    def _round(
        self,
        tasks: Sequence[TargetTask],
        indices: list[int],
        retries: dict[int, int],
        keep_going: bool,
        on_done: OnDone,
    ) -> list[int]:
        """Run `indices` on one pool; returns those to run again (their worker died)."""
        import multiprocessing
        from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

        pool = ProcessPoolExecutor(
            self.jobs,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_worker_setup,
        )
        futures = {pool.submit(_pool_task, tasks[i]): i for i in indices}
        pending = set(futures)
        again: list[int] = []
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                failed = False
                for future in done:
                    index = futures[future]
                    if _worker_died(future) and retries[index] < MAX_WORKER_RETRIES:
                        retries[index] += 1
                        again.append(index)
                        continue
                    outcome = _result(future, tasks[index])
                    on_done(index, outcome)
                    failed |= outcome.status == FAILED
                if failed and not keep_going:
                    for index in again:
                        on_done(index, not_run(tasks[index], STOPPED))
                    again = []
                    for future in sorted(pending, key=futures.__getitem__):
                        index = futures[future]
                        if future.cancel():
                            on_done(index, not_run(tasks[index], STOPPED))
                        else:  # already running: let it finish
                            on_done(index, _result(future, tasks[index]))
                    pending = set()
        except KeyboardInterrupt:
            _stop(pool, list(futures))
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        return sorted(again)


def _worker_died(future) -> bool:
    """The pool broke under this task: a worker process ended without answering."""
    from concurrent.futures.process import BrokenProcessPool

    return not future.cancelled() and isinstance(future.exception(), BrokenProcessPool)


def _result(future, task: TargetTask) -> TargetOutcome:
    try:
        return future.result()
    except Exception as exc:  # BrokenProcessPool: a worker died
        return worker_failed(task, f"worker process failed: {exc}")


_running = False


def _on_terminate(signum: int, frame: object) -> None:
    """SIGTERM from the driver: a running build unwinds like Ctrl-C (its staging folder is
    removed, the output stays as it was); an idle worker exits."""
    if _running:
        raise KeyboardInterrupt
    raise SystemExit(0)


def _worker_setup() -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver decides what Ctrl-C stops
    if hasattr(signal, "SIGTERM") and os.name != "nt":
        signal.signal(signal.SIGTERM, _on_terminate)


def _pool_task(task: TargetTask) -> TargetOutcome:
    global _running
    _running = True
    try:
        return run_target(task)
    finally:
        _running = False


def _stop(pool, futures: list) -> None:
    """Cancel what has not started; terminate every worker once (a graceful unwind on
    POSIX, see _on_terminate; TerminateProcess on Windows), wait for the running builds to
    unwind, then end the stragglers. Outputs are swapped in whole either way, and the next
    build sweeps any staging folder left behind.

    concurrent.futures has no public handle on its processes before Python 3.14
    (`terminate_workers`); its process table is used, and absent it nothing is terminated.
    """
    from concurrent.futures import wait

    for future in futures:
        future.cancel()
    processes = list(getattr(pool, "_processes", {}).values())
    for process in processes:
        if process.is_alive():
            process.terminate()
    wait([f for f in futures if not f.done()], timeout=STOP_GRACE_SECONDS)
    for process in processes:
        if process.is_alive():
            process.terminate()  # idle now: exits
        process.join(timeout=5)
        if process.is_alive():
            process.kill()
