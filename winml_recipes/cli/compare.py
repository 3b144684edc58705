"""`compare`: where a QDQ model loses precision on the target, layer by layer."""

from __future__ import annotations

from typing import Any

import click

from winml_recipes.cli.app import _echo_json, main

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
