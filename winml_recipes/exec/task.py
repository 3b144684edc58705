"""One target of a matrix (a recipe for a device and precision) and what became of it.

A target carries only plain values (paths as strings), so it pickles to a pool process or
a Ray worker unchanged; the graph (exec/graph.py) cuts its plan into tasks whose inputs
and outputs go through the content-addressed step cache (the store every worker shares)
and the output folder, never through a worker's memory. The outcome is plain data as
well: status, the failing step, the one-line error, and where the manifest is.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from winml_recipes.sdk.errors import InternalError, WinmlError

OK, FAILED, NOT_RUN = "ok", "failed", "not run"
EXIT_OK = 0


@dataclass(frozen=True)
class TargetTask:
    """Build `recipe` for `device`/`precision` (None: the recipe's first target) and `ep`
    (an EP plugin's key, for a target the recipe builds for another EP than the device's)."""

    recipe: str
    device: str | None = None
    precision: str | None = None
    ep: str | None = None
    defines: dict[str, Any] = field(default_factory=dict)
    catalog_dir: str | None = None
    source: str | None = None
    output_root: str = "build"
    cache_dir: str | None = None
    use_cache: bool = True
    wait_seconds: float = 600.0
    memory_budget: str | float | None = None
    progress: str = "none"  # "stdout", "stderr", "rich" (a terminal, local only) or "none"
    memory_mb: float | None = None  # what the task expects to need (a scheduling hint)
    cwd: str | None = None  # the driver's working directory (relative paths resolve there)

    @property
    def target(self) -> str:
        return _label(self.device, self.precision, self.ep)

    def plan(self, *, fetch: bool = True):
        """Load the recipe for this target and plan it (fetch=False: no downloads)."""
        from pathlib import Path

        from winml_recipes.engine.plan import make_plan
        from winml_recipes.recipe import load_recipe

        recipe = load_recipe(
            self.recipe,
            device=self.device,
            precision=self.precision,
            defines=self.defines,
            catalog_dir=Path(self.catalog_dir) if self.catalog_dir else None,
            source=self.source,
            ep=self.ep,
        )
        return make_plan(recipe, fetch=fetch)


@dataclass
class TargetOutcome:
    """What became of one task (plain data: it crosses process boundaries and lands in the
    JSON report as it is)."""

    recipe: str
    device: str | None
    precision: str | None
    status: str  # ok, failed, not run
    exit_code: int = EXIT_OK
    error: str | None = None
    failing_step: str | None = None  # component/step
    wall_seconds: float = 0.0
    output_dir: str | None = None
    manifest_path: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    name: str | None = None  # the recipe's name (from its manifest)
    worker_pid: int | None = None
    started_at: float | None = None  # epoch seconds on the worker (a timeline of the run)
    finished_at: float | None = None
    resources: dict[str, float] = field(default_factory=dict)  # what a scheduler granted
    error_data: dict[str, Any] = field(default_factory=dict)  # the error's detail (bisection)
    evidence_dir: str | None = None  # failed: the `.failed` folder with what it made so far
    ep: str | None = None  # the EP the recipe named for the target (None: the device's)

    @property
    def target(self) -> str:
        return _label(self.device, self.precision, self.ep)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _label(device: str | None, precision: str | None, ep: str | None) -> str:
    """device/precision[/ep], as messages name a target."""
    if not device:
        return "default target" + (f" for {ep}" if ep else "")
    return f"{device}/{precision}" + (f"/{ep}" if ep else "")


def not_run(task: TargetTask, why: str) -> TargetOutcome:
    return TargetOutcome(task.recipe, task.device, task.precision, NOT_RUN, error=why, ep=task.ep)


def as_winml_error(exc: Exception) -> WinmlError:
    """OSError (a path not writable, ...) is the user's to fix (exit 2); anything else is a
    bug (exit 1). Both as one line."""
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        return WinmlError(f"{where}{exc.strerror or exc}")  # exit 2
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    return InternalError(f"{type(exc).__name__}: {first}")


def key_metrics(manifest: dict[str, Any]) -> dict[str, Any]:
    """What a summary row shows: size shipped, the lowest verified SQNR, steps run/cached."""
    from winml_recipes.sdk.records import Manifest

    m = Manifest.from_json(manifest)
    size = sum(c.artifact.size_bytes for c in m.components.values() if c.artifact is not None)
    sqnrs = [
        met["sqnr_db"]
        for _, s in m.steps()
        if s.verified
        for met in (s.measured.get("outputs") or {}).values()
        if isinstance(met, dict) and met.get("sqnr_db") is not None
    ]
    statuses = [s.status for _, s in m.steps()]
    return {
        "size_mb": round(size / 1e6, 3),
        "min_sqnr_db": round(min(sqnrs), 2) if sqnrs else None,
        "steps_ran": statuses.count("ran"),
        "steps_cached": statuses.count("cached"),
        "build_seconds": m.wall_seconds,
    }
