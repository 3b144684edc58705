"""`run` and `report`: run a build on real inputs, write its report again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from winml_recipes.cli.app import main


@click.command("run")
@click.argument("build", type=click.Path(path_type=Path, exists=True))
@click.option(
    "--image",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="A photo, preprocessed as the catalog says (default: a bundled held-out one).",
)
@click.option(
    "--point",
    "points",
    multiple=True,
    metavar="X,Y[,LABEL]",
    help="SAM prompt point in the photo's pixels; label 1 foreground (default), 0 "
    "background. Repeatable.",
)
@click.option(
    "--box",
    "boxes",
    multiple=True,
    metavar="X1,Y1,X2,Y2",
    help="SAM prompt box in the photo's pixels.",
)
@click.option(
    "--npz",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="Arrays named like the model's inputs (they win over --image and prompts).",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    help="Folder for outputs.npz, summary.json and the PNG (default: BUILD/run).",
)
@click.option(
    "--compiled/--uncompiled",
    default=None,
    help="Run model_ctx.onnx (the EPContext model) or model.onnx (default: the "
    "compiled one where there is one and the EP loads).",
)
@click.option("--device", help="With a RECIPE: the target device.")
@click.option("--precision", help="With a RECIPE: the target precision.")
@click.option(
    "--ep", metavar="NAME", help="With a RECIPE: the target's execution provider (e.g. openvino)."
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def run_command(
    build, image, points, boxes, npz, output, compiled, device, precision, ep, as_json
) -> None:  # fmt: skip
    """Run BUILD (a build folder, or a RECIPE file whose target is built first, from the
    cache) on a photo, SAM prompts or an npz: every component in order on the target's
    execution provider, and the float model on the CPU EP; writes the outputs, a JSON
    summary and, for image tasks, a PNG of both results and their difference."""
    from winml_recipes import api
    from winml_recipes.console import fit_all

    if build.is_file():
        build = api.build(build, device=device, precision=precision, ep=ep).output_dir

    def say(line: str) -> None:  # the cost on the target, before it starts
        for part in fit_all([line]):
            click.echo(part, err=True)

    summary = api.run(build, image=image, points=points, boxes=boxes, npz=npz,
                      output_dir=output, compiled=compiled, say=say)  # fmt: skip
    if as_json:
        click.echo(json.dumps(summary, indent=2, default=str))
        return
    for line in fit_all(summary_lines(summary)):
        click.echo(line)


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """What a run printed: where each component ran, the task metric, output SQNRs."""
    from winml_recipes.sdk.ep import ran_on_name

    target = summary["target"]
    ran = ", ".join(
        f"{name} on {ran_on_name(r)} ({Path(r['model']).name})"
        for name, r in summary["target_run"].items()
    )
    label = "/".join(target[k] for k in ("device", "precision", "ep") if target.get(k))
    lines = [f"ran {label}: {ran}"]
    if "float_run" in summary:
        lines[0] += "; float reference on cpu"
    task = summary.get("task_metric")
    if task:
        values = ", ".join(f"{k} {v:.4g}" for k, v in task["values"].items())
        lines.append(f"  {task['task']} ({task['metric']}): {values}")
    for comp, outputs in summary.get("components", {}).items():
        parts = ", ".join(
            f"{n} SQNR {m['sqnr_db']:.1f} dB cosine {m['cosine']:.5f}" for n, m in outputs.items()
        )
        lines.append(f"  {comp}: {parts}")
    lines += [f"  note: {n}" for n in summary.get("notes", [])]
    written = [summary.get("picture"), summary["outputs"]]
    lines.append("wrote " + ", ".join(str(w) for w in written if w))
    return lines


@click.command("report")
@click.argument("build", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option(
    "--layers/--no-layers",
    default=None,
    help="Compute the per-layer SQNR comparison (default: only for quantized npu "
    "builds whose models are small).",
)
def report_command(build, layers) -> None:
    """Write BUILD/report.html again: one self-contained page (no network) with the
    verdicts, metrics, a per-layer SQNR plot, the run pictures, placement, step times."""
    from winml_recipes import api

    def say(line: str) -> None:  # what it is doing, while it works
        click.echo(line, err=True)

    click.echo(f"wrote {api.report(build, layers=layers, say=say)}")


main.add_command(run_command)
main.add_command(report_command)
