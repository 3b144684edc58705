"""`perf`: time built models on their execution providers."""

from __future__ import annotations

from pathlib import Path

import click

from winml_recipes.cli.app import _echo_json, main


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
