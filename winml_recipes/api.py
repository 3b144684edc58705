"""The Python API. The CLI is a thin shell over these functions (one code path)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from winml_recipes.engine.cache import StepCache, check_output_apart
from winml_recipes.engine.plan import Plan, make_plan
from winml_recipes.engine.run import BuildResult, Reporter, run_plan
from winml_recipes.exec.matrix import MatrixReport
from winml_recipes.exec.task import TargetOutcome
from winml_recipes.recipe import Recipe, load_recipe


def load(
    recipe: Path | str,
    *,
    device: str | None = None,
    precision: str | None = None,
    defines: dict[str, Any] | None = None,
    catalog_dir: Path | None = None,
    source: str | None = None,
    ep: str | None = None,
) -> Recipe:
    """Render, parse and validate a recipe for one target (default: its first target).

    `source` picks one of the catalog's named sources (e.g. "int8" for sam3); `ep` one of
    the targets of a device and precision by execution provider.
    """
    return load_recipe(
        recipe,
        device=device,
        precision=precision,
        defines=defines,
        catalog_dir=catalog_dir,
        source=source,
        ep=ep,
    )


def targets_of(recipe: Path | str, **kwargs: Any) -> list[tuple[str, str, str | None]]:
    """The recipe's targets: (device, precision, the EP it names or None)."""
    r = load(recipe, **kwargs)
    return [(t.device, t.precision, t.ep or None) for t in r.targets]


def plan(recipe: Path | str, *, fetch: bool = True, **kwargs: Any) -> Plan:
    """Validate and plan without running anything (fetch=False: no Hub downloads)."""
    return make_plan(load(recipe, **kwargs), fetch=fetch)


def build(
    recipe: Path | str,
    *,
    output_root: Path | str = "build",
    use_cache: bool = True,
    cache_dir: Path | None = None,
    reporter: Reporter | None = None,
    wait_seconds: float = 600.0,
    memory_budget: str | float | None = None,
    **kwargs: Any,
) -> BuildResult:
    """Build one target of a recipe; returns the output directory and manifest.

    `memory_budget` ("12GB", or MB): steps estimated above it stop the build before they
    start (default: $WINML_RECIPES_MEMORY_BUDGET, else physical memory minus headroom).
    """
    from winml_recipes.outputroot import check_output_root

    cache = StepCache(cache_dir, enabled=use_cache)
    if use_cache:
        check_output_apart(Path(output_root), cache.root)
    check_output_root(output_root)
    the_plan = plan(recipe, **kwargs)
    return run_plan(
        the_plan,
        output_root=Path(output_root),
        cache=cache,
        reporter=reporter,
        wait_seconds=wait_seconds,
        memory_budget=memory_budget,
    )


def matrix(
    recipes: Sequence[Path | str],
    *,
    targets: str | Sequence[tuple[str, ...]] | None = "all",
    device: str | None = None,
    precision: str | None = None,
    ep: str | None = None,
    executor: str = "local",
    jobs: int | None = None,
    address: str | None = None,
    keep_going: bool = True,
    output_root: Path | str = "build",
    use_cache: bool = True,
    cache_dir: Path | str | None = None,
    defines: dict[str, Any] | None = None,
    catalog_dir: Path | str | None = None,
    source: str | None = None,
    wait_seconds: float = 600.0,
    memory_budget: str | float | None = None,
    progress: str = "none",
    report_path: Path | str | None = None,
    on_outcome: Callable[[TargetOutcome], None] | None = None,
    raise_errors: bool = False,
) -> MatrixReport:
    """Build recipes x targets through an executor and report every target.

    `targets`: "all" (every declared target), "cpu/int8,npu/w8a16,npu/uint8/openvino", a list
    of (device, precision[, ep]), or "default" (each recipe's target for `device`/`precision`
    and `ep`, its first when None).
    `executor`: "local" (this process, in order), "pool" (`jobs` processes) or "ray"
    (`address` of a cluster, else a local one with `jobs` CPUs). `keep_going=False` stops
    at the first failure. The report (also written to `report_path`) lists every target's
    status, failing step, error, wall time, key metrics and manifest path; its `exit_code`
    is 0, 3 (quality gate), 2 (bad input) or 1 (internal). `progress`: "stdout"/"stderr"
    (one line per step), "rich" (a live view; local only) or "none".
    """
    import os

    from winml_recipes.catalog import CATALOG_ENV
    from winml_recipes.engine.cache import default_cache_dir
    from winml_recipes.exec.choose import make_executor
    from winml_recipes.exec.matrix import expand, parse_targets, run_tasks
    from winml_recipes.exec.task import TargetTask

    # The driver's store and catalog, whatever the workers' environment says.
    from winml_recipes.outputroot import check_output_root

    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    if use_cache:
        check_output_apart(Path(output_root), cache_dir)
    check_output_root(output_root)
    chosen = make_executor(executor, jobs=jobs, address=address)
    catalog_dir = catalog_dir or os.environ.get(CATALOG_ENV) or None
    if progress == "rich" and chosen.name != "local":
        progress = "stderr"
    base = TargetTask(
        recipe="",
        defines=dict(defines or {}),
        catalog_dir=str(catalog_dir) if catalog_dir else None,
        source=source,
        output_root=str(output_root),
        cache_dir=str(cache_dir) if cache_dir else None,
        use_cache=use_cache,
        wait_seconds=wait_seconds,
        memory_budget=memory_budget,
        progress=progress,
        cwd=str(Path.cwd()),
    )
    common = {"defines": defines, "catalog_dir": catalog_dir, "source": source}
    if targets == "default":
        tasks = [replace(base, recipe=str(r), device=device, precision=precision, ep=ep)
                 for r in recipes]  # fmt: skip
        failed: list[TargetOutcome] = []
    else:
        wanted = parse_targets(targets) if isinstance(targets, str) or targets is None else [
            (t[0], t[1], t[2] if len(t) > 2 else None) for t in targets
        ]  # fmt: skip
        tasks, failed = expand(recipes, wanted, base, lambda r: targets_of(r, **common))
    return run_tasks(
        tasks,
        chosen,
        keep_going=keep_going,
        failed_before=failed,
        on_outcome=on_outcome,
        report_path=Path(report_path) if report_path else None,
        raise_errors=raise_errors and chosen.name == "local",
    )


def build_onnx(
    model: Path | str,
    *,
    device: str,
    precision: str | None = None,
    shapes: dict[str, tuple[int, ...]] | None = None,
    calibration_data: str | None = None,
    eval_data: str | None = None,
    allow_calibration_overlap: bool = False,
    task: str | None = None,
    **kwargs: Any,
) -> BuildResult:
    """Build a local ONNX file from the presets, without writing a recipe.

    `calibration_data` / `eval_data`: .npz files (a glob) or an image folder; calibration
    reads the first, verification the second (default: seeded synthetic inputs).

    A catalog entry and a recipe are generated into a temporary directory and built
    through the same loader, validator and engine as any recipe.
    """
    import re
    import tempfile

    from winml_recipes.authoring import (
        SYNTHETIC_GATE_HINT,
        synthetic_calibration_note,
        write_adhoc_project,
    )
    from winml_recipes.outputroot import check_output_root
    from winml_recipes.presets import default_precision, resolve_target
    from winml_recipes.sdk.errors import QualityGateError, SourceError, WinmlError
    from winml_recipes.tasks import check_task

    model = Path(model)
    if not model.is_file():
        raise SourceError("file not found; check the path", where=str(model))
    precision = precision or default_precision(device)
    resolve_target(device, precision)
    if task is not None:
        check_task(task)
    # before any step: the output folder, with room for a few copies of the model
    check_output_root(kwargs.get("output_root", "build"), 4 * model.stat().st_size)
    note = None
    with tempfile.TemporaryDirectory(prefix="winml-adhoc-") as tmp:
        try:
            recipe, task_note = write_adhoc_project(
                model,
                Path(tmp),
                device,
                precision,
                shapes or {},
                calibration_data=calibration_data,
                eval_data=eval_data,
                allow_calibration_overlap=allow_calibration_overlap,
                task=task,
            )

            note = None if calibration_data else synthetic_calibration_note(model, precision)
            if note and kwargs.get("reporter") is not None:
                kwargs["reporter"].message(note)
            result = build(recipe, device=device, precision=precision,
                           catalog_dir=Path(tmp) / "catalog", **kwargs)  # fmt: skip
            return replace(result, notes=(*result.notes, task_note))
        except WinmlError as exc:
            if isinstance(exc, QualityGateError) and note:
                exc.message += SYNTHETIC_GATE_HINT
            exc.message = _data_flags(exc.message, calibration_data, eval_data)
            # The generated recipe and catalog are deleted with the folder: name the model.
            exc.where = re.sub(re.escape(tmp) + r"[^:\s]*(:\d+)?", str(model), exc.where)
            raise


def _data_flags(message: str, calibration_data: str | None, eval_data: str | None) -> str:
    """A data error of the generated recipe, named by the flag the user gave instead."""
    for prefix, flag, given in (
        ("calibration.npz:", "--calibration-data:", calibration_data),
        ("verify.npz:", "--eval-data:", eval_data),
    ):
        if given is not None and message.startswith(prefix):
            return flag + message[len(prefix) :]
    return message


def compare(
    candidate: Path | str,
    reference: Path | str | None = None,
    *,
    component: str | None = None,
    device: str = "npu",
    ep: str | None = None,
    npz: str | None = None,
    samples: int = 2,
    seed: int = 0,
    threshold_db: float = 30.0,
    ranges: dict[str, tuple[float, float]] | None = None,
    values: dict[str, tuple[float, ...]] | None = None,
) -> dict[str, Any]:
    """Per-tensor comparison of a QDQ model on the device's EP vs its CPU simulation and
    the float model: which tensor first goes wrong on the target, and which layers lose
    the most precision against float (`ranking`, most first).

    `candidate`: a .onnx file, or a build folder's component (its folder, or the build
    folder with `component`; a failed build's `.failed` folder too). `reference`: the float
    model (default for a build folder: the float model the build verified against, from
    the step cache). Inputs: `npz` (a file or glob of .npz files with the model's input
    names), else what the build fed the component (the manifest's input contract, with the
    bundled photos for an image input), else seeded data shaped as the candidate takes it;
    `ranges` ([low, high), integers high-exclusive) or allowed `values` per input name
    override the synthetic ones. `ep`: the EP plugin the candidate runs on (default: the
    one the build targeted, else the device's default).
    """
    import tempfile

    from winml_recipes.buildfolder import find_component, float_reference, verify_upstream
    from winml_recipes.compare_inputs import compare_contract
    from winml_recipes.feeds import (
        bundled_audio_input,
        bundled_image_input,
        check_npz,
        feeds_for,
        from_npz,
        npz_files,
        take,
    )
    from winml_recipes.hub import local_model_file
    from winml_recipes.presets import resolve_target
    from winml_recipes.quant.divergence import compare_tensors, first_divergence, rank_by_loss
    from winml_recipes.sdk.errors import RecipeError, WinmlError

    resolve_target(device, "fp32")
    local = Path(candidate)
    built = find_component(local, component) if local.exists() else None
    candidate = built.model if built is not None else local_model_file(str(candidate))
    if reference is None:
        if built is None:
            raise RecipeError(
                f"{candidate}: give REFERENCE (the float model); it is found by itself only "
                "for a model of a build folder"
            )
        reference = float_reference(built)
    else:
        reference = local_model_file(str(reference))
    contract, inputs_from = compare_contract(candidate, reference, built, ranges, values)
    if npz:
        files = npz_files(npz, Path.cwd(), "--npz")
        check_npz(files, contract, "--npz")
        factory = from_npz(files, contract, samples)
        inputs_from = f"npz: {npz}"
    else:
        upstream = verify_upstream(built) if built is not None and not (ranges or values) else None
        if upstream is not None:  # as the build verified it: the upstream's float outputs
            up, per = upstream
            options = {"inputs_from": up.name, "samples_per_upstream": per}
            factory = feeds_for(options, contract, Path.cwd(), {up.name: up}, samples, seed)
            inputs_from += f", {up.name}'s float outputs on the bundled photos (held-out set)"
        else:
            factory = feeds_for(None, contract, Path.cwd(), {}, samples, seed, held_out=True)
            if bundled_image_input(contract) is not None:
                inputs_from += ", bundled photos (held-out set) for the image input"
            elif bundled_audio_input(contract) is not None:
                inputs_from += ", bundled speech (held-out set) for the audio input"
    feeds = take(factory, samples)
    if ep is None and built is not None:
        ep = built.manifest.get("target", {}).get("ep") or None
    if ep is not None:
        from winml_recipes.sdk.ep import check_serves, get_ep

        check_serves(get_ep(ep), device)
    with tempfile.TemporaryDirectory(prefix="winml-compare-") as tmp:
        try:
            rows, record = compare_tensors(candidate, reference, feeds, device, Path(tmp), ep)
        except WinmlError as exc:
            exc.where = str(candidate)  # not the temporary copy
            raise
    first = first_divergence(rows, threshold_db)
    apart = record.get("tapped_vs_untapped_db")
    if apart is not None and apart < TAPS_CHANGED_DB:
        # the taps changed what the EP compiled: the untouched graph's first divergence is
        # found on prefixes of it, each compiled as the model is (quant/prefixes.py)
        first, record["prefix_search"] = _first_by_prefixes(
            candidate, reference, feeds, device, ep, threshold_db
        )
    return {
        "candidate": str(candidate),
        "reference": str(reference),
        "device": device,
        "samples": len(feeds),
        "inputs_from": inputs_from,
        **({"build_status": built.manifest.get("status", "ok")} if built is not None else {}),
        **record,
        "first_divergence": first.to_json() if first else None,
        "ranking": [r.tensor for r in rank_by_loss(rows)],
        "tensors": [r.to_json() for r in rows],
    }


TAPS_CHANGED_DB = 40.0  # tapped vs untapped final outputs on the target, below: changed


def _first_by_prefixes(
    candidate: Path, reference: Path, feeds: list, device: str, ep: str | None,
    threshold_db: float,
) -> tuple[Any, dict[str, Any]]:  # fmt: skip
    """The first divergence of the untouched candidate, searched on its prefixes."""
    import tempfile

    from winml_recipes.quant.prefixes import first_divergence_by_prefixes
    from winml_recipes.runtime.target import run_on_target

    def on_target(path: Path, prefix_feeds: list) -> list:
        options = {"allow_cpu_fallback": True}
        return run_on_target(path, prefix_feeds, device, options, ep=ep).outputs

    with tempfile.TemporaryDirectory(prefix="winml-prefixes-") as tmp:
        return first_divergence_by_prefixes(
            candidate, reference, feeds, on_target, Path(tmp), threshold_db
        )


def perf(
    builds: Sequence[Path | str],
    *,
    ep: str | None = None,
    device: str | None = None,
    iterations: int | None = 50,
    warmup: int = 5,
    output_root: Path | str = "build",
    catalog_dir: Path | None = None,
    budget_seconds: float = 60.0,
    say: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Time built targets: session creation (uncompiled and EPContext), latency P50/P90/P99,
    throughput and peak memory per component and for the whole pipeline.

    `builds`: build folders (build/<recipe>/<device>-<precision>) or recipes (every target
    built under `output_root`), compared in one report. The EP is `ep` (an EP plugin's
    key), else `device`'s, else each build target's. Each row runs in a fresh process; rows on
    an EP whose plugin says it is emulated here (an NPU's on an x86_64 host) are labelled as
    emulation (`emulated`, `note`). `iterations` None: each row's runs are sized by its
    share of `budget_seconds` after one measured run (`say` hears the estimates);
    percentiles from too few runs are None.
    """
    from winml_recipes.perf import perf as run_perf

    return run_perf(
        builds,
        ep=ep,
        device=device,
        iterations=iterations,
        warmup=warmup,
        output_root=output_root,
        catalog_dir=catalog_dir,
        budget_seconds=budget_seconds,
        say=say,
    )


def run(
    build_dir: Path | str,
    *,
    image: Path | str | None = None,
    points: Sequence[str | tuple[float, ...]] = (),
    boxes: Sequence[str | tuple[float, float, float, float]] = (),
    npz: Path | str | None = None,
    output_dir: Path | str | None = None,
    compiled: bool | None = None,
    say: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run a build folder on inputs a person has: its components in order (SAM: encoder,
    then decoder on the encoder's outputs) on the target's EP, and the float reference on
    the CPU EP. Returns the summary (also written as summary.json, beside outputs.npz and,
    for image tasks, a PNG of the float and target results; default folder BUILD_DIR/run).

    `image`: a photo, preprocessed as the catalog's `image:` block says (default: a bundled
    held-out photo). `points` ("X,Y[,LABEL]" or tuples) and `boxes` ("X1,Y1,X2,Y2") are SAM
    prompts in the photo's pixels. `npz`: arrays named like inputs (they win). `compiled`:
    the EPContext model (None: where compiled and the EP loads; False: model.onnx). `say`
    hears the run's estimated cost on the target before it starts (runcost.py).
    """
    from winml_recipes.prompts import Box, Point, parse_box, parse_point
    from winml_recipes.runbuild import run_build

    return run_build(
        build_dir,
        image=image,
        points=[parse_point(p) if isinstance(p, str) else Point(*p) for p in points],
        boxes=[parse_box(b) if isinstance(b, str) else Box(*b) for b in boxes],
        npz=npz,
        output_dir=output_dir,
        compiled=compiled,
        say=say,
    )


def report(
    build_dir: Path | str,
    *,
    layers: bool | None = None,
    say: Callable[[str], None] | None = None,
) -> Path:
    """(Re)write BUILD_DIR/report.html from the build folder (it runs nothing on the
    target): verdicts, metrics, the per-layer SQNR plot verify recorded, the last `run`'s
    picture, placement, step times, versions. `layers`: True computes the per-layer
    comparison where verify recorded none (one run on the target; `say` hears it); False
    leaves the plot out. Returns the report's path."""
    from winml_recipes.report import write_report

    return write_report(Path(build_dir), layers=layers, say=say)
