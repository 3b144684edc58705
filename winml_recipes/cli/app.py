"""The command group every command module registers on: options shared by several commands,
errors mapped to one line and an exit code."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from winml_recipes.sdk.errors import WinmlError
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
