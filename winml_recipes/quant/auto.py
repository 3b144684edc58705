"""Automatic mixed precision: promote the most damaging tensors until a target.

1. Score the baseline quantized model: the lowest output SQNR against the float model, on
   held-out samples (same source as calibration, other seeds), run on the target's
   execution provider (e.g. the NPU's) where it loads: the CPU EP's float simulation of
   Q/DQ can be far from what the NPU computes.
2. Rank candidates by the damage each does alone: the output SQNR with only that tensor
   quantized (winml_recipes.quant.mixed.quantization_damage; a gated float graph, so this
   ranking runs on the CPU EP). A tensor's own noise is a poor guide: SAM's prompt encoder
   turns tiny coordinate errors into large mask errors through sin/cos features, while its
   own SQNR looks fine. Two kinds of candidate:
   - activation-16bit: a quantized activation goes to `type` (ORT's fixer adds converts);
   - float-node (CPU targets): a quantized weight's readers stay in float
     (nodes_to_exclude). Ranked only when the model with every activation in float (only
     the weights quantized) misses the target: then no activation precision can reach it.
     On an NPU EP a float node would run on the CPU, so it is not a candidate there.
3. Apply the most damaging 1, 2, 4, ... more candidates, re-quantize and re-score, until the
   target is met or the budget is spent.
Each promotion (kind, round, measured damage) and each round's score goes into the manifest.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from winml_recipes.quant.config import QuantConfig, quant_rules
from winml_recipes.sdk.errors import ExecutionProviderError
from winml_recipes.sdk.types import StepContext


def _score(
    candidate: Path, feeds: list[dict], reference: list[dict], device: str, ep: str
) -> dict[str, float]:
    """Output SQNR of `candidate` run on the target's EP (the CPU simulation where it is absent)."""
    from winml_recipes.onnx.metrics import compare_runs
    from winml_recipes.runtime.target import run_on_target

    run = run_on_target(candidate, feeds, device, {"allow_cpu_fallback": True}, ep=ep)
    metrics = compare_runs(reference, run.outputs)
    return {name: round(m["sqnr_db"], 3) for name, m in metrics.items()}


def _already(overrides: dict[str, list[dict[str, Any]]], tensor: str, wide: str) -> bool:
    return any(o.get("quant_type") == wide for o in overrides.get(tensor, []))


def scored_on(ep_key: str) -> str:
    """Where candidates are scored: the target's EP when it loads here, else the simulation."""
    from winml_recipes.runtime.providers import availability, get_provider
    from winml_recipes.runtime.target import CPU_SIMULATION

    ep = get_provider(ep_key)
    return ep.key if ep.is_cpu or availability(ep.key).available else CPU_SIMULATION


class _Seconds(dict):
    """Wall seconds per phase, for the manifest (where the promotion's time goes)."""

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self[phase] = round(self.get(phase, 0.0) + time.perf_counter() - started, 3)


ACTIVATION_16BIT = "activation-16bit"  # the activation's Q/DQ pair becomes `type`
FLOAT_NODE = "float-node"  # the nodes reading a damaging weight stay in float
NO_FLOAT_ON_EP = "float-node candidates not tried: on {ep} a float node runs only with CPU fallback"


def _float_nodes_possible(ep_key: str) -> bool:
    from winml_recipes.runtime.providers import get_provider

    return get_provider(ep_key).is_cpu


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
    reference_src: Path | None = None,
) -> dict[str, Any]:
    """Improve `out` in place; returns the record of what was promoted and why.
    `reference_src`: the float model scores are against, when `src` is a rewritten or
    tuned one (quantize's algorithms)."""
    from winml_recipes.feeds import take
    from winml_recipes.onnx.io import load_model
    from winml_recipes.quant.mixed import quantization_damage, weight_readers
    from winml_recipes.quant.ort import quantize_static_qdq
    from winml_recipes.runtime.sessions import run_model

    assert cfg.auto is not None
    shared = shared or []
    target = float(cfg.auto["target_sqnr_db"])
    budget = int(cfg.auto["max_promoted"])
    wide = cfg.auto["type"]
    eval_feeds = take(held_out, int(cfg.auto["samples"]))
    seconds = _Seconds()
    with seconds("reference"):
        reference = run_model(reference_src or src, eval_feeds)
    device, ep = ctx.target.device, cfg.ep
    rules = quant_rules(cfg)
    floats = _float_nodes_possible(ep)
    with seconds("scoring"):
        scores = _score(out, eval_feeds, reference, device, ep)
    rounds: list[dict[str, Any]] = [{"round": 0, "promoted": 0, "output_sqnr_db": scores}]
    record: dict[str, Any] = {
        "target_sqnr_db": target,
        "max_promoted": budget,
        "type": wide,
        "scored_on": scored_on(ep),
        "ranked_on": "cpu-simulation",
        "candidate_kinds": [ACTIVATION_16BIT, *([FLOAT_NODE] if floats else [])],
        "seconds": seconds,
    }
    if not floats:
        record["reason"] = NO_FLOAT_ON_EP.format(ep=ep)
    if min(scores.values()) >= target:
        return record | {"promoted": [], "rounds": rounds, "met": True}
    if cfg.activation_type == wide and not floats:
        # Promoting to the type every activation already has changes nothing.
        return record | {
            "promoted": [],
            "rounds": rounds,
            "met": False,
            "reason": f"every activation is already {wide}: nothing to promote; "
            + NO_FLOAT_ON_EP.format(ep=ep),
        }
    with seconds("ranking"):
        weights_only, act_damage, weight_damage = quantization_damage(
            out, src, eval_feeds, reference, ctx.work_dir, weights_below=target if floats else None
        )
    record["output_sqnr_db_weights_only"] = round(weights_only, 2)
    readers = weight_readers(load_model(out, load_external_data=False)) if floats else {}
    damage: dict[tuple[str, str], float] = {}
    if cfg.activation_type != wide:
        damage |= {(ACTIVATION_16BIT, t): d for t, d in act_damage.items() if t not in overrides}
    damage |= {
        (FLOAT_NODE, w): d
        for w, d in weight_damage.items()
        if readers.get(w) and not set(readers[w]) <= set(exclude)
    }
    # Most damaging first, by the damage as the manifest states it (0.01 dB): ties (a tensor
    # and its exact copy) keep name order, whatever the kernels' rounding (stacked runs).
    # Weights (ranked only when the weights alone miss the target, which then floors every
    # activation's score) come before activations.
    candidates = sorted(damage, key=lambda c: (c[0] != FLOAT_NODE, round(damage[c], 2)))
    if not candidates:
        record["reason"] = (
            f"no candidate: every activation is already {wide} or overridden, and the "
            "weights alone meet the target"
        )
    promoted: list[tuple[str, str]] = []
    round_of: dict[tuple[str, str], int] = {}
    trial = ctx.work_dir / "promoted.onnx"
    group_of = {t: g for g in shared for t in g}
    best = ctx.work_dir / "promoted-best.onnx"
    improved = False
    step = 1
    while min(scores.values()) < target and len(promoted) < budget and candidates:
        k = min(step, budget - len(promoted), len(candidates))
        batch, candidates = candidates[:k], candidates[k:]
        # Tensors that must share one encoding on the target are promoted together.
        batch = list(
            dict.fromkeys(
                (kind, m)
                for kind, t in batch
                for m in (group_of.get(t, [t]) if kind == ACTIVATION_16BIT else [t])
            )
        )
        candidates = [c for c in candidates if c not in batch]
        # a group member a region already made `wide` changes nothing: not counted
        batch = [
            c for c in batch if not (c[0] == ACTIVATION_16BIT and _already(overrides, c[1], wide))
        ]
        if not batch:
            continue
        chosen = [*promoted, *batch]
        trial_overrides = {
            **overrides,
            **{t: [{"quant_type": wide}] for kind, t in chosen if kind == ACTIVATION_16BIT},
        }
        trial_exclude = list(
            dict.fromkeys(
                [*exclude, *(n for kind, w in chosen if kind == FLOAT_NODE for n in readers[w])]
            )
        )
        with seconds("requantizing"):
            quantize_static_qdq(src, trial, cfg, ranges_path, trial_overrides, trial_exclude, rules)
        added = [t for _, t in batch]
        try:
            with seconds("scoring"):
                trial_scores = _score(trial, eval_feeds, reference, device, ep)
        except ExecutionProviderError as exc:
            # The target cannot build this mix of types: keep the last good model, go on.
            rounds.append(
                {
                    "round": len(rounds),
                    "promoted": len(promoted),
                    "rejected": added,
                    "error": exc.message,
                }
            )
            step *= 2
            continue
        promoted += batch
        round_of |= dict.fromkeys(batch, len(rounds))
        scores = trial_scores
        rounds.append(
            {
                "round": len(rounds),
                "promoted": len(promoted),
                "added": added,
                "output_sqnr_db": scores,
            }
        )
        shutil.copyfile(trial, best)
        improved = True
        step *= 2
    if improved:
        shutil.copyfile(best, out)
    return record | {
        "promoted": [_entry(c, damage.get(c), round_of[c], wide, readers) for c in promoted],
        "rounds": rounds,
        "met": min(scores.values()) >= target,
    }


def _entry(
    candidate: tuple[str, str],
    damage: float | None,
    round_no: int,
    wide: str,
    readers: dict[str, list[str]],
) -> dict[str, Any]:
    """One promotion as the manifest states it: what, how, when, and the damage it measured."""
    kind, tensor = candidate
    entry: dict[str, Any] = {
        "tensor": tensor,
        "kind": kind,
        "to": wide if kind == ACTIVATION_16BIT else "float",
        "round": round_no,
        "output_sqnr_db_if_only_this_is_quantized": None if damage is None else round(damage, 2),
    }
    if kind == FLOAT_NODE:
        entry["nodes"] = readers[tensor]
    return entry
