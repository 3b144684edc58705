"""Run a plan: cache lookups, passes, atomic output, graph digests and the manifest."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

import winml_recipes
from winml_recipes.copyfile import copy_unshared
from winml_recipes.engine.cache import LOCKS, StepCache, default_cache_dir, library_versions
from winml_recipes.engine.identity import contract_key, identify
from winml_recipes.engine.lock import exclusive
from winml_recipes.engine.plan import ComponentPlan, Plan, PlannedStep
from winml_recipes.finitejson import dumps_finite
from winml_recipes.sdk.contract import IOContract
from winml_recipes.sdk.errors import InternalError, PassError, WinmlError
from winml_recipes.sdk.passes import model_file, pass_making, sample_inputs_of
from winml_recipes.sdk.records import (
    SCHEMA_VERSION,
    ArtifactRecord,
    ComponentRecord,
    ContractRecord,
    FileRecord,
    Manifest,
    RecipeRecord,
    ReferenceRecord,
    ShippedRecord,
    SourceRecord,
    StepRecord,
    TargetRecord,
    ToolRecord,
    from_json,
)
from winml_recipes.sdk.types import StepContext, StepResult, UpstreamComponent

MANIFEST = "manifest.json"
OUTPUT_LOCKS = "outputs"  # <cache>/locks/outputs/: one lock per output folder
GRAPH_DIGEST = "graph.yaml"
# The float model each component's build was verified against, shipped beside the build
# (not inside the component's deployable folder) so `run` and the report can compare with
# it after the cache is gone, on another machine, without the recipe.
REFERENCE_DIR = "float-reference"
FAILED_SUFFIX = ".failed"  # build/<recipe>/<device>-<precision>.failed: a failed build's evidence
# The attribute of a step's exception that carries the chains so far (component -> records
# with the failed step's, and the state before it): what a failed build keeps.
EVIDENCE = "evidence_chains"

Chains = dict[str, "tuple[list[StepRecord], ChainState]"]


class Reporter:
    """Progress callbacks; the default reports nothing."""

    def step_started(self, component: str, step: PlannedStep) -> None: ...
    def step_progress(
        self, component: str, step: PlannedStep, what: str, done: int, total: int | None
    ) -> None: ...
    def step_finished(self, component: str, step: PlannedStep, record: StepRecord) -> None: ...
    def message(self, text: str) -> None: ...


@dataclass
class BuildResult:
    output_dir: Path
    manifest: dict[str, Any]  # as written to manifest.json
    models: dict[str, Path] = field(default_factory=dict)
    notes: tuple[str, ...] = ()  # lines for the person who built it (e.g. the task chosen)

    @property
    def record(self) -> Manifest:
        """The manifest as typed records."""
        return Manifest.from_json(self.manifest)


@dataclass(frozen=True)
class ChainState:
    """Where a component's chain stands between two steps: each step gets one and returns
    the next (nothing is changed in place, so a step's record and its input agree)."""

    model: Path | None
    digest: str
    reference: Path | None
    reference_digest: str | None
    artifacts: tuple[Path, ...] = ()  # shipped beside the model
    ship_model: bool = True
    # The model a sample-input step (Pass.sample_inputs, e.g. calibration) ran, and its digest.
    calibrated: tuple[Path, str] | None = None
    # The model a judging step (Pass.judges_candidate, verify) ran, and its digest.
    judged: tuple[Path, str] | None = None

    def after(self, model: Path | None, digest: str | None, produces_reference: bool) -> ChainState:
        """The state after a step that wrote `model` (None: it wrote none, nothing changes)."""
        if model is None or digest is None:
            return self
        state = replace(self, model=model, digest=digest, artifacts=(), ship_model=True)
        if produces_reference:
            state = replace(state, reference=model, reference_digest=digest)
        return state


def output_dir_for(plan: Plan, root: Path) -> Path:
    return root / plan.recipe.name / str(plan.target)


def run_plan(
    plan: Plan,
    *,
    output_root: Path = Path("build"),
    cache: StepCache | None = None,
    reporter: Reporter | None = None,
    wait_seconds: float = 600.0,
    memory_budget: str | float | None = None,
) -> BuildResult:
    """Build every component; the output directory changes only when all steps succeed.

    `memory_budget` (MB, or "12GB"; default: $WINML_RECIPES_MEMORY_BUDGET, else physical
    memory minus headroom): every step whose estimate exceeds it stops the build before
    anything runs (sources on disk) or before the step starts (models made by the build).
    """
    from winml_recipes.engine.budget import resolve_budget

    cache = cache or StepCache()
    reporter = reporter or Reporter()
    budget_mb = resolve_budget(memory_budget)
    check_sources_fit(plan, budget_mb)
    for note in plan.notes:
        reporter.message(f"note: {note}")

    def build(staging: Path) -> dict[str, tuple[list[StepRecord], ChainState]]:
        # Fail-fast checks first: every component's steps up to its last fail-fast step
        # (ComponentPlan.checked_first), then the rest in dependency order.
        chains: Chains = {c.name: ([], begin_chain(c)) for c in plan.components}
        built: dict[str, UpstreamComponent | None] = {}
        phases = [
            [(c, c.steps[: c.checked_first]) for c in plan.components if c.checked_first],
            [(c, c.steps[c.checked_first :]) for c in plan.components],
        ]
        for comp, steps in (item for phase in phases for item in phase):
            before, state = chains[comp.name]
            try:
                records, state = run_steps(
                    comp, steps, plan, staging / ".work", cache, state, built, budget_mb,
                    reporter,
                )  # fmt: skip
            except Exception as exc:
                # what every component made so far is evidence too
                failed = {n: (before + r, s) for n, (r, s) in getattr(exc, EVIDENCE, {}).items()}
                made = {n: chain for n, chain in chains.items() if chain[0]}
                setattr(exc, EVIDENCE, {**made, **failed})
                raise
            chains[comp.name] = (before + records, state)
            if len(chains[comp.name][0]) == len(comp.steps):
                built[comp.name] = upstream_of(comp, state)
        return chains

    try:
        return write_output(plan, output_root, build, reporter, wait_seconds, budget_mb=budget_mb)
    finally:
        cache.release_claims()  # keys a failed step claimed: the next build computes them


ChainBuilder = Callable[[Path], "dict[str, tuple[list[StepRecord], ChainState]]"]


def write_output(
    plan: Plan,
    output_root: Path,
    chains_of: ChainBuilder,
    reporter: Reporter,
    wait_seconds: float = 600.0,
    wall_seconds: float | None = None,
    budget_mb: float | None = None,
) -> BuildResult:
    """Under the target's lock: `chains_of(staging)` gives each component's step records
    and final state (by running the steps, or from steps another process ran), which are
    shipped into a staging folder with the manifest and swapped into place at once.

    A step that fails leaves the previous output as it was; what the build had made so
    far goes to `<output>.failed/` (see `keep_evidence`), named in the error. A build that
    succeeds removes its target's `.failed/`."""
    out_dir = output_dir_for(plan, output_root)
    with exclusive(
        lock_path_for(out_dir), out_dir, wait_seconds=wait_seconds, on_wait=reporter.message
    ):
        _sweep_stale(out_dir)
        staging = out_dir.parent / f".staging-{out_dir.name}-{os.getpid()}"
        staging.mkdir(parents=True)
        try:
            started = time.perf_counter()
            try:
                chains = chains_of(staging)
            except WinmlError as exc:
                evidence = getattr(exc, EVIDENCE, None)
                if evidence:
                    _note_evidence(exc, plan, out_dir, staging, evidence,
                                   time.perf_counter() - started)  # fmt: skip
                raise
            wall = time.perf_counter() - started if wall_seconds is None else wall_seconds
            manifest, models = _assemble(plan, chains, staging, wall)
            shutil.rmtree(staging / ".work", ignore_errors=True)
            _swap_into_place(staging, out_dir)
            shutil.rmtree(failed_dir_for(out_dir), ignore_errors=True)  # superseded
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        _write_report(out_dir, reporter, budget_mb)
    final = {name: out_dir / p.relative_to(staging) for name, p in models.items()}
    return BuildResult(out_dir, manifest, final)


def _write_report(out_dir: Path, reporter: Reporter | None, budget_mb: float | None = None) -> None:
    """report.html beside the manifest; a report that cannot be made never fails the build
    nor hides its error (its sections say what they could not compute; `winml-recipes
    report` retries)."""
    from winml_recipes.report import write_report

    try:
        write_report(out_dir, budget_mb=budget_mb)
    except Exception as exc:  # say why there is no report, go on
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        if reporter is not None:
            reporter.message(
                f"report.html not written: {first}; run `winml-recipes report {out_dir}`"
            )


def failed_dir_for(out_dir: Path) -> Path:
    """Where a failed build of the target at `out_dir` keeps its evidence."""
    return out_dir.with_name(out_dir.name + FAILED_SUFFIX)


def _assemble(
    plan: Plan,
    chains: Chains,
    staging: Path,
    wall: float,
    failure: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, Path]]:
    """Ship the components of `chains` into `staging` (catalog order) and write the
    manifest there (`failure`: the failed build's status, error and failing step)."""
    components: dict[str, ComponentRecord] = {}
    models: dict[str, Path] = {}
    for comp in plan.components:
        if comp.name not in chains:
            continue
        records, state = chains[comp.name]
        if failure is not None and state.digest == comp.source.digest:
            state = replace(state, model=None)  # nothing made yet: its source is not evidence
        components[comp.name], model = ship_component(
            comp, records, state, staging, partial=failure is not None
        )
        if model is not None:
            models[comp.name] = model
    order = [c.name for c in plan.recipe.catalog.components.values()]
    components = {n: components[n] for n in order if n in components}
    manifest = replace(_manifest(plan, components, wall), **(failure or {"status": "ok"}))
    data = manifest.to_json()
    (staging / MANIFEST).write_text(dumps_finite(data, MANIFEST, indent=2) + "\n")
    return data, models


def keep_evidence(
    plan: Plan,
    output_root: Path,
    chains: Chains,
    error: str,
    wall: float,
    wait_seconds: float = 600.0,
) -> Path:
    """Write a failed build's evidence (`chains`: each component's records, the failed
    step's last, and its last state) to `<output>.failed/`, under the target's output
    lock, replacing an older one; the good output is not touched. Returns the folder."""
    out_dir = output_dir_for(plan, output_root)
    with exclusive(lock_path_for(out_dir), out_dir, wait_seconds=wait_seconds):
        _sweep_stale(out_dir)
        staging = out_dir.parent / f".staging-{out_dir.name}-{os.getpid()}"
        staging.mkdir(parents=True)
        try:
            return _write_evidence(plan, out_dir, staging, chains, error, wall)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def _write_evidence(
    plan: Plan, out_dir: Path, staging: Path, chains: Chains, error: str, wall: float
) -> Path:
    failing = next(
        (f"{name}/{r.pass_name}" for name, (records, _) in chains.items() for r in records
         if r.status == "failed"),
        None,
    )  # fmt: skip
    failure = {"status": "failed", "error": error, "failing_step": failing}
    _assemble(plan, chains, staging, wall, failure)
    shutil.rmtree(staging / ".work", ignore_errors=True)
    failed = failed_dir_for(out_dir)
    _swap_into_place(staging, failed)
    _write_report(failed, None)  # the evidence's page: what ran, what failed, and why
    return failed


def _note_evidence(
    exc: WinmlError, plan: Plan, out_dir: Path, staging: Path, chains: Chains, wall: float
) -> None:
    """Keep the evidence of a build that failed with `exc` (its output lock held) and name
    the folder in the error; a failure to keep it is said, never hides `exc`."""
    try:
        kept = _write_evidence(plan, out_dir, staging, chains, str(exc), wall)
    except Exception as why:  # the build's own error matters more
        exc.message += f"; no evidence kept ({type(why).__name__}: {why})"
    else:
        exc.message += f"; evidence kept in {kept}/"


def lock_path_for(out_dir: Path, what: str = "output") -> Path:
    """A lock per output directory, kept outside it so a failed build leaves nothing there:
    `output` guards writing the folder, `build` a whole build of the target (held by the
    process that runs it while its steps run elsewhere). Locks live in the cache folder
    (the user's own, like everything else the tool keeps), never in a shared temp folder."""
    import hashlib

    key = hashlib.sha256(str(out_dir.resolve()).encode()).hexdigest()[:32]
    suffix = "" if what == "output" else f".{what}"
    return default_cache_dir() / LOCKS / OUTPUT_LOCKS / f"{key}{suffix}.lock"


def recover_output(out_dir: Path, wait_seconds: float = 600.0) -> None:
    """Before a build that writes `out_dir` only at its end: put back the output an
    interrupted swap took away, and sweep leftovers (the target's output lock held)."""
    if not out_dir.parent.is_dir():
        return
    with exclusive(lock_path_for(out_dir), out_dir, wait_seconds=wait_seconds):
        _sweep_stale(out_dir)


def _sweep_stale(out_dir: Path) -> None:
    """Clean up after interrupted builds: this target's (we hold its lock), and the other
    targets' of the same recipe whose lock is free (no build of theirs is running)."""
    import re

    from filelock import FileLock, Timeout

    _restore_and_clean(out_dir)
    for stale in sorted(out_dir.parent.glob(".staging-*-*")):
        match = re.fullmatch(r"\.staging-(.+)-\d+", stale.name)
        if match is None or match.group(1) == out_dir.name:
            continue
        other = out_dir.parent / match.group(1)
        lock = FileLock(str(lock_path_for(other)))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            continue  # that target is being built right now
        try:
            _restore_and_clean(other)
        finally:
            lock.release()


def _restore_and_clean(out_dir: Path) -> None:
    """A build stopped between the two renames of the swap left the previous output as
    `.old-*` and no output: put it back. Then remove staging and `.old-*` leftovers (of
    the output and of its `.failed` evidence)."""
    failed = failed_dir_for(out_dir)
    for folder in (out_dir, failed):
        olds = sorted(
            _real_leftovers(out_dir.parent, ".old", folder.name),
            key=lambda p: p.lstat().st_mtime,
        )
        if not folder.exists() and not folder.is_symlink() and olds:
            os.rename(olds.pop(), folder)
        for stale in olds:
            shutil.rmtree(stale, ignore_errors=True)
    for stale in _real_leftovers(out_dir.parent, ".staging", out_dir.name):
        shutil.rmtree(stale, ignore_errors=True)


def _real_leftovers(parent: Path, kind: str, name: str) -> list[Path]:
    """`_leftovers` that are real folders. Anything else by such a name (a link, a file:
    none the tool makes) is removed itself, never followed: a planted `.old-*` link is not
    put back as the output, and what it points to is not touched."""
    out = []
    for path in _leftovers(parent, kind, name):
        if path.is_dir() and not path.is_symlink():
            out.append(path)
        else:
            _remove_link(path)
    return out


def _remove_link(path: Path) -> None:
    """Remove a link or file itself (a directory link on Windows goes with rmdir)."""
    try:
        path.unlink()
    except (IsADirectoryError, PermissionError):
        with contextlib.suppress(OSError):
            os.rmdir(path)
    except OSError:
        pass


def _leftovers(parent: Path, kind: str, name: str) -> list[Path]:
    """`{kind}-{name}-{pid}` folders of exactly this output: a glob on `{name}-*` would
    also take another target's whose name starts with it (npu-uint8 and the running
    npu-uint8-openvino build's staging folder)."""
    import re

    exact = re.compile(rf"{re.escape(kind)}-{re.escape(name)}-\d+")
    return [p for p in parent.glob(f"{kind}-{name}-*") if exact.fullmatch(p.name)]


def _swap_into_place(staging: Path, out_dir: Path) -> None:
    old = out_dir.parent / f".old-{out_dir.name}-{os.getpid()}"
    try:
        with _interrupts_held():  # Ctrl-C between the two renames would leave no output
            if out_dir.exists():
                os.rename(out_dir, old)
            os.rename(staging, out_dir)
    finally:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def _interrupts_held() -> Iterator[None]:
    """Defer SIGINT/SIGTERM until the block is done (main thread only; signal is portable)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[tuple[int, Any]] = []
    names = [n for n in ("SIGINT", "SIGTERM") if hasattr(signal, n)]
    previous = {}
    for name in names:
        signum = getattr(signal, name)
        previous[signum] = signal.signal(signum, lambda s, f: received.append((s, f)))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum, _ in received[:1]:
            signal.raise_signal(signum)  # delivered now, to the handler that was in place


def step_where(plan: Plan, comp: ComponentPlan, step: PlannedStep) -> str:
    """Where a build-time error happened: the recipe line of the step (when the recipe
    lists it; presets have none), the component/step and the target."""
    from winml_recipes.recipe import source_location

    path = plan.recipe.path
    recipe = (
        source_location(f"{path}:{step.line}", plan.recipe.rendered, path)
        if step.line
        else str(path)
    )
    target = f"{plan.target.device}/{plan.target.precision}"
    return f"{recipe}: {comp.name}/{step.name} [{target}]"


def check_sources_fit(plan: Plan, budget_mb: float) -> None:
    """Estimate every step of components whose source model is on disk, before any runs.

    The source stands in for each step's input (later models are its rewrites or smaller
    quantized versions of it), so the estimate errs high, never low.
    """
    from winml_recipes.engine.budget import check_fits
    from winml_recipes.sdk.estimates import EstimateInputs

    on_disk = {
        c.name: (c.source.path, c.contract)
        for c in plan.components
        if c.source.path is not None and c.facts.is_onnx
    }
    for comp in plan.components:
        if comp.name not in on_disk:
            continue
        path = on_disk[comp.name][0]
        for step in comp.steps:
            if step.skip:
                continue
            deps = step.impl.depends_on(step.config)
            inputs = EstimateInputs(
                plan.target,
                comp.contract,
                path if comp.facts.has_reference else None,
                {d: on_disk[d] for d in deps if d in on_disk},
                budget_mb,
            )
            estimate = step.impl.estimate_memory(path, step.config, inputs)
            if estimate is not None:
                check_fits(estimate, budget_mb, step_where(plan, comp, step))


def begin_chain(comp: ComponentPlan) -> ChainState:
    """The state before a component's first step: its source."""
    src = comp.source
    return ChainState(
        model=src.path,
        digest=src.digest,
        reference=src.path if comp.facts.has_reference else None,
        reference_digest=src.digest if comp.facts.has_reference else None,
    )


def run_steps(
    comp: ComponentPlan,
    steps: Sequence[PlannedStep],
    plan: Plan,
    work_root: Path,
    cache: StepCache,
    state: ChainState,
    built: Mapping[str, UpstreamComponent | None],
    budget_mb: float,
    reporter: Reporter,
) -> tuple[list[StepRecord], ChainState]:
    """Run (or read from the cache) `steps` of `comp` from `state`: their manifest records
    and the state after the last. Scratch folders go under `work_root`."""
    records: list[StepRecord] = []
    for step in steps:
        reporter.step_started(comp.name, step)
        if not step.skip and sample_inputs_of(step.impl, step.config) is not None:
            assert state.model is not None
            state = replace(state, calibrated=(state.model, state.digest))
        if not step.skip and step.impl.judges_candidate and state.model is not None:
            state = replace(state, judged=(state.model, state.digest))
        started = time.perf_counter()
        try:
            record, state = _run_step(
                comp, step, plan, work_root, cache, state, built, budget_mb, reporter
            )
        except Exception as exc:
            # What a failed build keeps: the records so far with this step's, and the
            # state before it (its model is the candidate to look at).
            failed = _failed_record(step, state, exc, time.perf_counter() - started)
            setattr(exc, EVIDENCE, {comp.name: ([*records, failed], state)})
            raise
        records.append(record)
        reporter.step_finished(comp.name, step, record)
    return records, state


def _step_record(step: PlannedStep, **fields: Any) -> StepRecord:
    """A step's record: what ran it (pass, implementation, version, options) and `fields`."""
    impl = step.impl
    return StepRecord(
        pass_name=step.name,
        implementation=f"{type(impl).__module__}.{type(impl).__qualname__}",
        version=impl.version,
        options=step.options,
        **fields,
    )


def _failed_record(
    step: PlannedStep, state: ChainState, exc: Exception, seconds: float
) -> StepRecord:
    """The manifest record of a step that raised: its error, and what it measured."""
    from winml_recipes.runtime.memory import peak_rss_mb

    error = exc if isinstance(exc, WinmlError) else None
    return _step_record(
        step,
        status="failed",
        error=str(exc) if error else f"{type(exc).__name__}: {exc}",
        wall_seconds=round(seconds, 4),
        peak_rss_mb=peak_rss_mb(),
        input_sha256=state.digest,
        output_sha256=None,
        metrics=dict(getattr(exc, "metrics", None) or {}),
    )


def upstream_of(comp: ComponentPlan, state: ChainState) -> UpstreamComponent | None:
    """What a downstream component's steps (inputs_from) see of `comp` once it is built:
    its float reference and the model its calibration ran (None: it has no float model)."""
    if state.reference is None or state.reference_digest is None:
        return None
    calibration = next(
        (c for s in comp.steps if (c := sample_inputs_of(s.impl, s.config)) is not None),
        None,
    )
    return UpstreamComponent(
        comp.name,
        state.reference,
        state.reference_digest,
        comp.contract,
        calibration,
        *(state.calibrated or (None, None)),
        *(state.judged or (None, None)),
    )


def ship_component(
    comp: ComponentPlan,
    records: list[StepRecord],
    state: ChainState,
    staging: Path,
    *,
    partial: bool = False,
) -> tuple[ComponentRecord, Path | None]:
    """Copy a component's final model and artifacts into `staging/<component>`; its
    manifest record and the shipped model's path (`partial`: a failed build's evidence,
    where a component may have no model yet: no artifact then)."""
    from winml_recipes.onnx.io import artifact_sha256

    source = from_json(SourceRecord, comp.source.to_manifest())
    contract = contract_record(comp.contract)
    if state.model is None:
        if partial:
            return ComponentRecord(source=source, contract=contract, steps=tuple(records)), None
        raise InternalError(f"{comp.name}: no model after the last step")
    final_dir = staging / comp.name
    final_dir.mkdir(parents=True)
    final_model = model_file(final_dir)
    _copy_model(state.model, final_model)
    _write_graph_digest(final_model, final_dir / GRAPH_DIGEST)
    for extra in state.artifacts:
        copy_unshared(extra, final_dir / extra.name)
    shipped = final_model
    if not state.ship_model and state.artifacts:
        for p in [final_model, *final_dir.glob(f"{final_model.name}_data")]:
            p.unlink()
        shipped = final_dir / state.artifacts[0].name
    files = tuple(
        FileRecord(path=f"{comp.name}/{p.name}", size_bytes=p.stat().st_size, sha256=_sha(p))
        for p in sorted(final_dir.iterdir())
        if p.name != GRAPH_DIGEST
    )
    artifact = ShippedRecord(
        path=f"{comp.name}/{shipped.name}",
        size_bytes=sum(f.size_bytes for f in files),
        sha256=artifact_sha256(shipped),
        files=files,
    )
    record = ComponentRecord(
        source=source,
        contract=contract,
        steps=tuple(records),
        artifact=artifact,
        reference=_ship_reference(comp.name, state, staging),
    )
    return record, final_model


def contract_record(contract: IOContract) -> ContractRecord:
    """The component's inputs as the build used them (dtype, shape with named dims, range,
    values, image preprocessing), its outputs and the dims' values: tools that feed the
    built model (compare, run) read them from the manifest, with no recipe or catalog."""

    def spec(s) -> dict[str, Any]:
        out: dict[str, Any] = {"dtype": s.dtype, "shape": list(s.shape)}
        if s.range is not None:
            out["range"] = list(s.range)
        if s.values is not None:
            out["values"] = list(s.values)
        if s.image is not None:
            out["image"] = {"size": list(s.image.size), "mean": list(s.image.mean),
                            "std": list(s.image.std), "layout": s.image.layout}  # fmt: skip
        if s.audio is not None:
            out["audio"] = {"feature_extractor": s.audio.feature_extractor,
                            "sampling_rate": s.audio.sampling_rate,
                            "options": dict(s.audio.options)}  # fmt: skip
        if s.ctc_blank is not None:
            out["ctc_blank"] = s.ctc_blank
        return out

    return ContractRecord(
        inputs={s.name: spec(s) for s in contract.inputs},
        outputs={s.name: spec(s) for s in contract.outputs},
        dims={k: int(v) for k, v in sorted(contract.dims.items())},
    )


def _ship_reference(name: str, state: ChainState, staging: Path) -> ReferenceRecord | None:
    """Copy the component's float reference to `staging/float-reference/<name>/` when the
    shipped model differs from it (None: no float model, or the model is the float one).

    Shipped rather than looked up in the cache: a build folder then runs anywhere. Copied,
    never hard-linked (an edit of one build's file must not change another's)."""
    if state.reference is None or state.reference_digest in (None, state.digest):
        return None
    folder = staging / REFERENCE_DIR / name
    folder.mkdir(parents=True)
    path = model_file(folder)
    _copy_model(state.reference, path)
    return ReferenceRecord(path=path.relative_to(staging).as_posix(), sha256=state.reference_digest)


def _sha(path: Path) -> str:
    from winml_recipes.onnx.io import file_sha256

    return file_sha256(path)


def _run_step(
    comp: ComponentPlan,
    step: PlannedStep,
    plan: Plan,
    work_root: Path,
    cache: StepCache,
    state: ChainState,
    built: Mapping[str, UpstreamComponent | None],
    budget_mb: float,
    reporter: Reporter | None = None,
) -> tuple[StepRecord, ChainState]:
    """Run (or fetch from the cache) one step: its manifest record and the next state."""
    from winml_recipes.onnx.io import artifact_sha256

    impl = step.impl
    if step.skip:
        return _step_record(step, status="skipped", reason=step.skip), state
    started = time.perf_counter()
    upstream = {}
    for dep in impl.depends_on(step.config):
        if built.get(dep) is None:
            raise PassError(
                f"'{dep}' has no float model to run (its source is quantized; "
                f"add {pass_making('float')} to its steps)",
                where=step_where(plan, comp, step),
            )
        upstream[dep] = built[dep]
    work = work_root / comp.name / f"{step.index:02d}-{step.name}"
    ctx = StepContext(
        component=comp.name,
        step_index=step.index,
        target=plan.target,
        contract=comp.contract,
        source=comp.source,
        reference=state.reference,
        work_dir=work / "scratch",
        input_digest=state.digest,
        reference_digest=state.reference_digest,
        feeds_downstream=comp.name in plan.feeding,
        recipe_dir=plan.recipe.path.parent,
        seed=plan.recipe.seed,
        upstream=upstream,
        store=cache.root if cache.enabled else None,
        task=plan.recipe.catalog.data.get("task"),
        budget_mb=budget_mb,
        input_model=state.model,
        progress=(
            (lambda what, done, total: reporter.step_progress(comp.name, step, what, done, total))
            if reporter is not None
            else (lambda *_: None)
        ),
    )
    key = identify(
        step.name,
        impl,
        step.options,
        target=plan.target,
        contract=comp.contract,
        seed=plan.recipe.seed,
        input=state.digest,
        reference=state.reference_digest,
        # Upstream feeds depend on its model, its I/O contract and its calibration source.
        upstream={
            n: {
                "model": u.digest,
                "calibrated": u.calibrated_digest,
                "contract": contract_key(u.contract),
                "calibration": u.calibration,
            }
            for n, u in upstream.items()
        },
        extra=impl.key_material(step.config, ctx),
    ).key()
    estimate_mb: int | None = None
    entry = cache.get_or_claim(key)  # a key another process is computing: wait, read
    if entry is not None:
        status, metrics = "cached", entry.result.get("metrics", {})
        out_model = entry.model
        out_digest = entry.result.get("output_sha256")
        artifacts = [entry.path / name for name in entry.result.get("artifacts", [])]
        ship_model = bool(entry.result.get("ship_model", True))
    else:
        status = "ran"
        if state.model is not None:
            estimate = _estimate(impl, step, state, comp, plan, upstream, budget_mb)
            if estimate is not None:
                from winml_recipes.engine.budget import check_fits

                estimate_mb = round(estimate.mb)
                check_fits(estimate, budget_mb, step_where(plan, comp, step))
        out = work / "out"
        out.mkdir(parents=True)
        (work / "scratch").mkdir()
        try:
            result = impl.run(state.model, out, step.config, ctx)
        except WinmlError as exc:
            # Paths inside the cache or the staging area mean nothing to the user.
            if not exc.where or str(cache.root) in exc.where or str(work_root) in exc.where:
                exc.where = step_where(plan, comp, step)
            raise
        except Exception as exc:  # a pass bug or a library failure on valid input
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise PassError(
                f"{type(exc).__name__}: {first[:300]}", where=step_where(plan, comp, step)
            ) from exc
        if not isinstance(result, StepResult):
            raise InternalError(f"pass '{step.name}' returned {type(result).__name__}")
        metrics = result.metrics
        if result.skipped:
            metrics = {**metrics, "skipped": result.skipped}
        out_model = None if result.skipped else result.model
        out_digest = artifact_sha256(out_model) if out_model else None
        names = [] if result.skipped else list(result.artifacts)
        ship_model = result.ship_model
        stored = cache.put(
            key,
            out,
            {
                "metrics": metrics,
                "output_sha256": out_digest,
                "pass": step.name,
                "artifacts": names,
                "ship_model": ship_model,
            },
        )
        root = stored.path if stored is not None else out
        artifacts = [root / name for name in names]
        if stored is not None and out_model is not None:
            out_model = stored.model
        shutil.rmtree(work / "scratch", ignore_errors=True)
    if metrics.get("skipped"):
        status = "skipped"
    from winml_recipes.runtime.memory import peak_rss_mb

    record = _step_record(
        step,
        cache_key=key,
        memory_estimate_mb=estimate_mb,
        status=status,
        reason=metrics.get("skipped") or None,
        wall_seconds=round(time.perf_counter() - started, 4),
        # the process's peak so far: the step that raises it is the one that needed it
        peak_rss_mb=peak_rss_mb(),
        input_sha256=state.digest,
        output_sha256=out_digest,
        metrics=metrics,
        artifacts=tuple(
            ArtifactRecord(name=p.name, size_bytes=p.stat().st_size, sha256=_sha(p))
            for p in artifacts
        )
        or None,
    )
    after = state.after(out_model, out_digest, impl.produces_reference)
    if artifacts:
        after = replace(after, artifacts=tuple(artifacts), ship_model=ship_model)
    return record, after


def _estimate(
    impl,
    step: PlannedStep,
    state: ChainState,
    comp: ComponentPlan,
    plan: Plan,
    upstream,
    budget_mb: float | None = None,
):
    from winml_recipes.sdk.estimates import EstimateInputs

    assert state.model is not None
    inputs = EstimateInputs(
        plan.target,
        comp.contract,
        state.reference,
        {n: (u.for_calibration()[0], u.contract) for n, u in upstream.items()},
        budget_mb,
    )
    return impl.estimate_memory(state.model, step.config, inputs)


def _copy_model(src: Path, dst: Path) -> None:
    """The graph file and its external data copied (copyfile.copy_unshared: a reflink where
    the file system has one, never a hard link: an edit of the output would change the
    cache entry, the source or another build)."""
    from winml_recipes.onnx.io import load_model, save_model, sidecar_paths

    sidecars = sidecar_paths(src)
    target = dst.parent / f"{dst.name}_data"
    if any(side.name != target.name for side in sidecars):
        # A source no step rewrote, with its exporter's sidecar names: our layout instead.
        save_model(load_model(src), dst)
        return
    copy_unshared(src, dst)
    for side in sidecars:
        copy_unshared(side, target)


def _write_graph_digest(model_path: Path, out: Path) -> None:
    from winml_recipes.onnx.digest import graph_digest
    from winml_recipes.onnx.io import load_model

    out.write_text(yaml.safe_dump(graph_digest(load_model(model_path)), sort_keys=False))


def _manifest(plan: Plan, components: dict[str, ComponentRecord], wall: float) -> Manifest:
    r = plan.recipe
    return Manifest(
        schema_version=SCHEMA_VERSION,
        tool=ToolRecord(name="winml-recipes", version=winml_recipes.__version__),
        versions=library_versions(),
        recipe=RecipeRecord(
            name=r.name,
            path=str(r.path),
            sha256=r.sha256,
            rendered=r.rendered,
            variables=r.variables,
        ),
        model=r.model,
        # the catalog entry (task, I/O contracts, image preprocessing): `run` and the report
        # read it from here, also for `build --onnx`, whose generated catalog is deleted
        catalog=r.catalog.data,
        source=r.source or None,
        target=TargetRecord(**plan.target.to_dict()),
        wall_seconds=round(wall, 3),
        components=components,
    )
