"""The gates a judging step holds a model to, built one way for everyone who applies them.

`verify` holds the candidate to per-output thresholds (SQNR, cosine, max_abs; a probability
map to the IoU of its decisions) and to the task metric's gates. A step before it that
chooses between candidates (quantize's `mode: auto`) is given the same gates when planning
(`Pass.held_to`, `Pass.with_later_steps`), so it does not keep a candidate those gates
would withhold, a recipe's own stricter thresholds included. (verify's checks of the float
reference, of onnxruntime's default level and of two-tower agreement are its own.)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from winml_recipes.sdk.config import option
from winml_recipes.sdk.errors import PassError, PlanError
from winml_recipes.sdk.gates import THRESHOLD_METRICS, Gate, gates_for
from winml_recipes.sdk.metrics import TaskMetric
from winml_recipes.sdk.types import PlanContext


@dataclass(frozen=True)
class Thresholds:
    min_sqnr_db: float | None = option(None, "Minimum SQNR in dB.")
    min_cosine: float | None = option(None, minimum=-1, maximum=1)
    max_abs: float | None = option(None, "Maximum absolute error.", minimum=0)


THRESHOLDS = tuple(f.name for f in fields(Thresholds))


@dataclass(frozen=True)
class HeldTo:
    """What verify holds a candidate to (its options of the same names). Written by hand,
    an unset threshold gates nothing: verify's own defaults (30 dB, 0.99) are not implied."""

    min_sqnr_db: float | None = option(None, "Minimum SQNR in dB.")
    min_cosine: float | None = option(None, minimum=-1, maximum=1)
    max_abs: float | None = option(None, "Maximum absolute error.", minimum=0)
    probability_decision_iou: float | None = option(
        None, "A probability map's decision IoU, instead of SQNR and cosine.", minimum=0,
        maximum=1,
    )  # fmt: skip
    outputs: Mapping[str, Thresholds] | None = option(None, "Per-output thresholds.")
    task: Mapping[str, float] | None = option(
        None, "Gates on the task metric. Default: the metric's own."
    )
    task_decides: bool = option(False, "The task metric's gates decide; the others advise.")


def held_to_options(config: Any) -> dict[str, Any]:
    """A judging step's config (verify's: fields named as HeldTo's) as HeldTo options."""
    out: dict[str, Any] = {f.name: getattr(config, f.name) for f in fields(HeldTo)}
    out["outputs"] = {
        name: {k: getattr(t, k) for k in THRESHOLDS if getattr(t, k) is not None}
        for name, t in (config.outputs or {}).items()
    } or None
    out["task"] = dict(config.task) if config.task is not None else None
    return {k: v for k, v in out.items() if v is not None}


def output_gates(
    metrics: Mapping[str, Mapping[str, float]],
    limits: Mapping[str, float | None],
    per_output: Mapping[str, Mapping[str, float | None]] | None,
    probability_decision_iou: float | None,
) -> list[Gate]:
    """Every output's gates: `limits` (THRESHOLDS names), an output's own where
    `per_output` sets them, a probability map's decision IoU where asked for."""
    out: list[Gate] = []
    for name, m in metrics.items():
        here = {k: limits.get(k) for k in THRESHOLDS}
        auto = probability_decision_iou
        if per_output and name in per_output:
            given = per_output[name]
            here |= {k: given.get(k) for k in THRESHOLDS if given.get(k) is not None}
            auto = None  # the recipe said what this output is held to
        out.extend(gates_for(name, m, here, probability_decision_iou=auto))
    return out


def task_gates(
    metric: TaskMetric,
    values: Mapping[str, float],
    wanted: Mapping[str, float] | None,
    where: str = "verify.task",
) -> list[Gate]:
    """The task metric's gates: `wanted` (name -> threshold; the option at `where`), else
    the metric's defaults."""
    if wanted is None:
        wanted = {k: g.threshold for k, g in metric.gates.items()}
    unknown = sorted(set(wanted) - set(values))
    if unknown:
        raise PassError(
            f"{where}: {metric.name} has no {', '.join(unknown)}; it gives {', '.join(values)}"
        )
    return [
        Gate("task", k, values[k], float(t), k not in metric.lower_is_better)
        for k, t in wanted.items()
    ]


def check_output_names(names: Iterable[str], ctx: PlanContext, where: str) -> None:
    """Each of `names` is an output of the component (a PlanError naming the closest)."""
    import difflib

    known = [s.name for s in ctx.contract.outputs]
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise PlanError(
                f"{where}: '{name}' is not an output of {ctx.component}{hint}; "
                f"outputs: {', '.join(known)}"
            )


def judged(
    held: Mapping[str, Any],
    metric: TaskMetric | None,
    task_values: Mapping[str, float] | None,
    output_metrics: Mapping[str, Mapping[str, float]],
) -> list[Gate]:
    """The gates verify would decide by, from HeldTo options `held`: the task metric's
    (where there is one) and the outputs' (advisory where the task decides)."""
    limits = {k: held.get(k) for k in THRESHOLD_METRICS}
    gates = output_gates(output_metrics, limits, held.get("outputs"),
                         held.get("probability_decision_iou"))  # fmt: skip
    if metric is None or task_values is None:
        return gates
    task = task_gates(metric, task_values, held.get("task"), "quantize.held_to.task")
    if held.get("task_decides") and task:
        gates = [replace(g, advisory=True) for g in gates]
    return [*task, *gates]
