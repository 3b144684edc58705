"""`build` and `matrix`: build recipes (or an ONNX file) for their targets."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from winml_recipes.cli.app import _echo_json, main, with_executor_options, with_target_options
from winml_recipes.clihelp import LazyHelpOption
from winml_recipes.tasks import task_help


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
