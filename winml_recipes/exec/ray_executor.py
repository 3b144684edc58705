"""The Ray executor: each task of the graph is a Ray task on an existing cluster
(`address`) or a local one started here (and stopped at the end).

- Store: tasks read and write through the step cache folder they are given; on a cluster
  it must be a folder every worker sees (a shared mount), as must the recipes, catalog and
  output root. Paths are sent as the driver sees them; each task runs in the driver's
  working directory when that folder exists on its node, so relative paths (and the
  recipe path recorded in manifests) read the same as in a local build.
- Edges: the driver hands Ray a task once the tasks it needs are done (exec/graph.py);
  what passes between them is a chain state that points into the store.
- Resources: each task asks for `memory=` its expected peak (exec/resources.py), so Ray
  never places two large steps on a node that holds one; a task larger than the whole
  cluster fails at once (it would wait forever).
- Faults: a worker that dies (killed, out of memory) has its task retried up to
  `max_retries` times on another worker; the rerun reads what the dead one stored, and its
  scratch folder is swept by the next task (its lock died with it). A step that fails
  (bad input, a quality gate) is not retried: its targets fail, the others go on.
- Ctrl-C: every task is cancelled (KeyboardInterrupt inside the task, so its step unwinds
  and the output stays as it was), then force-cancelled after a grace period.
"""

from __future__ import annotations

import os
import time

from winml_recipes.exec.executors import worker_failed
from winml_recipes.exec.graph import STOPPED, TaskGraph
from winml_recipes.exec.task import FAILED
from winml_recipes.exec.work import TaskResult
from winml_recipes.sdk.errors import MemoryBudgetError, RecipeError

MAX_RETRIES = 3
CANCEL_GRACE_SECONDS = 20.0
MB = 1024 * 1024


def import_ray():
    try:
        import ray
    except ImportError:
        raise RecipeError(
            "--executor ray needs Ray: pip install 'winml-recipes[ray]' (or ray==2.60.0)"
        ) from None
    return ray


class RayExecutor:
    name = "ray"

    def __init__(
        self, address: str | None = None, jobs: int | None = None, max_retries: int = MAX_RETRIES
    ) -> None:
        self.address = address
        self.jobs = jobs
        self.max_retries = max_retries
        self.startup_seconds = 0.0

    def _connect(self, ray) -> bool:
        """Join the cluster; True when this call started it (so the run stops it)."""
        if ray.is_initialized():
            return False
        started = time.perf_counter()
        options = {"include_dashboard": False, "log_to_driver": True}
        if self.address:
            ray.init(address=self.address, **options)
        else:
            ray.init(num_cpus=self.jobs or os.cpu_count() or 1, **options)
        self.startup_seconds = time.perf_counter() - started
        return True

    def run(self, graph: TaskGraph) -> None:
        ray = import_ray()
        started_here = self._connect(ray)
        try:
            self._run(ray, graph)
        finally:
            if started_here:
                ray.shutdown()

    def _run(self, ray, graph: TaskGraph) -> None:
        """Every ready task goes to Ray at once (Ray queues it until a node has the CPU and
        memory it asks for); results are handed to the graph as they arrive."""
        capacity = largest_node_memory(ray)
        remote = ray.remote(_on_ray)
        threads = local_threads()
        refs: dict = {}
        try:
            while True:
                for node in graph.ready():
                    if graph.stopped:  # a task before it failed, without keep-going
                        graph.cancelled(node, STOPPED)
                        continue
                    memory = int((node.memory_mb or 1024) * MB)
                    if capacity and memory > capacity:
                        graph.finish(node, _too_large(node.label, memory, capacity))
                        continue
                    fn, arg = graph.call(node)
                    ref = remote.options(
                        num_cpus=1,
                        memory=memory,
                        max_retries=self.max_retries,
                        retry_exceptions=False,
                        name=node.label,
                    ).remote(fn, arg, threads)
                    refs[ref] = node
                if graph.stopped:
                    self._stop(ray, graph, refs)
                    return
                if not refs:
                    return
                (ref,), _ = ray.wait(list(refs), num_returns=1)
                graph.finish(refs.pop(ref), self._result(ray, ref))
        except KeyboardInterrupt:
            _cancel_all(ray, list(refs))
            raise

    def _stop(self, ray, graph: TaskGraph, refs: dict) -> None:
        """After a failure without keep-going: results already there count; the rest are
        cancelled (a queued task never starts, a running one unwinds) and waited for, so
        nothing still writes when the run ends."""
        if not refs:
            return
        finished, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0)
        for ref in finished:
            graph.finish(refs.pop(ref), self._result(ray, ref))
        _cancel_all(ray, list(refs))
        for node in refs.values():
            graph.cancelled(node, STOPPED)
        refs.clear()

    @staticmethod
    def _result(ray, ref) -> TaskResult:
        try:
            return ray.get(ref)
        except ray.exceptions.RayError as exc:  # the worker died more often than retried
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            return worker_failed(f"{type(exc).__name__}: {first}")


def largest_node_memory(ray) -> float:
    """The most memory one live node offers Ray (bytes): a task asking for more would wait
    forever."""
    sizes = [n.get("Resources", {}).get("memory", 0.0) for n in ray.nodes() if n.get("Alive")]
    return max(sizes, default=0.0) or ray.cluster_resources().get("memory", 0.0)


def local_threads() -> int:
    """The intra-op threads torch uses in a plain process here: $OMP_NUM_THREADS, else the
    physical cores (torch's default)."""
    import psutil

    env = os.environ.get("OMP_NUM_THREADS", "")
    return int(env) if env.isdigit() and int(env) > 0 else psutil.cpu_count(logical=False) or 1


def _on_ray(fn, arg, threads: int) -> TaskResult:
    """The Ray task: build with torch on the driver's thread count, and record what Ray
    granted it (CPU, memory in bytes).

    Ray sets OMP_NUM_THREADS to the task's CPUs (1), so torch would run single-threaded;
    torch's float sums then differ in the last bits from a local build's, and so would the
    export's measured parity with torch in the manifest (the model bytes do not change).
    """
    import sys

    import ray

    os.environ["OMP_NUM_THREADS"] = str(threads)  # read when torch is first imported
    if "torch" in sys.modules:  # a worker that ran an export before
        sys.modules["torch"].set_num_threads(threads)
    result = fn(arg)
    result.resources = dict(ray.get_runtime_context().get_assigned_resources())
    return result


def _too_large(label: str, memory: int, capacity: float) -> TaskResult:
    error = MemoryBudgetError(
        f"expects about {memory / MB / 1024:.1f} GB, more than the largest Ray node's "
        f"{capacity / MB / 1024:.1f} GB of memory; add a larger node or lower the build's "
        "memory (smaller calibration, fewer samples)",
        where=label,
    )
    return TaskResult(FAILED, error=str(error), exit_code=error.exit_code)


def _cancel_all(ray, pending: list) -> None:
    """Cancel what has not finished (a KeyboardInterrupt inside each), then force what is
    still running after a grace period. A task that already finished is left alone: Ray
    2.60's driver can abort ("Tried to complete task that was not pending") when a cancel
    crosses the reply of a task that just ended."""
    if not pending:
        return
    _, running = ray.wait(pending, num_returns=len(pending), timeout=0)
    if not running:
        return
    for ref in running:
        ray.cancel(ref, force=False)
    _, still = ray.wait(running, num_returns=len(running), timeout=CANCEL_GRACE_SECONDS)
    for ref in still:
        ray.cancel(ref, force=True)
