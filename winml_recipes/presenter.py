"""What the console says about a build, from its typed manifest records.

Each line follows from what a step's record holds (a calibration source, where it was
verified, gates, torch parity, compiled artifacts, a skip reason), never from the name of
the pass that wrote it: a third-party pass that records the same facts is shown alike.
cli/build.py parses arguments and prints these lines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from winml_recipes.sdk.errors import WinmlError
from winml_recipes.sdk.gates import Gate
from winml_recipes.sdk.records import Manifest, StepRecord
from winml_recipes.standin import random_weights_note


def summary_lines(manifest: Manifest, output_dir: Path | str) -> list[str]:
    """The summary of a successful build: per component its size, steps and what they
    measured; then where the deployable files are and what to run next."""
    m = manifest
    lines = [
        f"built {m.recipe.name} for {m.target.device}/{m.target.precision}"
        f" in {m.wall_seconds or 0:.1f}s -> {output_dir}"
    ]
    random = random_weights_note(m.catalog, m.source)
    if random:
        lines.append(f"  note: {random}")
    for name, comp in m.components.items():
        statuses = " ".join(f"{s.pass_name}:{s.status}" for s in comp.steps)
        size = (comp.artifact.size_bytes if comp.artifact else 0) / 1e6
        lines.append(f"  {name}: {size:.2f} MB  [{statuses}]")
        for s in comp.steps:
            lines += [f"    {line}" for line in step_lines(s)]
    return lines + next_lines(output_dir)


def _repair_line(repair: dict) -> str:
    """What the divergence repair did: the layers it changed, the outputs before/after."""

    def worst(side: str) -> float:
        return min(repair[side]["target_vs_simulation_db"].values())

    done = ", ".join(f"{r['tensor']} ({r['node']}): {r['repair']}" for r in repair["repaired"])
    head = f"repaired where the target departed: {done}" if done else "no repair kept"
    tail = f"target vs simulation {worst('before'):.1f} -> {worst('after'):.1f} dB"
    return f"{head}; {tail}" + ("; still departs" if repair.get("still_departs") else "")


def step_lines(s: StepRecord) -> list[str]:
    """What one step's record says worth a line (its metrics, its skip reason)."""
    metrics = s.measured
    out = []
    if metrics.get("calibration_source"):
        out.append(f"calibrated on {data_line(metrics, 'calibration')}")
    choice = metrics.get("format_choice") or {}
    if choice.get("kept") not in (None, "static"):
        out.append(f"quantized {choice['kept']}: {choice.get('why', '')}")
    repair = metrics.get("divergence_repair") or {}
    if repair.get("repaired") or repair.get("still_departs"):
        out.append(_repair_line(repair))
    if metrics.get("verified_on"):
        out.append(f"verified on {where_verified(metrics)}")
        out.append(f"verified with {data_line(metrics, 'verify')}")
        if metrics.get("calibration_overlap_allowed"):
            out.append(
                "warning: verified on data that may hold calibration samples "
                "(allow_calibration_overlap): unseen data may do worse"
            )
        if metrics.get("data_capped"):
            out.append(f"note: {metrics['data_capped']}")
        if metrics.get("output_shapes_declared"):
            out.append(advisory_shapes_line(metrics["output_shapes_declared"]))
    if "compiled_vs_uncompiled" in metrics and s.status != "skipped":
        agree = metrics["compiled_vs_uncompiled"]
        names = ", ".join(a.name for a in s.artifacts or ())
        parts = s.split_parts
        if parts:
            crossing = "; ".join(_names(p.inputs) for p in parts[1:])
            out.append(
                f"compiled in {len(parts)} parts ({metrics['split'].get('why')}), one "
                f"EPContext node each; between them: {crossing}"
            )
        if agree is None:  # compile: {samples: 0}
            detail = "loaded back on the EP with every node there; not run"
        else:
            same = "bit-exact" if agree.get("bit_exact") else f"max_abs {agree.get('max_abs')}"
            whole = f"the {len(parts)} uncompiled parts" if parts else "the uncompiled model"
            detail = f"{same} vs {whole} on the EP"
        out.append(f"compiled: {names} ({detail})")
    parity = metrics.get("torch_parity")
    if parity:
        worst = min(p["sqnr_db"] for p in parity.values())
        out.append(f"export matches torch: SQNR >= {worst:.1f} dB on every output")
    if s.status == "skipped":  # every skip says why, on a terminal or not
        out.append(f"{s.pass_name} skipped: {s.reason or ''}")
    if s.verified and metrics.get("task_metric"):
        out.append(task_line(metrics["task_metric"], s.gates))
    if s.verified and metrics.get("zero_shot"):
        out.append(zero_shot_line(metrics["zero_shot"], metrics.get("cpu_simulation"), s.gates))
    if s.verified:
        out += [output_line(o, met, s.gates) for o, met in (metrics.get("outputs") or {}).items()]
    return out


def _names(names: tuple[str, ...], shown: int = 3) -> str:
    """Tensor names from a model, printable, the first `shown` of them."""
    from winml_recipes.untrusted import printable

    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(printable(n) for n in names[:shown]) + more


def advisory_shapes_line(shapes: dict[str, dict[str, list]]) -> str:
    """One line: the outputs whose declared shape the float model's run contradicts."""
    parts = [f"'{n}' {s['declared']} declared, {s['ran']} run" for n, s in shapes.items()]
    return (
        "note: the model file declares output shapes its float run contradicts ("
        + "; ".join(parts)
        + "); verified at the shapes the float model runs"
    )


def next_lines(output_dir: Path | str) -> list[str]:
    """Where the deployable files are, and the commands that run and time them."""
    from winml_recipes.buildfolder import open_build

    try:
        build = open_build(output_dir)
    except WinmlError:
        return []
    folder = Path(output_dir)
    files = [c.deployable.relative_to(folder).as_posix() for c in build.components]
    inputs = {s.name: s for c in build.components for s in c.inputs}
    if any(s.image is not None for s in inputs.values()):
        data = "--image PHOTO.jpg" + (" --point X,Y" if "input_points" in inputs else "")
    else:
        data = "--npz INPUTS.npz"
    where = quoted(str(folder))
    return [
        f"deploy: {', '.join(files)} (in {where}, with the files beside them)",
        f"next: winml-recipes run {where} {data}; winml-recipes perf {where}",
    ]


def quoted(path: str) -> str:
    return f'"{path}"' if " " in path else path


def task_line(task: dict[str, Any], gates: list[Gate]) -> str:
    """The task metric's values, each gated one with its verdict."""
    held = {g.metric: g for g in gates if g.output == "task"}
    parts = [
        held[k].line(with_output=False) if k in held else f"{k} {v:.4g}"
        for k, v in task["values"].items()
    ]
    return f"{task['task']} ({task['metric']}): " + ", ".join(parts)


def zero_shot_line(record: dict[str, Any], simulated: dict | None, gates: list[Gate]) -> str:
    """The two towers judged together (verify.zero_shot_with): the gated agreement, and
    the CPU simulation's beside it where there is one."""
    values = record["values"]
    held = next((g for g in gates if g.output == "zero-shot"), None)
    top1 = held.line(with_output=False) if held else ""
    decided = int(values["decisive_images"])
    top1 += f"; all images {values['top1_agreement']:.4g}, {decided} decided by float"
    sim = (simulated or {}).get("zero_shot")
    beside = f", CPU simulation {sim['top1_agreement_decisive']:.4g}" if sim else ""
    return (
        f"zero-shot with {record['with']}: {top1}{beside}, {int(values['images'])} images x "
        f"{int(values['labels'])} prompts"
    )


def output_line(output: str, metrics: dict[str, Any], gates: list[Gate]) -> str:
    """One output's metrics, each gated one with its threshold, margin and verdict."""
    held = {g.metric: g for g in gates if g.output == output}
    kind = next((g.kind for g in held.values() if g.kind), None)
    shown = {
        "sqnr_db": f"SQNR {metrics['sqnr_db']:.1f} dB",
        "cosine": f"cosine {metrics['cosine']:.5f}",
        "max_abs": f"max_abs {metrics['max_abs']:.3g}",
    }
    for metric in ("decision_iou", "argmax_agreement"):  # shown where they gate
        if metric in held:
            shown[metric] = ""
    parts = [held[m].line(with_output=False) if m in held else text for m, text in shown.items()]
    return f"{output}{f' ({kind})' if kind else ''}: " + ", ".join(parts)


def data_line(metrics: dict[str, Any], step: str) -> str:
    """What the samples were: `npz: calib.npz (16 samples)`, or synthetic and what that means."""
    if step == "calibration":
        source, count = metrics["calibration_source"], metrics.get("calibration_samples")
    else:
        source = metrics.get("data_source") or "synthetic (seeded)"
        count = metrics.get("data_samples", metrics.get("samples"))
    text = f"{source} ({count} samples)"
    if source.startswith("synthetic"):
        text += ": quality on real data unknown"
    return text


def where_verified(metrics: dict[str, Any]) -> str:
    """The EP (with its library versions and node placement) the outputs were measured on."""
    ep = metrics.get("execution_provider", {})
    where = metrics["verified_on"]
    if where == "cpu-simulation":
        if ep.get("available"):
            return f"cpu-simulation: {ep.get('reason')}"
        return f"cpu-simulation: {ep.get('provider')} is not available here ({ep.get('reason')})"
    from winml_recipes.sdk.ep import ran_on_name

    versions = ", ".join(f"{k} {v}" for k, v in ep.get("versions", {}).items())
    nodes = metrics.get("placement", {}).get("nodes", {})
    placed = ", ".join(f"{k} {v} nodes" for k, v in nodes.items())
    return f"{ran_on_name(metrics)} ({versions})" + (f": {placed}" if placed else "")
