"""Executors run the tasks of a graph (exec/graph.py): `local` (this process, one task
after another), `pool` (N processes on this machine) and `ray` (a Ray cluster, see
ray_executor.py).

An executor only moves tasks: it asks the graph for the tasks that are ready, runs
`graph.call(task)` where it likes, and hands each result to `graph.finish`, which
reports targets as they end and stops the rest after a failure (without keep-going).
A task whose worker died runs again, up to MAX_WORKER_RETRIES times.
"""

from __future__ import annotations

import os
from typing import Any, Protocol

from winml_recipes.exec.graph import STOPPED, Node, TaskGraph
from winml_recipes.exec.work import TaskResult

# As many as Ray gets (ray_executor.MAX_RETRIES): a task whose worker died runs again.
MAX_WORKER_RETRIES = 3
STOP_GRACE_SECONDS = 30.0


class Executor(Protocol):
    name: str
    startup_seconds: float  # time to reach workers that can run a task (Ray's start-up)

    def run(self, graph: TaskGraph) -> None:
        """Run the graph's tasks until none is left to start."""
        ...


class LocalExecutor:
    """Today's behaviour: one task after another in this process, a target's tasks before
    the next target's."""

    name = "local"
    startup_seconds = 0.0

    def run(self, graph: TaskGraph) -> None:
        while ready := graph.ready(limit=1):
            (node,) = ready
            fn, arg = graph.call(node)
            graph.finish(node, fn(arg))


def worker_failed(what: str) -> TaskResult:
    """A task whose worker died or could not run it: a fault of the machinery, exit 1."""
    return TaskResult("failed", error=what[:500], exit_code=1)


class PoolExecutor:
    """`jobs` worker processes on this machine (spawned, so nothing of the parent's state,
    threads or locks is inherited; the same on Windows). At most `jobs` tasks are taken
    from the graph at once, so after a failure (without keep-going) only the running ones
    finish. Ctrl-C reaches the driver (the workers ignore SIGINT), which stops the workers
    once, gracefully (see `_stop`)."""

    name = "pool"
    startup_seconds = 0.0

    def __init__(self, jobs: int) -> None:
        self.jobs = max(1, jobs)

    def run(self, graph: TaskGraph) -> None:
        """Tasks of a pool whose worker died (killed, out of memory) run again on a fresh
        pool; the rerun reads what the dead worker had already stored in the cache."""
        retry: list[Node] = []
        while True:
            retry = self._pool(graph, retry)
            if not retry:
                return

    def _pool(self, graph: TaskGraph, retry: list[Node]) -> list[Node]:
        """Run tasks on one pool until the graph is done or the pool breaks; returns the
        tasks to run again on a fresh pool."""
        import multiprocessing
        from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

        pool = ProcessPoolExecutor(
            self.jobs,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_worker_setup,
        )
        futures: dict[Any, Node] = {}
        queue = list(retry)  # tasks of a broken pool, to run first
        try:
            while True:
                if graph.stopped:  # a failure without keep-going: nothing more starts
                    for node in queue:
                        graph.cancelled(node, STOPPED)
                    queue = []
                free = self.jobs - len(futures) - len(queue)
                queue += graph.ready(limit=free) if free > 0 else []
                while queue and len(futures) < self.jobs:
                    node = queue.pop(0)
                    fn, arg = graph.call(node)
                    futures[pool.submit(_pool_task, fn, arg)] = node
                if not futures:
                    return []
                done, _ = wait(list(futures), return_when=FIRST_COMPLETED)
                if not any(_worker_died(f) for f in done):
                    for future in done:
                        graph.finish(futures.pop(future), _result(future))
                    continue
                # The pool is broken: every task on it ended. Those that answered keep
                # their result; the others run again on a fresh pool.
                wait(list(futures))
                again: list[Node] = []
                for future, node in futures.items():
                    if _worker_died(future):
                        again += _again(graph, node, future)
                    else:
                        graph.finish(node, _result(future))
                futures = {}
                return again + queue
        except KeyboardInterrupt:
            _stop(pool, list(futures))
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


def _again(graph: TaskGraph, node: Node, future) -> list[Node]:
    """A task whose pool broke runs again, unless it has been tried too often."""
    if node.attempts <= MAX_WORKER_RETRIES:
        node.attempts += 1
        return [node]
    exc = future.exception() if future.done() else "the pool broke"
    graph.finish(node, worker_failed(f"worker process failed {node.attempts} times: {exc}"))
    return []


def _worker_died(future) -> bool:
    """The pool broke under this task: a worker process ended without answering."""
    from concurrent.futures.process import BrokenProcessPool

    return not future.cancelled() and isinstance(future.exception(), BrokenProcessPool)


def _result(future) -> TaskResult:
    try:
        return future.result()
    except Exception as exc:  # the task could not be sent or its result not returned
        return worker_failed(f"worker process failed: {type(exc).__name__}: {exc}")


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


def _pool_task(fn, arg) -> TaskResult:
    global _running
    _running = True
    try:
        return fn(arg)
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
