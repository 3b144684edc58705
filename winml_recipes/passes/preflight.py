"""preflight: open each component on the target's EP before any calibration (fail fast).

An EP that can fail to finalize a graph it accepted node by node (its plugin's
`may_fail_to_finalize`: an NPU's memory-allocation error that names no node) is
met here, once the float graph is prepared: the model is quantized as the component's
`quantize` step will quantize it, but calibrated on a few samples: of its own calibration
data, or synthetic ones from the I/O contract where that data is another component's
outputs (seconds, not the half hour a full-size encoder's real calibration takes), then
opened on the target's EP with the CPU fallback
the later steps allow. Where it fails, the graph is bisected to the failing region as
`verify` does, and the build stops with that error before any expensive step: the pass is
`fail_fast`, so the engine runs every component's steps up to it first. The placement
(nodes per EP, nodes the EP refused) is recorded.

A few samples' ranges are not the real calibration's: a graph that finalizes here can still fail at
`verify` (where the real encodings decide). This catches what
the graph's structure decides, early; verify and compile still check the real model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from winml_recipes.quant.config import CalibrationConfig, MixedAuto, QuantizeOptions
from winml_recipes.sdk.config import option
from winml_recipes.sdk.errors import ExecutionProviderError, PassError
from winml_recipes.sdk.passes import Pass, register
from winml_recipes.sdk.target import Target
from winml_recipes.sdk.types import LaterStep, ModelFacts, StepContext, StepResult

if TYPE_CHECKING:
    from collections.abc import Sequence

    from winml_recipes.sdk.estimates import EstimateInputs, MemoryEstimate

NOTHING_OPENS = (
    "no later step opens the model on the target's execution provider (verify with "
    "on_target: false, no compile): nothing to check before calibration"
)


@dataclass(frozen=True)
class PreflightConfig:
    samples: int = option(
        2,
        "Calibration samples for the quick quantization: the first of the quantize step's "
        "own data, or synthetic ones (the I/O contract's; the bundled photographs for one "
        "image input) where it calibrates on another component's outputs.",
        minimum=1,
        maximum=16,
    )
    seed: int = option(0, minimum=0)
    quantize: QuantizeOptions | None = option(
        None,
        "How to quantize before opening. Default: as the component's quantize step does "
        "(its options, without automatic mixed precision and without inputs_from "
        "calibration data); none when no quantize step follows.",
    )
    allow_cpu_fallback: bool | None = option(
        None,
        "Let nodes the EP refuses run on the CPU EP. Default: what the later steps that open "
        "the model on the target allow (verify's allow_cpu_fallback; compile allows none).",
    )


@register
class PreflightPass(Pass[PreflightConfig]):
    name = "preflight"
    version = 1
    summary = (
        "Before any calibration: quantize quickly on a few samples and open the model on the "
        "target's EP (a graph it cannot finalize fails the build in seconds, bisected)."
    )
    uses_contract = True
    once_per_component = True
    fail_fast = True

    def skip_reason(self, facts: ModelFacts, config: PreflightConfig, target: Target) -> str | None:
        from winml_recipes.services.runtime import provider_for

        ep = provider_for(target)
        if not ep.may_fail_to_finalize:
            return f"{ep.key} does not fail graphs at finalization: nothing to check early"
        return None

    def with_later_steps(
        self, options: dict[str, Any], later: Sequence[LaterStep]
    ) -> tuple[dict[str, Any], str | None]:
        running = [s for s in later if s.skip is None]
        opening = [s for s in running if s.impl.opens_on_target(s.config)]
        if not opening:
            return options, NOTHING_OPENS
        out = dict(options)
        if out.get("allow_cpu_fallback") is None:
            out["allow_cpu_fallback"] = all(s.impl.allows_cpu_fallback(s.config) for s in opening)
        quantizer = next((s for s in running if "integer" in s.impl.makes), None)
        if out.get("quantize") is None and quantizer is not None:
            # quantize's own options (QuantizeOptions), less what needs another component's
            # outputs (its calibration's inputs_from) or many runs (automatic mixed precision)
            out["quantize"] = {
                k: v
                for k, v in quantizer.options.items()
                if not (k == "calibration" and (v or {}).get("inputs_from"))
                and not (k == "mixed_precision" and _is_auto(v))
            }
        return out, None

    def key_material(self, config: PreflightConfig, ctx: StepContext) -> Any:
        from winml_recipes.services.presets import device_settings, precision_settings
        from winml_recipes.services.runtime import identity, provider_for
        from winml_recipes.services.samples import upstream_data_digest

        ep = provider_for(ctx.target)
        cal = _quick(config).calibration if config.quantize is not None else None
        options = {k: v for k, v in vars(cal).items() if v is not None} if cal else None
        # what the presets and the EP's rules put into the quantization (as quantize's key)
        preset: dict[str, Any] = {
            "device": device_settings(ctx.target.device).get("quantize"),
            "precision": precision_settings(ctx.target.precision),
        }
        if ep.quant_rules is not None:  # their code is not in the pass's digest
            rules = ep.quant_rules
            preset["ep_rules"] = [type(rules).__module__, type(rules).__qualname__, rules.name]
        return {
            "data": upstream_data_digest(options, {}, ctx.recipe_dir),  # its files' digests
            "execution_provider": identity(ep.key),
            "preset": preset,
        }

    def estimate_memory(
        self, src: Path, config: PreflightConfig, inputs: EstimateInputs
    ) -> MemoryEstimate | None:
        from winml_recipes.passes.quantize import QuantizePass
        from winml_recipes.services.memory import forward_estimate, larger

        load = forward_estimate(src, inputs.contract, "session on the target")
        if config.quantize is None:
            return load
        quick = QuantizePass().estimate_memory(src, _quick(config), replace(inputs, upstream={}))
        return larger(load, quick)

    def run(
        self, src: Path | None, out_dir: Path, config: PreflightConfig, ctx: StepContext
    ) -> StepResult:
        from winml_recipes.services.runtime import identity, provider_for, skip_if_unavailable

        assert src is not None
        ep = provider_for(ctx.target)
        if (skipped := skip_if_unavailable(ep)) is not None:
            return skipped
        fallback = bool(config.allow_cpu_fallback)
        metrics: dict[str, Any] = {
            "execution_provider": identity(ep.key),  # as verify and compile record it
            "cpu_fallback_allowed": fallback,
        }
        model = src
        if config.quantize is not None:
            model, metrics["quantized"] = _quantize(src, config, ctx)
        started = time.perf_counter()
        metrics |= _open(model, ep, fallback, metrics.get("quantized"), ctx)
        metrics["open_seconds"] = round(time.perf_counter() - started, 3)
        return StepResult(None, metrics)


def _is_auto(value: Any) -> bool:
    return isinstance(value, MixedAuto) or (isinstance(value, dict) and "auto" in value)


def _quick(config: PreflightConfig) -> QuantizeOptions:
    """The quantize options calibrated on `samples` samples: of the component's own
    calibration data where it has some, else synthetic (from the I/O contract)."""
    assert config.quantize is not None
    own = config.quantize.calibration
    if own is None or own.inputs_from:
        calibration = CalibrationConfig(samples=config.samples, seed=config.seed)
    else:
        calibration = replace(own, samples=min(own.samples, config.samples))
    return replace(config.quantize, calibration=calibration)


def _quantize(src: Path, config: PreflightConfig, ctx: StepContext) -> tuple[Path, dict[str, Any]]:
    """The model quantized on synthetic samples (in the step's scratch folder) and what
    that took; the model itself where there is nothing to quantize."""
    from winml_recipes.passes.quantize import QuantizePass

    work = ctx.work_dir / "quick-quantize"
    (work / "scratch").mkdir(parents=True)
    # No upstream, no stored outputs: this calibration feeds nobody.
    quick_ctx = replace(
        ctx, work_dir=work / "scratch", upstream={}, feeds_downstream=False, store=None
    )
    started = time.perf_counter()
    result = QuantizePass().run(src, work, _quick(config), quick_ctx)
    seconds = round(time.perf_counter() - started, 3)
    if result.skipped or result.model is None:
        return src, {"skipped": result.skipped, "seconds": seconds}
    m = result.metrics
    record = {
        "samples": m.get("calibration_samples"),
        "source": m.get("calibration_source"),
        "activation_type": m.get("activation_type"),
        "weight_type": m.get("weight_type"),
        "seconds": seconds,
    }
    return result.model, record


def _open(
    model: Path, ep: Any, fallback: bool, quantized: dict[str, Any] | None, ctx: StepContext
) -> dict[str, Any]:
    """Open `model` on the target's EP: its placement; a failure bisected to the failing
    region (as verify does), kept on the CPU when fallback is allowed and that loads."""
    from winml_recipes.services.runtime import explain, open_session

    device = ctx.target.device
    try:
        session = open_session(model, ep.key, fallback=fallback, device=device)
    except ExecutionProviderError as exc:
        explained = explain(exc, model, ep.key, fallback=fallback, progress=ctx.progress)
        cpu = explained.data.get("cpu_op_affinity") or {}
        if not (fallback and cpu.get("loads")):
            raise _failed(explained, quantized) from None
        pinned = ep.cpu_pinning(cpu["op_types"], Path(ctx.work_dir))
        session = open_session(model, ep.key, fallback=True, provider_options=pinned, device=device)
        record = {"cpu_op_affinity": {**cpu, "bisection": explained.data.get("bisection")}}
    else:
        record = {}
    assert session.placement is not None
    placement = session.placement.to_manifest()
    return {
        "placement": placement,
        "refused_nodes": len(session.placement.fallback_nodes),
        **record,
    }


def _failed(error: ExecutionProviderError, quantized: dict[str, Any] | None) -> PassError:
    """The EP's error (bisected), said as the early check it is, with its data kept."""
    how = "as it is"
    if quantized and quantized.get("samples"):
        synthetic = str(quantized.get("source", "")).startswith("synthetic")
        kind = "synthetic sample(s)" if synthetic else "sample(s) of its calibration data"
        how = f"quantized on {quantized['samples']} {kind}"
    return PassError(
        f"the model ({how}) cannot be opened on the target, checked before any calibration: "
        f"{error.message}",
        where=error.where,
        data=error.data,
        metrics=dict(error.data),
    )
