"""`algorithms: auto`: quantize with each candidate combination, score each on held-out
samples on the target's EP (the CPU simulation where the EP is absent) against the float
model: by the catalog task's metric where one applies (what verify gates on), else by the
lowest output SQNR; keep the best, the one with fewer algorithms on a tie, within a time
budget. The record says what was tried, what each scored and took, and why the kept one
was kept. A failure that is not about quality (a candidate that fails to quantize, or that
the target cannot load: an NPU's finalize error) ends the search there: the remaining
candidates are recorded as skipped, never run (the target's failure is verify's to name).

The algorithms change weights; with 8-bit weights per channel at every precision, what
uint8 loses against w8a16 is mostly its activation ranges. So where calibration is min/max
(the default), auto then tries percentile activation ranges (outliers clipped) with plain
weights and with the best combination so far; a candidate with clipped ranges counts one
algorithm more on a tie. On the real-model corpus this is what brings ddddocr-det's box F1
from 0.958 to w8a16's 0.986 on HTP, where no weight algorithm moved it."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx

from winml_recipes.sdk.errors import ExecutionProviderError, PassError

# A candidate beats one with fewer algorithms only when it is better by this much: the
# algorithms change the model, and a tie is no reason to. Output SQNR in dB; task metric
# values (agreements, IoUs, cosines: fractions) absolute.
MIN_GAIN_DB = 0.1
MIN_GAIN_TASK = 1e-3
# The activation ranges auto tries besides min/max (calibration.method; its default
# percentile, 99.999 % of each activation's values kept).
CLIPPED_RANGES = "percentile"


def candidates(model: onnx.ModelProto) -> tuple[list[tuple[str, ...]], dict[str, bool]]:
    """Combinations worth trying on `model` (graph only), plain min/max first."""
    import onnx_ir as ir

    from winml_recipes.quant.algorithms import cle, smoothquant
    from winml_recipes.quant.algorithms.layers import weight_layers

    irm = ir.serde.deserialize_model(model)
    has = {
        "cle": bool(cle._pairs(irm.graph)),
        "smoothquant": bool(smoothquant.sites(irm)),
        "weights": bool(weight_layers(model)),
    }
    out: list[tuple[str, ...]] = [()]
    if has["weights"]:
        out.append(("bias_correction",))
    if has["cle"]:
        out += [("cle",), ("cle", "bias_correction")]
    if has["smoothquant"]:
        out.append(("smoothquant",))
    if has["weights"]:
        out.append(("seqmse", "bias_correction"))
        if has["cle"]:
            out.append(("cle", "seqmse", "bias_correction"))
        if has["smoothquant"]:
            out.append(("smoothquant", "seqmse", "bias_correction"))
    return out, has


def choose(
    float_src: Path,
    out: Path,
    graph: onnx.ModelProto,
    attempt: Callable[[tuple[str, ...], Path, Path, str | None], Any],
    held_out,
    cfg,
    ctx,
) -> tuple[Any, dict[str, Any]]:
    """The best candidate quantized at `out` (its attempt's result) and the record.
    `attempt(algorithms, dest, work, ranges)` quantizes one candidate; `ranges` is a
    calibration method replacing the configured one, or None."""
    from winml_recipes.feeds import take
    from winml_recipes.quant.auto import scored_on
    from winml_recipes.runtime.sessions import run_model
    from winml_recipes.sdk.metrics import metric_for

    assert cfg.algorithms_auto is not None
    budget = float(cfg.algorithms_auto["budget_seconds"])
    started = time.perf_counter()
    combos, has = candidates(graph)
    feeds = take(held_out, int(cfg.algorithms_auto["samples"]))
    reference = run_model(float_src, feeds)
    metric = metric_for(ctx.task, ctx.contract)
    tried: list[dict[str, Any]] = []
    scored: list[tuple[tuple[float, ...], Any, Path, tuple[str, ...], str | None]] = []
    gain = MIN_GAIN_TASK if metric else MIN_GAIN_DB

    clip = cfg.calibration is not None and cfg.calibration.method == "minmax"
    planned = len(combos) + (1 if clip else 0)
    stopped: list[str] = []  # a failure that is not about quality: no further candidates

    def run(i: int, combo: tuple[str, ...], ranges: str | None) -> None:
        entry: dict[str, Any] = {"algorithms": list(combo)}
        if ranges:
            entry["ranges"] = ranges
        if stopped:
            tried.append(entry | {"skipped": "the search stopped at a failure"})
            return
        if i and time.perf_counter() - started > budget:
            tried.append(entry | {"skipped": "time budget spent"})
            return
        ctx.progress("algorithm candidates", i + 1, planned)
        work = ctx.work_dir / f"candidate-{i}"
        dest = work / "model.onnx"
        t0 = time.perf_counter()
        try:
            done = attempt(combo, dest, work, ranges)
            outputs, fallback = _run(dest, feeds, ctx.target.device, cfg.ep)
        except (ExecutionProviderError, PassError) as exc:
            if not i:
                raise
            tried.append(entry | {"error": exc.message[:200]})
            stopped.append(f"candidate {i} failed: {_first_line(exc.message)}")
            return
        if fallback:
            entry["cpu_fallback"] = fallback
        if isinstance(fallback, str):  # the target cannot load it: verify says where and why
            stopped.append(f"candidate {i} does not run on the target ({fallback})")
        entry["output_sqnr_db"] = _sqnr(reference, outputs)
        if metric is not None:
            entry["task_metric"] = metric.values(reference, outputs)
        entry["seconds"] = round(time.perf_counter() - t0, 1)
        tried.append(entry)
        scored.append((_key(entry, metric), done, dest, combo, ranges))

    for i, combo in enumerate(combos):
        run(i, combo, None)
    if clip:  # clipped activation ranges, with plain weights and with the best so far
        best_combo = _best(scored, gain)[3]
        clipped = [(), best_combo] if best_combo else [()]
        planned = len(combos) + len(clipped)
        for j, combo in enumerate(clipped):
            run(len(combos) + j, combo, CLIPPED_RANGES)
    by = _ranking(metric)
    worst_key, done, dest, combo, ranges = _best(scored, gain)
    shutil.copyfile(dest, out)
    for sidecar in dest.parent.glob(dest.name + "*data"):
        shutil.copyfile(sidecar, out.parent / sidecar.name)
    plain = scored[0][0]  # the first candidate: plain min/max (it raises when it fails)
    record = {
        "mode": "auto",
        "scored_on": scored_on(cfg.ep),
        "score": by,
        "applies_to": {k: v for k, v in has.items()},
        "tried": tried,
        "kept": list(combo),
        "kept_ranges": ranges or cfg.calibration.method,
        "why": _why(combo, ranges, worst_key, plain, by, metric),
        **({"stopped": stopped[0]} if stopped else {}),
        "budget_seconds": budget,
        "seconds": round(time.perf_counter() - started, 1),
        **done.algorithms,
    }
    return done, record


def _run(candidate: Path, feeds: list[dict], device: str, ep: str) -> tuple[list[dict], bool | str]:
    """`candidate`'s outputs on the target's EP (the CPU simulation where it is absent), and
    whether nodes fell back to the CPU: on the EP alone first, as verify runs it and as it is
    deployed. With fallback allowed, an NPU EP may leave the graph's input QuantizeLinear and
    output DequantizeLinear to the CPU, whose rounding differs: mtcnn-pnet's box F1 moved
    by 0.017 between the two, enough to rank the candidates differently.

    When the EP cannot load the candidate even with fallback (a graph HTP cannot finalize),
    the candidates are scored on the CPU EP's simulation (the reason is returned): the
    target's failure is verify's to diagnose, with its failing region and next step, the
    same at every precision (it was a bare EP error inside quantize at uint8 only, where
    the preset scores algorithms on the target)."""
    from winml_recipes.runtime.sessions import run_model
    from winml_recipes.runtime.target import run_on_target

    try:
        return run_on_target(candidate, feeds, device, ep=ep).outputs, False
    except ExecutionProviderError:
        pass
    try:
        run = run_on_target(candidate, feeds, device, {"allow_cpu_fallback": True}, ep=ep)
        return run.outputs, True
    except ExecutionProviderError as exc:
        return run_model(candidate, feeds), f"scored on the CPU EP: {_first_line(exc.message)}"


def _first_line(message: str) -> str:
    return (message.strip().splitlines() or ["failed"])[0][:200]


def _sqnr(reference: list[dict], outputs: list[dict]) -> dict[str, float]:
    from winml_recipes.onnx.metrics import compare_runs

    return {n: round(m["sqnr_db"], 3) for n, m in compare_runs(reference, outputs).items()}


def _gated(metric) -> list[str]:
    """The task metric's values auto ranks by: those verify gates on by default."""
    return list(metric.gates) or [k for k in metric.lower_is_better]


def _ranking(metric) -> str:
    if metric is None:
        return "lowest output SQNR (dB) against the float model on held-out samples"
    return (
        f"task metric {metric.name} ({', '.join(_gated(metric))}) against the float model on "
        "held-out samples"
    )


def _key(entry: dict[str, Any], metric) -> tuple[float, ...]:
    """Higher is better, compared in order: the task metric's gated values, else the
    lowest output SQNR."""
    if metric is None:
        return (min(entry["output_sqnr_db"].values()),)
    values = entry["task_metric"]
    return tuple(-values[k] if k in metric.lower_is_better else values[k] for k in _gated(metric))


def _better(a: tuple[float, ...], b: tuple[float, ...], gain: float) -> bool:
    """`a` beats `b`: better by more than `gain` on the first value where they differ."""
    for x, y in zip(a, b, strict=True):
        if abs(x - y) > gain:
            return x > y
    return False


def _best(scored: list, gain: float):
    """The best scored candidate; on a tie (within `gain`) the one with fewer algorithms
    (clipped ranges count as one)."""
    # stable: the trying order on equal counts
    ranked = sorted(scored, key=lambda s: len(s[3]) + bool(s[4]))
    best = ranked[0]
    for s in ranked[1:]:
        if _better(s[0], best[0], gain):
            best = s
    return best


def _why(combo, ranges, key, plain, by: str, metric) -> str:
    if not combo and not ranges:
        return f"nothing beat the plain min/max ranges by {by}"
    values = ", ".join(f"{v:.4g}" for v in key)
    plain_values = ", ".join(f"{v:.4g}" for v in plain)
    unit = "" if metric else " dB"
    gain = f"{MIN_GAIN_TASK:g}" if metric else f"{MIN_GAIN_DB:g} dB"
    what = f" ({ranges} activation ranges)" if ranges else ""
    return (
        f"best{what} by {by}: {values}{unit} against plain min/max's {plain_values}{unit}; "
        f"candidates with fewer algorithms were not within {gain} of it"
    )
