"""Automatic mixed precision: promote the noisiest activations to 16 bit until a target.

1. Score the baseline quantized model: the lowest output SQNR against the float model, on
   held-out samples (same source as calibration, other seeds), run on the target's
   execution provider (QNN HTP for npu) where it loads: the CPU EP's float simulation of
   Q/DQ can be far from what the NPU computes.
2. Rank its quantized activations by the damage each does alone: the output SQNR with only
   that activation quantized (winml_recipes.quant.mixed.quantization_damage; a gated
   float graph, so this ranking runs on the CPU EP). A tensor's
   own noise is a poor guide: SAM's prompt encoder turns tiny coordinate errors into large
   mask errors through sin/cos features, while its own SQNR looks fine.
3. Promote the most damaging 1, 2, 4, ... more tensors to 16 bit (ORT's fixer adds the
   converts), re-quantize and re-score, until the target is met or the budget is spent.
Each promotion and each round's score goes into the manifest.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from winml_recipes.quant.config import QuantConfig
from winml_recipes.sdk.errors import ExecutionProviderError
from winml_recipes.sdk.types import StepContext


def _score(
    candidate: Path, feeds: list[dict], reference: list[dict], device: str
) -> dict[str, float]:
    """Output SQNR of `candidate` run on the device's EP (the CPU simulation where it is absent)."""
    from winml_recipes.onnx.metrics import compare_runs
    from winml_recipes.runtime.target import run_on_target

    run = run_on_target(candidate, feeds, device, {"allow_cpu_fallback": True})
    metrics = compare_runs(reference, run.outputs)
    return {name: round(m["sqnr_db"], 3) for name, m in metrics.items()}


def _already(overrides: dict[str, list[dict[str, Any]]], tensor: str, wide: str) -> bool:
    return any(o.get("quant_type") == wide for o in overrides.get(tensor, []))


def scored_on(device: str) -> str:
    """Where candidates are scored: the device's EP when it loads here, else the simulation."""
    from winml_recipes.runtime.providers import availability, provider_for_device
    from winml_recipes.runtime.target import CPU_SIMULATION

    ep = provider_for_device(device)
    return ep.key if ep.is_cpu or availability(ep.key).available else CPU_SIMULATION


def promote(
    src: Path,
    out: Path,
    cfg: QuantConfig,
    ranges_path: Path,
    overrides: dict[str, list[dict[str, Any]]],
    exclude: list[str],
    held_out,
    ctx: StepContext,
    shared: list[list[str]] | None = None,
) -> dict[str, Any]:
    """Improve `out` in place; returns the record of what was promoted and why."""
    from winml_recipes.feeds import take
    from winml_recipes.quant.mixed import quantization_damage
    from winml_recipes.quant.ort import quantize_static_qdq
    from winml_recipes.runtime.sessions import run_model

    assert cfg.auto is not None
    shared = shared or []
    target = float(cfg.auto["target_sqnr_db"])
    budget = int(cfg.auto["max_promoted"])
    wide = cfg.auto["type"]
    eval_feeds = take(held_out, int(cfg.auto["samples"]))
    reference = run_model(src, eval_feeds)
    device = ctx.target.device
    scores = _score(out, eval_feeds, reference, device)
    rounds = [{"promoted": 0, "output_sqnr_db": scores}]
    record: dict[str, Any] = {
        "target_sqnr_db": target,
        "max_promoted": budget,
        "type": wide,
        "scored_on": scored_on(device),
        "ranked_on": "cpu-simulation",
    }
    if min(scores.values()) >= target:
        return record | {"promoted": [], "rounds": rounds, "met": True}
    if cfg.activation_type == wide:
        # Promoting to the type every activation already has changes nothing.
        return record | {
            "promoted": [],
            "rounds": rounds,
            "met": False,
            "reason": f"every activation is already {wide}: nothing to promote",
        }
    weights_only, damage = quantization_damage(out, src, eval_feeds, reference, ctx.work_dir)
    record["output_sqnr_db_weights_only"] = round(weights_only, 2)
    candidates = sorted((t for t in damage if t not in overrides), key=lambda t: damage[t])
    promoted: list[str] = []
    trial = ctx.work_dir / "promoted.onnx"
    group_of = {t: g for g in shared for t in g}
    best = ctx.work_dir / "promoted-best.onnx"
    improved = False
    step = 1
    while min(scores.values()) < target and len(promoted) < budget and candidates:
        k = min(step, budget - len(promoted), len(candidates))
        batch, candidates = candidates[:k], candidates[k:]
        # Tensors that must share one encoding on the target are promoted together.
        batch = list(dict.fromkeys(m for t in batch for m in group_of.get(t, [t])))
        candidates = [t for t in candidates if t not in batch]
        # a group member a region already made `wide` changes nothing: not counted
        batch = [t for t in batch if not _already(overrides, t, wide)]
        if not batch:
            continue
        trial_overrides = {
            **overrides,
            **{t: [{"quant_type": wide}] for t in [*promoted, *batch]},
        }
        quantize_static_qdq(src, trial, cfg, ranges_path, trial_overrides, exclude)
        try:
            trial_scores = _score(trial, eval_feeds, reference, device)
        except ExecutionProviderError as exc:
            # The target cannot build this mix of types: keep the last good model, go on.
            rounds.append({"promoted": len(promoted), "rejected": batch, "error": exc.message})
            step *= 2
            continue
        promoted += batch
        scores = trial_scores
        rounds.append({"promoted": len(promoted), "output_sqnr_db": scores})
        shutil.copyfile(trial, best)
        improved = True
        step *= 2
    if improved:
        shutil.copyfile(best, out)
    return record | {
        "promoted": [
            {
                "tensor": t,
                "to": wide,
                "output_sqnr_db_if_only_this_is_quantized": (
                    round(damage[t], 2) if t in damage else None
                ),
            }
            for t in promoted
        ],
        "rounds": rounds,
        "met": min(scores.values()) >= target,
    }
