"""`algorithms: auto`: quantize with each candidate combination, score each on held-out
samples on the target's EP (output SQNR against the float model; the CPU simulation where
the EP is absent), keep the best, within a time budget. The record says what was tried,
what each scored and took, and why the kept one was kept."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx

from winml_recipes.sdk.errors import ExecutionProviderError, PassError

# A candidate replaces the plain one only when it is better by this much (dB): the
# algorithms change the model, and a tie is no reason to.
MIN_GAIN_DB = 0.1


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
    attempt: Callable[[tuple[str, ...], Path, Path], Any],
    held_out,
    cfg,
    ctx,
) -> tuple[Any, dict[str, Any]]:
    """The best candidate quantized at `out` (its attempt's result) and the record."""
    from winml_recipes.feeds import take
    from winml_recipes.quant.auto import _score, scored_on
    from winml_recipes.runtime.sessions import run_model

    assert cfg.algorithms_auto is not None
    budget = float(cfg.algorithms_auto["budget_seconds"])
    started = time.perf_counter()
    combos, has = candidates(graph)
    feeds = take(held_out, int(cfg.algorithms_auto["samples"]))
    reference = run_model(float_src, feeds)
    tried: list[dict[str, Any]] = []
    best: tuple[float, Any, Path, tuple[str, ...]] | None = None
    for i, combo in enumerate(combos):
        if i and time.perf_counter() - started > budget:
            tried.append({"algorithms": list(combo), "skipped": "time budget spent"})
            continue
        ctx.progress("algorithm candidates", i + 1, len(combos))
        work = ctx.work_dir / f"candidate-{i}"
        dest = work / "model.onnx"
        t0 = time.perf_counter()
        entry: dict[str, Any] = {"algorithms": list(combo)}
        try:
            done = attempt(combo, dest, work)
            scores = _score(dest, feeds, reference, ctx.target.device, cfg.ep)
        except (ExecutionProviderError, PassError) as exc:
            if not combo:
                raise
            tried.append(entry | {"error": exc.message[:200]})
            continue
        worst = min(scores.values())
        entry |= {"output_sqnr_db": scores, "seconds": round(time.perf_counter() - t0, 1)}
        tried.append(entry)
        if best is None or worst > best[0] + MIN_GAIN_DB:
            best = (worst, done, dest, combo)
    assert best is not None
    worst, done, dest, combo = best
    shutil.copyfile(dest, out)
    for sidecar in dest.parent.glob(dest.name + "*data"):
        shutil.copyfile(sidecar, out.parent / sidecar.name)
    record = {
        "mode": "auto",
        "scored_on": scored_on(cfg.ep),
        "score": "lowest output SQNR (dB) against the float model on held-out samples",
        "applies_to": {k: v for k, v in has.items()},
        "tried": tried,
        "kept": list(combo),
        "why": (
            "the plain min/max ranges scored best"
            if not combo
            else f"best lowest output SQNR ({worst:.2f} dB), ahead of plain min/max by more "
            f"than {MIN_GAIN_DB} dB"
        ),
        "budget_seconds": budget,
        "seconds": round(time.perf_counter() - started, 1),
        **done.algorithms,
    }
    return done, record
