"""The Ray executor: each target task is a Ray task on an existing cluster (`address`) or a
local one started here (and stopped at the end).

- Store: tasks read and write through the step cache folder they are given; on a cluster
  it must be a folder every worker sees (a shared mount), as must the recipes, catalog and
  output root. Paths are sent as the driver sees them; each task runs in the driver's
  working directory when that folder exists on its node, so relative paths (and the
  recipe path recorded in manifests) read the same as in a local build.
- Resources: each task asks for `memory=` its expected peak (exec/resources.py), so Ray
  never places two builds on a node that holds one; a task larger than the whole cluster
  fails at once (it would wait forever).
- Faults: a worker that dies (killed, out of memory) has its task retried up to
  `max_retries` times on another worker; the rebuild reads what the dead one stored, and
  its half-written staging folder is swept by the retry. A build that fails (bad input,
  a quality gate) is not retried: it fails alone, the others go on.
- Ctrl-C: every task is cancelled (KeyboardInterrupt inside the task, so its build
  unwinds and the output stays as it was), then force-cancelled after a grace period.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from winml_recipes.exec.executors import STOPPED, OnDone, worker_failed
from winml_recipes.exec.task import FAILED, TargetOutcome, TargetTask, not_run, run_target
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

    def run(self, tasks: Sequence[TargetTask], *, keep_going: bool, on_done: OnDone) -> None:
        ray = import_ray()
        started_here = self._connect(ray)
        try:
            self._run(ray, tasks, keep_going, on_done)
        finally:
            if started_here:
                ray.shutdown()

    def _run(self, ray, tasks: Sequence[TargetTask], keep_going: bool, on_done: OnDone) -> None:
        capacity = ray.cluster_resources().get("memory", 0.0)
        remote = ray.remote(_on_ray)
        threads = local_threads()
        refs = {}
        for index, task in enumerate(tasks):
            memory = int((task.memory_mb or 1024) * MB)
            if capacity and memory > capacity:
                on_done(index, _too_large(task, memory, capacity))
                continue
            ref = remote.options(
                num_cpus=1,
                memory=memory,
                max_retries=self.max_retries,
                retry_exceptions=False,
                name=f"build {task.label}",
            ).remote(task, threads)
            refs[ref] = index
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                outcome = self._outcome(ray, done[0], tasks[refs[done[0]]])
                on_done(refs[done[0]], outcome)
                if outcome.status == FAILED and not keep_going:
                    for ref in pending:
                        ray.cancel(ref)  # a queued task never starts; a running one stops
                    for ref in pending:
                        on_done(refs[ref], not_run(tasks[refs[ref]], STOPPED))
                    pending = []
        except KeyboardInterrupt:
            _cancel_all(ray, pending)
            raise

    @staticmethod
    def _outcome(ray, ref, task: TargetTask) -> TargetOutcome:
        try:
            return ray.get(ref)
        except ray.exceptions.RayError as exc:  # the worker died more often than retried
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            return worker_failed(task, f"{type(exc).__name__}: {first}")


def local_threads() -> int:
    """The intra-op threads torch uses in a plain process here: $OMP_NUM_THREADS, else the
    physical cores (torch's default)."""
    import psutil

    env = os.environ.get("OMP_NUM_THREADS", "")
    return int(env) if env.isdigit() and int(env) > 0 else psutil.cpu_count(logical=False) or 1


def _on_ray(task: TargetTask, threads: int) -> TargetOutcome:
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
    outcome = run_target(task)
    outcome.resources = dict(ray.get_runtime_context().get_assigned_resources())
    return outcome


def _too_large(task: TargetTask, memory: int, capacity: float) -> TargetOutcome:
    error = MemoryBudgetError(
        f"expects about {memory / MB / 1024:.1f} GB, more than the Ray cluster's "
        f"{capacity / MB / 1024:.1f} GB of memory; add a larger node or lower the build's "
        "memory (smaller calibration, fewer samples)",
        where=task.label,
    )
    return TargetOutcome(
        task.recipe, task.device, task.precision, FAILED, exit_code=2, error=str(error)
    )


def _cancel_all(ray, pending: list) -> None:
    if not pending:
        return
    for ref in pending:
        ray.cancel(ref, force=False)
    _, still = ray.wait(pending, num_returns=len(pending), timeout=CANCEL_GRACE_SECONDS)
    for ref in still:
        ray.cancel(ref, force=True)
