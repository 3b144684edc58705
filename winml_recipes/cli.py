"""Command line: parse arguments, call winml_recipes.api, print, map errors to exit codes."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from winml_recipes.clihelp import LazyHelpOption
from winml_recipes.sdk.errors import WinmlError
from winml_recipes.tasks import task_help
from winml_recipes.untrusted import printable

EXIT_USER = 2
EXIT_INTERNAL = 1


class _Group(click.Group):
    """Turns every WinmlError into one line on stderr and its exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except WinmlError as exc:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            # Messages may quote a file or a server: no control character reaches the terminal.
            from winml_recipes.console import fit_all

            for line in fit_all([f"error: {printable(exc)}"]):  # one line unless on a console
                click.echo(line, err=True)
            sys.exit(exc.exit_code)
        except OSError as exc:  # a path that is not writable, not a directory, ...
            if ctx.obj and ctx.obj.get("debug"):
                raise
            where = f"{exc.filename}: " if exc.filename else ""
            click.echo(f"error: {where}{exc.strerror or exc}", err=True)
            sys.exit(EXIT_USER)
        except KeyboardInterrupt:
            click.echo("error: interrupted; the previous output and the cache are intact", err=True)
            sys.exit(130)


def _echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


target_options = [
    click.option("--device", help="Target device (cpu, gpu, npu)."),
    click.option("--precision", help="Target precision (fp32, ...)."),
    click.option(
        "--ep",
        metavar="NAME",
        help="The target's execution provider, for a recipe target that names one "
        "(e.g. npu/uint8 with ep: openvino; default: the device's, see `passes`).",
    ),
    click.option(
        "-D", "defines", multiple=True, metavar="KEY=VALUE", help="Template variable (repeatable)."
    ),
    click.option(
        "--catalog",
        "catalog_dir",
        type=click.Path(path_type=Path, file_okay=False),
        help="The project's catalog directory, searched before the built-in entries "
        "(default: $WINML_RECIPES_CATALOG, ../catalog beside the recipe, ./catalog).",
    ),
    click.option(
        "--source",
        metavar="NAME",
        help="Which of the catalog's named sources to build from (e.g. sam3: fp32, int8; "
        "default: the recipe's `source:`, else the first listed).",
    ),
]


def _with(options: list):
    """A decorator applying `options` in the order they are listed (as --help shows them)."""

    def apply(fn):
        for opt in reversed(options):
            fn = opt(fn)
        return fn

    return apply


with_target_options = _with(target_options)


executor_options = [
    click.option(
        "--executor",
        type=click.Choice(["local", "pool", "ray"]),
        default="local",
        show_default=True,
        help="Who builds the targets: this process in order, --jobs processes here, or a Ray "
        "cluster (pip install 'winml-recipes[ray]').",
    ),
    click.option(
        "--jobs",
        type=int,
        help="Worker processes (pool) or CPUs of the local Ray cluster (default: all cores).",
    ),
    click.option(
        "--address",
        metavar="ADDR",
        help="Ray cluster to join (auto, ray://host:10001; default: start a local one). Every "
        "worker must see the recipes, the cache folder and the output root at the same paths.",
    ),
    click.option(
        "--report",
        "report_path",
        type=click.Path(path_type=Path, dir_okay=False),
        help="Write the JSON report here, whatever happens: per target the status, failing "
        "step, error, wall time, key metrics and manifest path.",
    ),
]


with_executor_options = _with(executor_options)


def _load_kwargs(device, precision, ep, defines, catalog_dir, source) -> dict[str, Any]:
    from winml_recipes.recipe import parse_defines

    return {
        "device": device,
        "precision": precision,
        "ep": ep,
        "defines": parse_defines(defines),
        "catalog_dir": catalog_dir,
        "source": source,
    }


@click.group(cls=_Group)
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
@click.version_option(package_name="winml-recipes")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """Build ONNX models for on-device inference from declarative recipes.

    Each device builds for a default execution provider (an EP plugin) and a recipe target
    may name another. verify runs the candidate on it; `passes` shows which of them this
    machine can load.
    """
    ctx.obj = {"debug": debug}


@main.command()
@click.argument("recipes", nargs=-1, required=True, type=click.Path(path_type=Path))
@with_target_options
def validate(recipes, device, precision, ep, defines, catalog_dir, source) -> None:
    """Render, validate and plan recipes for every declared target (no downloads)."""
    from winml_recipes import api
    from winml_recipes.catalog import override_note

    failed = 0
    for path in recipes:
        try:
            kwargs = _load_kwargs(device, precision, ep, defines, catalog_dir, source)
            recipe = api.load(path, **kwargs)
            for t in recipe.targets:
                if (device in (None, t.device) and precision in (None, t.precision)
                        and ep in (None, t.ep, t.execution_provider)):  # fmt: skip
                    chosen = {"device": t.device, "precision": t.precision, "ep": t.ep or None}
                    api.plan(path, fetch=False, **{**kwargs, **chosen})
            click.echo(f"ok: {path} ({', '.join(t.label for t in recipe.targets)})")
            if override_note(recipe.catalog):
                click.echo(f"note: {override_note(recipe.catalog)}", err=True)
        except WinmlError as exc:
            failed += 1
            click.echo(f"error: {exc}", err=True)
    if failed:
        sys.exit(EXIT_USER)


@main.command()
@click.argument("recipe", type=click.Path(path_type=Path))
@with_target_options
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def plan(recipe, device, precision, ep, defines, catalog_dir, source, as_json) -> None:
    """Show the steps a build would run, with skip reasons, without running anything."""
    from winml_recipes import api

    kwargs = _load_kwargs(device, precision, ep, defines, catalog_dir, source)
    the_plan = api.plan(recipe, **kwargs)
    if as_json:
        _echo_json(the_plan.to_dict())
        return
    click.echo(f"{the_plan.recipe.name} -> {the_plan.target.label}")
    for comp in the_plan.components:
        click.echo(f"  {comp.name}  (source: {comp.source.ref})")
        for s in comp.steps:
            opts = f" {json.dumps(s.options, sort_keys=True)}" if s.options else ""
            state = f"skip: {s.skip}" if s.skip else "run"
            click.echo(f"    {s.index + 1}. {s.name}{opts}  [{state}]")
        for note in comp.notes:
            click.echo(f"    note: {note}")
    first = [f"{c.name} 1-{c.checked_first}" for c in the_plan.components if c.checked_first]
    if first:  # fail-fast steps (Pass.fail_fast) and those before them
        click.echo(f"  checked first, before any other step: {', '.join(first)}")


@main.command()
@click.argument("recipe", required=False, type=click.Path(path_type=Path))
@with_target_options
@click.option("--all-targets", is_flag=True, help="Build every target the recipe declares.")
@click.option(
    "--keep-going",
    is_flag=True,
    help="With --all-targets: build the other targets after one fails (exit: the worst).",
)
@with_executor_options
@click.option("--no-cache", is_flag=True, help="Run every step; neither read nor write the cache.")
@click.option(
    "-o",
    "--output",
    "output_root",
    default="build",
    type=click.Path(path_type=Path),
    show_default=True,
    help="Output root: OUTPUT/<recipe>/<device>-<precision>[-<ep>]/.",
)
@click.option(
    "--wait",
    "wait_seconds",
    default=600.0,
    show_default=True,
    help="Seconds to wait for another build of the same output.",
)
@click.option(
    "--memory-budget",
    metavar="SIZE",
    help="Stop before a step estimated above SIZE (e.g. 12GB; default: "
    "$WINML_RECIPES_MEMORY_BUDGET, else physical memory minus max(2 GB, 15%)).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the manifest(s) as JSON; on a failure, the report (see --report).",
)
@click.option(
    "--onnx",
    "onnx_file",
    help="Build this ONNX file from the presets instead of a recipe (needs --device).",
)
@click.option(
    "--shape",
    "shapes",
    multiple=True,
    metavar="NAME=DxD...",
    help="With --onnx: an input's shape, e.g. pixel_values=1x3x224x224 (repeatable).",
)
@click.option(
    "--calibration-data",
    metavar="DATA",
    help="With --onnx: real inputs to calibrate on: .npz files (a glob), an image folder or a "
    "datasets split saved with save_to_disk (DIR, or DIR:SPLIT for a DatasetDict) "
    "(default: seeded synthetic inputs).",
)
@click.option(
    "--eval-data",
    metavar="DATA",
    help="With --onnx: held-out inputs to verify on (.npz glob, image folder or saved datasets "
    "split), every sample up to 64; refused when it holds calibration samples (default: "
    "seeded synthetic inputs).",
)
@click.option(
    "--task",
    metavar="TASK",
    cls=LazyHelpOption,  # every registered task, listed when --help shows it
    help_from=task_help,
)
@click.option(
    "--allow-calibration-overlap",
    is_flag=True,
    help="With --onnx: verify on --eval-data even where it holds calibration samples (said in "
    "the output; the quality measured then overstates unseen data's).",
)
def build(
    recipe,
    device,
    precision,
    ep,
    defines,
    catalog_dir,
    source,
    all_targets,
    keep_going,
    executor,
    jobs,
    address,
    report_path,
    no_cache,
    output_root,
    wait_seconds,
    memory_budget,
    as_json,
    onnx_file,
    shapes,
    calibration_data,
    eval_data,
    task,
    allow_calibration_overlap,
) -> None:
    """Build a recipe for one target (default: its first) or --all-targets.

    Or build any local ONNX file from the presets: build --onnx model.onnx --device npu.
    """
    from winml_recipes import api
    from winml_recipes.sdk.errors import RecipeError

    if onnx_file is not None:
        from winml_recipes.authoring import parse_shapes

        if recipe is not None or all_targets or defines or catalog_dir or source or ep:
            raise RecipeError(
                "--onnx builds from the presets (the device's default EP): drop RECIPE, "
                "--all-targets, --ep, -D, --catalog and --source"
            )
        if keep_going or executor != "local" or jobs or address or report_path:
            raise RecipeError(
                "--onnx builds one target here: drop --keep-going, --executor, --jobs, "
                "--address and --report"
            )
        if not device:
            raise RecipeError("--onnx needs --device (cpu, gpu, npu)")
        reporter = _reporter(as_json)
        with reporter:
            from winml_recipes.hub import local_model_file

            result = api.build_onnx(
                local_model_file(onnx_file),
                device=device,
                precision=precision,
                shapes=parse_shapes(shapes),
                calibration_data=calibration_data,
                eval_data=eval_data,
                allow_calibration_overlap=allow_calibration_overlap,
                task=task,
                output_root=output_root,
                use_cache=not no_cache,
                reporter=reporter,
                wait_seconds=wait_seconds,
                memory_budget=memory_budget,
            )
        if as_json:
            _echo_json(result.manifest)
        else:
            from winml_recipes.console import fit_all

            _print_summary(result.manifest, result.output_dir)
            for line in fit_all(result.notes):
                click.echo(line)
        return
    if shapes or calibration_data or eval_data or allow_calibration_overlap or task:
        raise RecipeError(
            "--shape, --calibration-data, --eval-data, --task and --allow-calibration-overlap "
            "are only for --onnx; recipes take "
            "shapes from the catalog and data from quantize.calibration and verify (npz, images)"
        )
    if recipe is None:
        raise RecipeError("missing RECIPE (e.g. recipes/sam3-tiny.yaml) or --onnx FILE")
    if all_targets and (device or precision or ep):
        raise RecipeError("--all-targets cannot be combined with --device/--precision/--ep")
    if (executor != "local" or jobs) and not all_targets:
        raise RecipeError("--executor and --jobs spread --all-targets (or `matrix`) over workers")
    report = _run_matrix(
        [recipe],
        targets="all" if all_targets else "default",
        device=device,
        precision=precision,
        ep=ep,
        defines=defines,
        catalog_dir=catalog_dir,
        source=source,
        executor=executor,
        jobs=jobs,
        address=address,
        keep_going=keep_going,
        output_root=output_root,
        no_cache=no_cache,
        wait_seconds=wait_seconds,
        memory_budget=memory_budget,
        as_json=as_json,
        report_path=report_path,
        on_outcome=_print_outcome(as_json, name_target=all_targets),
    )
    if as_json and report.exit_code == 0:  # the manifests, as before; a failure: the report
        manifests = [json.loads(Path(o.manifest_path).read_text()) for o in report.outcomes]
        _echo_json(manifests[0] if len(manifests) == 1 else manifests)
    _exit_with(report, as_json)


def _run_matrix(recipes, *, defines, no_cache, as_json, **kwargs):
    from winml_recipes import api
    from winml_recipes.recipe import parse_defines

    tty = sys.stderr.isatty() and sys.stdout.isatty()
    if as_json:
        progress = "stderr"
    else:
        progress = "rich" if tty and kwargs["executor"] == "local" else "stdout"
    debug = bool(click.get_current_context().find_root().obj.get("debug"))
    return api.matrix(
        recipes,
        defines=parse_defines(defines),
        use_cache=not no_cache,
        progress=progress,
        raise_errors=debug and kwargs["executor"] == "local",
        **kwargs,
    )


def _print_outcome(as_json: bool, name_target: bool):
    """As each target ends: its summary (stdout), or its error as one line (stderr; with
    several targets it names the target if the error does not)."""

    def show(outcome) -> None:
        if outcome.status == "failed":
            error = outcome.error or ""
            if name_target and outcome.device and f"[{outcome.target}]" not in error:
                error += f" [{outcome.target}]"
            click.echo(f"error: {error}", err=True)
        elif outcome.status == "ok" and not as_json:
            manifest = json.loads(Path(outcome.manifest_path).read_text())
            _print_summary(manifest, outcome.output_dir)

    return show


def _exit_with(report, as_json: bool) -> None:
    if as_json and report.exit_code != 0:
        _echo_json(report.to_dict())
    if report.exit_code:
        sys.exit(report.exit_code)


@main.command()
@click.argument("recipes", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--targets",
    default="all",
    show_default=True,
    metavar="all|DEV/PREC[/EP],...",
    help="Which declared targets to build, e.g. cpu/int8,npu/w8a16,npu/uint8/openvino "
    "(DEV/PREC alone: the one built for the device's default EP).",
)
@click.option(
    "-D", "defines", multiple=True, metavar="KEY=VALUE", help="Template variable (repeatable)."
)
@click.option(
    "--catalog",
    "catalog_dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="Catalog directory (default: ../catalog beside each recipe).",
)
@click.option("--source", metavar="NAME", help="Named catalog source (see `build --help`).")
@with_executor_options
@click.option("--no-cache", is_flag=True, help="Run every step; neither read nor write the cache.")
@click.option(
    "-o", "--output", "output_root", default="build", type=click.Path(path_type=Path),
    show_default=True, help="Output root: OUTPUT/<recipe>/<device>-<precision>[-<ep>]/.",
)  # fmt: skip
@click.option("--wait", "wait_seconds", default=600.0, show_default=True,
              help="Seconds to wait for another build of the same output.")  # fmt: skip
@click.option("--memory-budget", metavar="SIZE", help="Per build (see `build --help`).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def matrix(
    recipes, targets, defines, catalog_dir, source, executor, jobs, address, report_path,
    no_cache, output_root, wait_seconds, memory_budget, as_json,
):  # fmt: skip
    """Build every RECIPE x target, keep going past failures, end with a summary table.

    Exit 0 when every target built, else the worst failure's code: 1 internal (a worker
    died more often than retried), 2 bad input, 3 a quality gate.
    """
    report = _run_matrix(
        list(recipes),
        targets=targets,
        defines=defines,
        catalog_dir=catalog_dir,
        source=source,
        executor=executor,
        jobs=jobs,
        address=address,
        keep_going=True,
        output_root=output_root,
        no_cache=no_cache,
        wait_seconds=wait_seconds,
        memory_budget=memory_budget,
        as_json=as_json,
        report_path=report_path,
        on_outcome=_print_matrix_outcome(as_json),
    )
    if as_json:
        _echo_json(report.to_dict())
    else:
        click.echo(report.table())
    if report.exit_code:
        sys.exit(report.exit_code)


def _print_matrix_outcome(as_json: bool):
    """One line per finished target (stderr with --json: stdout holds the report)."""

    def show(outcome) -> None:
        label = f"{outcome.name or Path(outcome.recipe).stem} {outcome.target}"
        if outcome.status == "failed":
            click.echo(f"error: {outcome.error} [{label}]", err=True)
        else:
            click.echo(f"{outcome.status}: {label} in {outcome.wall_seconds:.1f} s", err=as_json)

    return show


def _reporter(quiet: bool):
    """A live view on a terminal; else one line per step (stdout; stderr under --json)."""
    from winml_recipes.progress import make_reporter

    enabled = not quiet and sys.stderr.isatty()
    return make_reporter(enabled=enabled, stream=sys.stderr if quiet else sys.stdout)


def _print_summary(m: dict[str, Any], output_dir) -> None:
    from winml_recipes.console import fit_all
    from winml_recipes.presenter import summary_lines
    from winml_recipes.sdk.records import Manifest

    for line in fit_all(summary_lines(Manifest.from_json(m), output_dir)):
        click.echo(line)


@main.command()
@click.option("--json", "as_json", is_flag=True)
def passes(as_json) -> None:
    """List the registered passes (devices, precisions) and the execution providers this
    machine can load (an EP that cannot says why, e.g. which package it needs)."""
    from winml_recipes.sdk.passes import all_passes, describe_support

    rows = []
    for name, cls in all_passes().items():
        devs, precs = describe_support(cls)
        rows.append(
            {
                "name": name,
                "version": cls.version,
                "devices": devs,
                "precisions": precs,
                "summary": cls.summary,
                "module": cls.__module__,
            }
        )
    eps = _execution_providers()
    if as_json:
        _echo_json({"passes": rows, "execution_providers": eps})
        return
    for r in rows:
        click.echo(
            f"{r['name']:<12} v{r['version']}  devices: {r['devices']:<14} "
            f"precisions: {r['precisions']:<10} {r['summary']}"
        )
    click.echo("\nexecution providers (verify runs the candidate on its device's EP):")
    for ep in eps:
        state = "available" if ep["available"] else f"not available: {ep['reason']}"
        versions = ", ".join(f"{k} {v}" for k, v in ep.get("versions", {}).items())
        click.echo(
            f"  {ep['key']:<8} {ep['provider']:<22} devices: {', '.join(ep['devices']) or '-':<5}"
            f" {state}" + (f" ({versions})" if versions else "")
        )


def _execution_providers() -> list[dict[str, Any]]:
    from winml_recipes.presets import device_settings, devices
    from winml_recipes.runtime.providers import execution_providers, identity

    rows = []
    for key in execution_providers():
        used_by = [d for d in devices() if device_settings(d).get("execution_provider") == key]
        rows.append({**identity(key), "devices": used_by})
    return rows


@main.group()
def catalog() -> None:
    """Browse the model catalog."""


def _catalog_dir(path: Path | None) -> Path | None:
    from winml_recipes.catalog import default_catalog_dir

    return path or default_catalog_dir()


@catalog.command("list")
@click.option(
    "--catalog",
    "catalog_dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="The project's catalog, listed with the built-in entries (default: ./catalog).",
)
@click.option("--json", "as_json", is_flag=True)
def catalog_list(catalog_dir, as_json) -> None:
    """List catalog entries: the built-in ones and the project's, and where each comes from."""
    from winml_recipes.catalog import entry_names, load_entry

    directory = _catalog_dir(catalog_dir)
    entries = [load_entry(n, directory) for n in entry_names(directory)]
    if as_json:
        _echo_json(
            [
                {
                    "name": e.name,
                    "task": e.data["task"],
                    "components": list(e.components),
                    "path": str(e.path),
                    "builtin": e.builtin,
                    "overrides": str(e.overrides) if e.overrides else None,
                }
                for e in entries
            ]
        )
        return
    for e in entries:
        origin = "built-in" if e.builtin else str(e.path)
        origin += " (overrides the built-in)" if e.overrides else ""
        click.echo(f"{e.name:<16} {e.data['task']:<22} {', '.join(e.components):<44} {origin}")


@catalog.command("show")
@click.argument("name")
@click.option("--catalog", "catalog_dir", type=click.Path(path_type=Path, file_okay=False))
@click.option("--json", "as_json", is_flag=True)
def catalog_show(name, catalog_dir, as_json) -> None:
    """Show one catalog entry (validated); the project's entry when it overrides a built-in."""
    import yaml

    from winml_recipes.catalog import load_entry, override_note

    entry = load_entry(name, _catalog_dir(catalog_dir))
    if override_note(entry):
        click.echo(f"note: {override_note(entry)}", err=True)
    if as_json:
        _echo_json(entry.data)
    else:
        click.echo(yaml.safe_dump(entry.data, sort_keys=False).rstrip())


@main.command()
@click.argument(
    "name", default="recipe", type=click.Choice(["recipe", "catalog", "manifest", "report"])
)
@click.option("--write", is_flag=True, help="Write every schema into --dir instead of printing.")
@click.option("--dir", "directory", default="schemas", type=click.Path(path_type=Path))
def schema(name, write, directory) -> None:
    """Print a JSON Schema (the recipe schema composes every pass's options)."""
    from winml_recipes import schemas

    if write:
        for path in schemas.write_all(directory):
            click.echo(f"wrote {path}")
    else:
        click.echo(schemas.render(name), nl=False)


@main.command()
@click.argument("model")
@click.option("--json", "as_json", is_flag=True)
def inspect(model, as_json) -> None:
    """Describe an ONNX file (local path or org/repo/file.onnx): quantization, I/O, ops."""
    import yaml

    from winml_recipes.hub import local_model_file
    from winml_recipes.onnx.digest import graph_digest
    from winml_recipes.onnx.io import load_model
    from winml_recipes.onnx.quant import detect_quantization

    shown, model = model, local_model_file(model)

    proto = load_model(model, load_external_data=False, sidecars_required=True)
    digest = graph_digest(proto, base_dir=model.parent)
    if as_json:
        _echo_json(digest)
        return
    quant = detect_quantization(proto)
    click.echo(f"{shown}: " + (f"quantized ({quant.describe()})" if quant.quantized else "float"))
    click.echo(yaml.safe_dump(digest, sort_keys=False).rstrip())


COMPARE_TOP = 15
_TENSOR_WIDTH = 21  # a row: 80 columns


@main.command()
@click.argument("candidate")
@click.argument("reference", required=False)
@click.option(
    "--component",
    metavar="NAME",
    help="With a build folder as CANDIDATE: the component to compare.",
)
@click.option("--device", default="npu", show_default=True, help="Target device (its EP runs).")
@click.option(
    "--ep",
    default=None,
    help="Execution provider plugin to run the candidate on (default: the EP the build "
    "targeted, else the device's default).",
)
@click.option(
    "--npz",
    help="Input samples: a .npz file or glob (default: what the build fed the component, "
    "else seeded data shaped as the candidate takes it).",
)
@click.option("--samples", default=2, show_default=True, type=click.IntRange(1, 64))
@click.option("--seed", default=0, show_default=True, type=click.IntRange(0))
@click.option(
    "--threshold",
    "threshold_db",
    default=30.0,
    show_default=True,
    help="Target-vs-simulation SQNR (dB) under which a tensor counts as diverged.",
)
@click.option(
    "--range",
    "ranges",
    multiple=True,
    metavar="INPUT=LOW:HIGH",
    help="Synthetic range of an input (integers: HIGH excluded). Repeatable.",
)
@click.option(
    "--values",
    "values",
    multiple=True,
    metavar="INPUT=V1,V2,...",
    help="Allowed values of an input (e.g. labels). Repeatable.",
)
@click.option(
    "--top",
    default=COMPARE_TOP,
    show_default=True,
    type=click.IntRange(1),
    help="How many layers to list, those that lose the most first.",
)
@click.option("--all", "show_all", is_flag=True, help="List every layer (ranked).")
@click.option("--json", "as_json", is_flag=True)
def compare(
    candidate, reference, component, device, ep, npz, samples, seed, threshold_db, ranges, values,
    top, show_all, as_json,
):  # fmt: skip
    """Where a QDQ CANDIDATE loses precision on the target: it runs on the device's
    execution provider and on the CPU EP (float simulation of Q/DQ), every quantized
    tensor is scored against the float REFERENCE, and the layers are ranked by the
    precision they lose on the target; the first tensor where the target departs from the
    simulation is marked.

    CANDIDATE: a .onnx file, or a build's component: its folder
    (build/sam3-tiny/npu-w8a16/prompt_encoder_mask_decoder), its model.onnx, or the build
    folder with --component (a failed build's .failed folder too). REFERENCE: the float
    model; optional for a build's component (the float model the build verified against,
    from the step cache).
    """
    from winml_recipes import api

    report = api.compare(
        candidate,
        reference,
        component=component,
        device=device,
        ep=ep,
        npz=npz,
        samples=samples,
        seed=seed,
        threshold_db=threshold_db,
        ranges={k: _numbers(v, ":", k, 2) for k, v in _pairs(ranges, "--range").items()},
        values={k: _numbers(v, ",", k) for k, v in _pairs(values, "--values").items()},
    )
    if as_json:
        _echo_json(report)
        return
    from winml_recipes.console import fit_all

    for line in fit_all(compare_lines(report, threshold_db, None if show_all else top)):
        click.echo(line)


def compare_lines(report: dict[str, Any], threshold_db: float, top: int | None) -> list[str]:
    """The compare report as text: where it ran, the layers ranked by the precision they
    lose on the target (`top` of them; None: all), the first divergence."""
    placement = report.get("placement", {}).get("nodes", {})
    where = ", ".join(f"{k}: {v}" for k, v in placement.items())
    from winml_recipes.sdk.ep import ran_on_name

    lines = [
        f"ran on {ran_on_name(report)} ({where}), {report['samples']} samples; "
        f"inputs: {report['inputs_from']}"
    ]
    if report.get("build_status") == "failed":
        lines.append("note: the candidate is a failed build's evidence")
    if report.get("bisection"):
        lines.append(
            f"note: {report['bisection']['message']}; the rows below stop at "
            f"{report['compared_up_to']}, the last node before that region"
        )
    apart = report.get("tapped_vs_untapped_db")
    if apart is not None and apart < 40:
        lines.append(
            f"note: with the taps the target's final outputs are {apart:.1f} dB from the "
            "untouched model's: the EP compiled the tapped graph differently, so a divergence "
            "of the untouched graph may not show below"
        )
    if report.get("prefix_search"):
        loads = report["prefix_search"]["prefix_loads"]
        lines.append(
            f"note: the first divergence was searched on {loads} prefixes of the untouched "
            "graph (no taps), each compiled as the model is"
        )
    rows = {r["tensor"]: r for r in report["tensors"]}
    ranked = [rows[t] for t in report["ranking"]]
    first = report["first_divergence"]
    shown = ranked if top is None else ranked[:top]
    count = len(ranked)
    lines.append(
        "layers ranked by the precision they lose on the target"
        + ("" if len(shown) == count else f" (top {len(shown)} of {count}; --all for every one)")
        + "; SQNR dB vs float of their inputs (in) and output (out) on the target, out in "
        "the CPU simulation (sim), target vs simulation (t/sim)"
    )
    lines.append(
        f"  {'#':>3}  {'op':<16} {'tensor':<{_TENSOR_WIDTH}} {'in':>6} {'out':>6} "
        f"{'lost':>6} {'sim':>6} {'t/sim':>6}"
    )
    for rank, row in enumerate(ranked, 1):
        is_first = first is not None and row["tensor"] == first["tensor"]
        if row in shown or is_first:
            if row not in shown:
                lines.append("  ...")
            lines.append(_compare_row(rank, row, is_first))
    if first is None:
        lines.append(
            f"no tensor departs from the simulation by more than the {threshold_db} dB rule"
        )
    else:
        lines.append(
            f"first divergence: {first['tensor']} ({first['op_type']} {first['node']}): "
            f"{first['target_vs_float_db']:.1f} dB on the target vs "
            f"{first['simulation_vs_float_db']:.1f} dB simulated"
        )
    return lines


def _compare_row(rank: int, row: dict[str, Any], first: bool) -> str:
    name = row["tensor"]
    if len(name) > _TENSOR_WIDTH:
        name = "~" + name[-(_TENSOR_WIDTH - 1) :]
    into = "exact" if row["input_db"] is None else f"{row['input_db']:.1f}"
    mark = "  <- first divergence" if first else ""
    return (
        f"  {rank:>3}  {row['op_type'][:16]:<16} {name:<{_TENSOR_WIDTH}} {into:>6} "
        f"{row['target_vs_float_db']:6.1f} {row['lost_db']:6.1f} "
        f"{row['simulation_vs_float_db']:6.1f} {row['target_vs_simulation_db']:6.1f}{mark}"
    )


@main.command()
@click.argument("builds", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--ep", help="Execution provider key (see `passes`; default: the target's).")
@click.option("--device", help="Time on this device's EP instead (cpu, npu).")
@click.option(
    "--iterations",
    type=click.IntRange(1),
    help="Timed runs per row (default: as many as --budget holds, up to 200).",
)
@click.option(
    "--budget",
    "budget_seconds",
    default=60.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds of runs for all rows together, when --iterations is not given: each "
    "row times one run first and sizes its runs by it.",
)
@click.option("--warmup", default=5, show_default=True, type=click.IntRange(0))
@click.option(
    "-o", "--output", "output_root", default="build", type=click.Path(path_type=Path),
    show_default=True, help="Where a RECIPE's targets were built.",
)  # fmt: skip
@click.option("--catalog", "catalog_dir", type=click.Path(path_type=Path, file_okay=False),
              help="The project's catalog (input contracts).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True)
def perf(
    builds, ep, device, iterations, budget_seconds, warmup, output_root, catalog_dir, as_json
) -> None:  # fmt: skip
    """Time built targets: session creation (uncompiled vs EPContext), latency P50/P90/P99,
    throughput and peak memory, per component and for the pipeline. BUILDS: build folders
    (build/<recipe>/<device>-<precision>) or recipes (all their built targets), in one table.
    """
    from winml_recipes import api
    from winml_recipes.console import fit_all
    from winml_recipes.perf import format_table

    def say(line: str) -> None:  # estimates, before and while it runs
        for part in fit_all([line]):
            click.echo(part, err=True)

    report = api.perf(builds, ep=ep, device=device, iterations=iterations, warmup=warmup,
                      output_root=output_root, catalog_dir=catalog_dir,
                      budget_seconds=budget_seconds, say=say)  # fmt: skip
    if as_json:
        _echo_json(report)
        return
    for line in format_table(report):
        click.echo(line)


def _pairs(items: tuple[str, ...], option: str) -> dict[str, str]:
    from winml_recipes.sdk.errors import RecipeError

    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise RecipeError(f"{option} {item!r}: expected NAME=VALUE")
        out[name] = value
    return out


def _numbers(text: str, sep: str, name: str, count: int | None = None) -> tuple[float, ...]:
    from winml_recipes.sdk.errors import RecipeError

    try:
        numbers = tuple(float(x) for x in text.split(sep))
    except ValueError:
        raise RecipeError(f"{name}={text}: not numbers separated by '{sep}'") from None
    if count is not None and len(numbers) != count:
        raise RecipeError(f"{name}={text}: expected {count} numbers separated by '{sep}'")
    return numbers


EXIT_NEEDS_REWRITE = 3


@main.command()
@click.argument("model")
@click.option(
    "-o", "--output", type=click.Path(path_type=Path), help="Where to write the float model."
)
@click.option(
    "--check",
    is_flag=True,
    help=f"Write nothing; exit 0 if already float, {EXIT_NEEDS_REWRITE} if rewrites are needed.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def dequantize(model, output, check, as_json) -> None:
    """Rewrite a quantized ONNX model (QDQ, QOperator, dynamic, MatMulNBits) into float.

    MODEL is a local path or a Hub ONNX file (org/repo/path.onnx).
    """
    from winml_recipes.hub import local_model_file
    from winml_recipes.onnx.io import load_model, save_model
    from winml_recipes.outputroot import check_output_file
    from winml_recipes.quant.dequantize import dequantize_model
    from winml_recipes.sdk.errors import RecipeError

    shown, model = model, local_model_file(model)

    if not check and output is None:
        raise RecipeError("dequantize needs -o OUT.onnx (or --check to only report)")
    if output is not None and check:
        raise RecipeError("--check writes nothing: drop -o")
    if output is not None and output.resolve() == Path(model).resolve():
        raise RecipeError("-o must differ from the input model")
    if output is not None:  # a folder, read-only or full: one line before any other
        check_output_file(output, 2 * Path(model).stat().st_size + 2**20)
    float_model, report = dequantize_model(load_model(model))
    if as_json:
        _echo_json({"model": shown, **report.to_dict(), "summary": report.describe()})
    else:
        click.echo(f"{shown}: {report.describe()}")
    if check:
        sys.exit(EXIT_NEEDS_REWRITE if report.changed else 0)
    save_model(float_model, output)
    if not as_json:
        click.echo(f"wrote {output}" + ("" if report.changed else " (an unchanged copy)"))


@main.command()
@click.argument("model_ref")
@click.option("--name", help="Entry and recipe name (default: the file name).")
@click.option(
    "--catalog",
    "catalog_dir",
    default="catalog",
    type=click.Path(path_type=Path),
    show_default=True,
)
@click.option(
    "--recipes",
    "recipes_dir",
    default="recipes",
    type=click.Path(path_type=Path),
    show_default=True,
)
def init(model_ref, name, catalog_dir, recipes_dir) -> None:
    """Write a starting catalog entry, recipe and schemas in any folder (never overwrites).

    MODEL_REF: a local .onnx or HF directory, a Hub ONNX file org/repo/path.onnx, or an HF
    model id. Prints the commands that validate and build the project from here.
    """
    import yaml

    from winml_recipes.authoring import init_project, next_commands, task_line

    catalog_path, recipe_path = init_project(
        model_ref, name=name, catalog_dir=catalog_dir, recipes_dir=recipes_dir
    )
    click.echo(f"wrote {catalog_path}\nwrote {recipe_path}")
    entry = yaml.safe_load(catalog_path.read_text(encoding="utf-8"))
    click.echo(task_line(entry, change=f"the task in {catalog_path.name}"))
    for command in next_commands(catalog_path, recipe_path):
        click.echo(f"next: {command}")


@main.group()
def cache() -> None:
    """Inspect and trim the step cache ($WINML_RECIPES_CACHE or the platform's cache folder)."""


@cache.command("info")
@click.option("--json", "as_json", is_flag=True)
def cache_info(as_json) -> None:
    """Where the cache is, its entries and stored upstream outputs, and their sizes."""
    from winml_recipes.engine.cache import StepCache

    stats = StepCache().stats()
    if as_json:
        _echo_json(stats)
        return
    click.echo(
        f"{stats['root']}: {stats['entries']} step results ({stats['entry_bytes'] / 1e9:.2f} GB),"
        f" {stats['stored_outputs']} stored upstream outputs "
        f"({stats['stored_output_bytes'] / 1e9:.2f} GB)"
    )


@cache.command("prune")
@click.option("--max-size", required=True, metavar="SIZE", help="e.g. 20GB or 500MB.")
def cache_prune(max_size) -> None:
    """Delete the least recently used results until the cache fits in SIZE (run it while no
    build uses the cache)."""
    from winml_recipes.engine.budget import parse_budget
    from winml_recipes.engine.cache import StepCache

    mb = parse_budget(max_size, where="--max-size", minimum_mb=0)
    done = StepCache().prune(int(mb * 1024 * 1024))
    click.echo(
        f"removed {done['removed']} items ({done['freed_bytes'] / 1e9:.2f} GB); "
        f"{done['remaining_bytes'] / 1e9:.2f} GB left"
    )


@cache.command("verify")
def cache_verify() -> None:
    """Hash every entry against its record; damaged entries are deleted (a build then
    recomputes them; reads already refuse them)."""
    from winml_recipes.engine.cache import StepCache
    from winml_recipes.untrusted import printable

    done = StepCache().verify()
    click.echo(f"{done['intact']} entries intact, {done['removed']} damaged entries removed")
    if done["foreign"]:
        shown = ", ".join(printable(p) for p in done["foreign"][:3])
        more = f" and {len(done['foreign']) - 3} more" if len(done["foreign"]) > 3 else ""
        click.echo(
            f"warning: {len(done['foreign'])} items in the cache folder were not made by the "
            f"cache ({shown}{more}); left in place, move them out",
            err=True,
        )


@main.group()
def hub() -> None:
    """Discover ONNX files on the Hugging Face Hub."""


@hub.command("ls")
@click.argument("repo_id")
@click.option("--revision", help="Branch, tag or commit (default: main).")
@click.option("--json", "as_json", is_flag=True)
def hub_ls(repo_id, revision, as_json) -> None:
    """List a repo's .onnx files with sizes and their external-data sidecars."""
    from winml_recipes.hub import list_onnx

    entries = list_onnx(repo_id, revision)
    if as_json:
        _echo_json(
            [
                {
                    "ref": e.ref,
                    "path": e.path,
                    "size": e.size,
                    "sidecars": e.sidecars,
                    "commit": e.commit,
                }
                for e in entries
            ]
        )
        return
    # Paths come from the server: escaped, so a newline in one cannot forge a line.
    if not entries:
        click.echo(f"{printable(repo_id)}: no .onnx files")
        return
    click.echo(f"{printable(repo_id)} @ {printable(entries[0].commit)}")
    for e in entries:
        click.echo(f"  {printable(e.path):<60} {e.size / 1e6:10.2f} MB")
        for side, size in e.sidecars.items():
            click.echo(f"    + {printable(side):<58} {size / 1e6:10.2f} MB")


def _register_run_commands() -> None:
    from winml_recipes.cli_run import report_command, run_command

    main.add_command(run_command)
    main.add_command(report_command)


_register_run_commands()
