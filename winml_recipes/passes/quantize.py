"""quantize: static QDQ (real calibration, the EP's rules, mixed precision) or dynamic.

The options are the project's one quantization config (winml_recipes.quant.config);
precision and device presets fill what the recipe leaves out.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from winml_recipes.quant.config import (
    AlgorithmsAuto,
    MixedAuto,
    QuantConfig,
    QuantizeOptions,
    quant_rules,
    resolve,
)
from winml_recipes.sdk.ep import get_ep
from winml_recipes.sdk.errors import PlanError
from winml_recipes.sdk.passes import Pass, check_component, model_file, register
from winml_recipes.sdk.target import Target
from winml_recipes.sdk.types import (
    DataRead,
    LaterStep,
    ModelFacts,
    PlanContext,
    StepContext,
    StepResult,
)
from winml_recipes.services.presets import precisions_of_kind

if TYPE_CHECKING:
    from winml_recipes.sdk.estimates import EstimateInputs, MemoryEstimate

MATMUL_CONV = ("MatMul", "Conv", "Gemm", "ConvTranspose")
# Automatic mixed precision scores candidates on samples calibration never saw.
HELD_OUT_SEED_OFFSET = 104_729
# Where automatic mixed precision may take its held-out scoring data from.
HELD_OUT_KEYS = ("npz", "images", "dataset")


def held_out_skip(own: bool, cal_options: Mapping[str, Any], cal_samples: int) -> int:
    """Samples a held-out read skips: none from its own data or from bundled/synthetic data
    (which have a held-out set of their own: a skip would empty it); calibration's count
    when it reads the calibration files (the samples after calibration's)."""
    from_files = any(cal_options.get(k) for k in HELD_OUT_KEYS)
    return cal_samples if from_files and not own else 0


@register
class QuantizePass(Pass[QuantizeOptions]):
    name = "quantize"
    version = 11  # 11: mode auto (static, else dynamic where static misses the task)
    summary = "Static (calibrated QDQ, the EP's rules, mixed precision) or dynamic quantization."
    precisions = precisions_of_kind("integer")
    uses_contract = True
    once_per_component = True  # one component is quantized once
    needs_float_input = True
    makes = frozenset({"integer"})
    sample_inputs = "calibration"  # an inputs_from component calibrates as this one did

    def check(self, config: QuantizeOptions, ctx: PlanContext) -> None:
        from winml_recipes.sdk.held_to import check_output_names

        cfg = resolve(config, ctx.target)
        cal = cfg.calibration
        _check_data(cfg.held_out or {}, ctx, "quantize.held_out")
        check_output_names(
            (cfg.held_to or {}).get("outputs") or {}, ctx, "quantize.held_to.outputs"
        )
        if cal is not None and cal.inputs_from:
            check_component(cal.inputs_from, ctx, "quantize.calibration.inputs_from")
        if cal is not None and cal.npz:
            from winml_recipes.services.samples import check_npz, check_npz_values, npz_files

            files = npz_files(cal.npz, ctx.recipe_dir)
            check_npz(files, ctx.contract)
            check_npz_values(files, ctx.contract)  # an Inf would leave the model float
        if cal is not None and cal.images:
            from winml_recipes.services.samples import image_files

            image_files(cal.images, ctx.recipe_dir)
        if cal is not None and cal.dataset:
            from winml_recipes.services.samples import check_split, open_split

            check_split(open_split(cal.dataset, ctx.recipe_dir), ctx.contract)

    def with_later_steps(
        self, options: dict[str, Any], later: Sequence[LaterStep]
    ) -> tuple[dict[str, Any], str | None]:
        """mode auto is held to the gates of the step that judges its model (verify's,
        a recipe's own thresholds included), unless the recipe gives `held_to` itself."""
        if options.get("mode") != "auto" or options.get("held_to") is not None:
            return options, None
        for step in later:
            held = step.impl.held_to(step.config) if step.skip is None else None
            if held is not None:
                return {**options, "held_to": held}, None
        return options, None

    def data_reads(self, config: QuantizeOptions) -> list[DataRead]:
        cal = config.calibration
        reads: list[DataRead] = []
        if config.mode == "auto" and config.held_out is not None:
            own = {k: getattr(config.held_out, k) for k in HELD_OUT_KEYS}
            own = {k: v for k, v in own.items() if v}
            if own:
                reads.append(DataRead("held_out", own, 0, FORMAT_CHOICE_SAMPLES))
        if cal is None or config.mode == "dynamic":
            return reads
        source = {k: getattr(cal, k) for k in HELD_OUT_KEYS if getattr(cal, k)}
        if source:
            reads.insert(0, DataRead("calibration", source, 0, cal.samples))
        auto = config.mixed_precision
        if isinstance(auto, MixedAuto):
            own = {k: getattr(auto.auto, k) for k in HELD_OUT_KEYS if getattr(auto.auto, k)}
            if own:
                reads.append(DataRead("held_out", own, auto.auto.skip, auto.auto.samples))
        algos = config.algorithms
        if isinstance(algos, AlgorithmsAuto):
            own = {k: getattr(algos, k) for k in HELD_OUT_KEYS if getattr(algos, k)}
            if own:
                reads.append(DataRead("held_out", own, 0, algos.samples))
        return reads

    def depends_on(self, config: QuantizeOptions) -> tuple[str, ...]:
        cal = config.calibration
        return (cal.inputs_from,) if cal is not None and cal.inputs_from else ()

    def key_material(self, config: QuantizeOptions, ctx: StepContext) -> Any:
        from winml_recipes.services.presets import device_settings, precision_settings
        from winml_recipes.services.runtime import identity, provider_for
        from winml_recipes.services.samples import upstream_data_digest

        data = upstream_data_digest(calibration_options(config), ctx.upstream, ctx.recipe_dir)
        # what the presets fill in (per_channel, types) is not in the step's options
        preset = {
            "device": device_settings(ctx.target.device).get("quantize"),
            "precision": precision_settings(ctx.target.precision),
        }
        rules = provider_for(ctx.target).quant_rules
        if rules is not None:  # the EP's rules (their code is not in the pass's digest)
            preset["ep_rules"] = [type(rules).__module__, type(rules).__qualname__, rules.name]
            if rules.revision:
                preset["ep_rules"].append(rules.revision)
        scored = (
            isinstance(config.mixed_precision, MixedAuto)
            or config.algorithms == "auto"
            or config.mode == "auto"
        )
        if config.mode == "auto":  # what it scores on and by decides the model
            held_out = vars(config.held_out) if config.held_out is not None else None
            data["held_out"] = upstream_data_digest(held_out, ctx.upstream, ctx.recipe_dir)
            data["task"] = ctx.task
        if not (scored or isinstance(config.algorithms, AlgorithmsAuto)):
            return {"data": data, "preset": preset}
        # Automatic mixed precision scores candidates on the target's EP where it loads.
        ep = identity(provider_for(ctx.target).key)
        return {"data": data, "preset": preset, "scored_on": ep}

    def estimate_memory(
        self, src: Path, config: QuantizeOptions, inputs: EstimateInputs
    ) -> MemoryEstimate | None:
        from winml_recipes.sdk.estimates import MemoryEstimate
        from winml_recipes.services.memory import (
            RUNTIME_MB,
            forward_estimate,
            larger,
            rewrite_estimate,
        )

        cfg = resolve(config, inputs.target)
        insertion = rewrite_estimate(src, "QDQ insertion", INSERTION_WEIGHT_FACTOR)
        if cfg.calibration is None:
            return insertion
        calibration = forward_estimate(src, inputs.contract, "calibration forward")
        for name, (model, up_contract) in inputs.upstream.items():
            # On a store miss the upstream model runs beside the calibration session.
            up = forward_estimate(model, up_contract, f"{name} forward")
            calibration = MemoryEstimate(
                calibration.mb + up.mb - RUNTIME_MB, f"{calibration.made_of}; {up.made_of}"
            )
        best = larger(calibration, insertion)
        assert best is not None
        return MemoryEstimate(
            best.mb,
            best.made_of,
            "calibration memory does not grow with the sample count; a smaller model or "
            "input shape (catalog dims) lowers it",
        )

    def skip_reason(self, facts: ModelFacts, config: QuantizeOptions, target: Target) -> str | None:
        if facts.quantized:
            return f"source already quantized ({facts.quant_summary})"
        return None

    def facts_after(self, facts: ModelFacts, config: QuantizeOptions) -> ModelFacts:
        # Quantized here, for this target's types (what a source had no longer applies).
        return facts.evolve(
            quantized=True,
            quant_summary="quantized by this build",
            activation_dtypes=(),
            weight_dtypes=(),
        )

    def run(
        self, src: Path | None, out_dir: Path, config: QuantizeOptions, ctx: StepContext
    ) -> StepResult:
        from winml_recipes.quant.ort import quantizable_op_types
        from winml_recipes.services.models import load_model

        assert src is not None
        cfg = resolve(config, ctx.target)
        model = load_model(src, load_external_data=False)
        wanted = set(cfg.op_types) or quantizable_op_types()
        if not any(n.op_type in wanted for n in model.graph.node):
            return StepResult(
                skipped=f"nothing to quantize: no {', '.join(sorted(MATMUL_CONV))}"
                " or other quantizable nodes"
            )
        exclude = _excluded(model, cfg)
        out = model_file(out_dir)
        if cfg.mode == "dynamic":
            return _dynamic(src, out, cfg, exclude)
        if cfg.mode == "auto":
            return _static_or_dynamic(src, out, cfg, exclude, ctx)
        return _static(src, out, cfg, exclude, ctx)


def _check_data(source: Mapping[str, Any], ctx: PlanContext, where: str) -> None:
    """An npz / images / dataset data source exists and fits the model (at plan time)."""
    from winml_recipes.services import samples

    if source.get("npz"):
        files = samples.npz_files(source["npz"], ctx.recipe_dir, where)
        samples.check_npz(files, ctx.contract, where)
        samples.check_npz_values(files, ctx.contract, where)
    if source.get("images"):
        samples.image_files(source["images"], ctx.recipe_dir)
    if source.get("dataset"):
        samples.check_split(samples.open_split(source["dataset"], ctx.recipe_dir), ctx.contract)


def _excluded(model, cfg: QuantConfig) -> list[str]:
    from winml_recipes.quant.mixed import match_nodes

    return match_nodes(cfg.exclude, model, "quantize.exclude") if cfg.exclude else []


def _dynamic(src: Path, out: Path, cfg: QuantConfig, exclude: list[str]) -> StepResult:
    from winml_recipes.quant.ort import quantize_dynamic_integer
    from winml_recipes.quant.report import quantization_report
    from winml_recipes.services.models import load_model

    started = time.perf_counter()
    quantize_dynamic_integer(src, out, cfg, exclude)
    seconds = time.perf_counter() - started
    report = quantization_report(load_model(src), load_model(out))
    _require_quantized(report, [], cfg)
    return StepResult(out, _base_metrics(cfg) | report | {"qdq_insertion_time_seconds": seconds})


# Held-out samples `mode: auto` scores the static model on (as `algorithms: auto` does).
FORMAT_CHOICE_SAMPLES = 8


def _held_out_feeds(ctx: StepContext, source: dict[str, Any], seed: int, samples: int,
                    skip: int):  # fmt: skip
    """The held-out samples the automatic choices score on: `source` (a held-out option's
    own data, else calibration's) with the held-out seed; `skip` leaves out calibration's
    samples when they come from the calibration files."""
    from winml_recipes.services.samples import feeds_for

    return feeds_for(
        source, ctx.contract, ctx.recipe_dir, ctx.upstream, samples,
        seed + HELD_OUT_SEED_OFFSET, ctx.store, for_calibration=True, skip=skip, held_out=True,
    )  # fmt: skip


def _static_or_dynamic(
    src: Path, out: Path, cfg: QuantConfig, exclude: list[str], ctx: StepContext
) -> StepResult:
    """`mode: auto`: the static model, or a dynamic one where static misses the task on
    held-out samples (quant/format_choice.py)."""
    from winml_recipes.quant.format_choice import Judge, choose_format
    from winml_recipes.sdk.metrics import metric_for
    from winml_recipes.services.samples import outputs_for, take

    static_cfg = replace(cfg, mode="static")
    cal = static_cfg.calibration
    assert cal is not None
    cal_options = {k: v for k, v in vars(cal).items() if v is not None}
    metric = metric_for(ctx.task, ctx.contract)
    # held to verify's gates where a verify step follows, else the task metric's defaults
    judge = Judge(metric, cfg.held_to) if metric is not None or cfg.held_to else None
    held_out: list = []
    unscored = None
    own = cfg.held_out or {}
    if judge is not None:
        skip = held_out_skip(bool(own), cal_options, cal.samples)
        try:
            held_out = take(
                _held_out_feeds(ctx, own or cal_options, cal.seed + ctx.seed,
                                FORMAT_CHOICE_SAMPLES, skip),
                FORMAT_CHOICE_SAMPLES,
            )  # fmt: skip
        except PlanError as exc:
            if own:  # the recipe's own held-out data: its error is the user's to see
                raise
            # the calibration files hold no more samples than calibration reads
            unscored = f"no held-out samples to score on ({exc.message}); set quantize.held_out"
            judge = None

    def reference() -> list:
        # kept in the store by content: verify reads the same float outputs for the same
        # inputs (the bundled held-out sets, --eval-data) instead of running the model again
        return outputs_for(src, ctx.input_digest, held_out, ctx.store, keep=True)

    kept, record = choose_format(
        out,
        ctx.work_dir,
        lambda dest: _static(src, dest, static_cfg, exclude, ctx).metrics,
        lambda dest, dyn: _dynamic(src, dest, dyn, exclude).metrics,
        held_out,
        reference,
        judge,
        cfg,
        ctx.target.device,
        ctx.progress,
    )
    if unscored is not None:
        record["why"] = f"static QDQ kept unscored: {unscored}"
    return StepResult(out, kept | {"format_choice": record})


def _static(
    src: Path, out: Path, cfg: QuantConfig, exclude: list[str], ctx: StepContext
) -> StepResult:
    from winml_recipes.quant.report import quantization_report
    from winml_recipes.services.models import load_model
    from winml_recipes.services.samples import UpstreamFeeds, describe_source, feeds_for

    cal = cfg.calibration
    assert cal is not None
    cal_options = {k: v for k, v in vars(cal).items() if v is not None}
    seed = cal.seed + ctx.seed  # the recipe's seed shifts every step's seed
    feeds = feeds_for(
        cal_options,
        ctx.contract,
        ctx.recipe_dir,
        ctx.upstream,
        cal.samples,
        seed,
        ctx.store,
        for_calibration=True,
    )
    model = load_model(src)
    upgraded = _upgrade_opset(model, cfg)
    if upgraded is not None:
        from winml_recipes.services.models import save_model

        model = upgraded
        src = save_model(model, ctx.work_dir / "opset-upgraded" / "model.onnx")
    rules = quant_rules(cfg)
    # the EP's float rewrites (e.g. HTP's): metrics of what they changed
    ep_metrics: dict[str, Any] = rules.before_calibration(model) if rules is not None else {}
    if _changed(ep_metrics):
        from winml_recipes.services.models import save_model

        src = save_model(model, ctx.work_dir / "float-simplified" / "model.onnx")
    float_src = src  # what the quantized model is judged against
    counted = _Counted(feeds, lambda seen: ctx.progress("calibration samples", seen, cal.samples))
    keep = None
    if ctx.store is not None and ctx.feeds_downstream:
        from winml_recipes.services.samples import store_outputs

        store = ctx.store

        # The float model's outputs for these samples are what a downstream component
        # calibrates on (inputs_from): kept under the digest of this step's input model.
        def keep(feed, outputs):
            store_outputs(store, ctx.input_digest, feed, outputs)

    def held_out_feeds(samples: int, own: dict[str, Any], skip: int):
        return _held_out_feeds(ctx, own or cal_options, seed, samples, skip)

    algorithms_record: dict[str, Any] | None = None
    if cfg.algorithms_auto is not None:
        own_held_out = {k: v for k in HELD_OUT_KEYS if (v := cfg.algorithms_auto.get(k))}
        skip_held_out = held_out_skip(bool(own_held_out), cal_options, cal.samples)
        from winml_recipes.quant.algorithms.choose import choose

        def attempt(
            algorithms: tuple[str, ...], dest: Path, work: Path, ranges: str | None
        ) -> _Quantized:
            tried = cfg if ranges is None else replace(cfg, calibration=replace(cal, method=ranges))
            return _quantize_with(
                float_src, load_model(float_src), dest, tried, algorithms, exclude, counted,
                ctx, work, keep if work.name == "candidate-0" else None,
            )  # fmt: skip

        done, algorithms_record = choose(
            float_src, out, load_model(float_src, load_external_data=False), attempt,
            held_out_feeds(int(cfg.algorithms_auto["samples"]), own_held_out, skip_held_out),
            cfg, ctx,
        )  # fmt: skip
        keep = None
    else:
        done = _quantize_with(
            float_src, model, out, cfg, cfg.algorithms, exclude, counted, ctx, ctx.work_dir, keep
        )
        if cfg.algorithms:
            algorithms_record = {"applied": list(cfg.algorithms), **done.algorithms}
    ep_metrics.update(done.ep_metrics)
    metrics: dict[str, Any] = {
        # auto may keep a candidate calibrated with another method (clipped ranges)
        "calibration_method": (algorithms_record or {}).get("kept_ranges", cal.method),
        "calibration_source": describe_source(cal_options, ctx.contract, held_out=False),
        "calibration_samples": counted.max_seen,
        "calibration_time_seconds": round(done.calibration_seconds, 3),
        "qdq_insertion_time_seconds": round(done.insertion_seconds, 3),
        "tensor_overrides": sorted(done.overrides),
        "float_nodes": done.exclude,
        # activations with infinite values (additive masks): no range, left in float
        "kept_float_nonfinite": done.nonfinite,
        # activations holding sentinels (float32-min attention masks): range clamped
        "clamped_sentinels": done.sentinels,
        # onnxruntime's quantizer's mistakes repaired in the written graph (validity.py)
        "quantizer_repairs": done.repairs,
        # what the EP's quantization rules changed (shared encodings, widened ranges, ...)
        **ep_metrics,
    }
    if algorithms_record is not None:
        metrics["algorithms"] = algorithms_record
    if isinstance(feeds, UpstreamFeeds):
        metrics["upstream_forwards"] = {"computed": feeds.computed, "reused": feeds.reused}
    if cfg.auto is not None:
        from winml_recipes.quant.auto import promote

        own = {k: cfg.auto[k] for k in HELD_OUT_KEYS if cfg.auto.get(k)}
        # its own data: as told; else as algorithms: auto (bundled speech has 4 held-out
        # clips: skipping the calibration count emptied them, "no input samples")
        skip = cfg.auto.get("skip", 0) if own else held_out_skip(False, cal_options, cal.samples)
        held_out = held_out_feeds(cfg.auto["samples"], own, skip)
        metrics["mixed_precision_auto"] = promote(
            done.src,
            out,
            cfg,
            done.ranges_path,
            done.overrides,
            done.exclude,
            held_out,
            ctx,
            ep_metrics.get("shared_encodings"),
            reference_src=float_src,
        ) | {
            "held_out_data": _held_out_name(
                own, cal_options, seed + HELD_OUT_SEED_OFFSET, ctx.contract
            )
        }
    float_model = load_model(float_src)
    _require_quantized(quantization_report(float_model, load_model(out)), done.nonfinite, cfg,
                       metrics, float_model)  # fmt: skip
    if cfg.repair_divergence and cfg.format == "qdq":
        repaired = _repair(float_src, out, cfg, done, held_out_feeds, cal_options, cal, ctx)
        if repaired is not None:
            metrics["divergence_repair"] = repaired
    report = quantization_report(float_model, load_model(out))
    return StepResult(out, _base_metrics(cfg) | report | metrics)


# A quantized target whose MatMul/Conv nodes are mostly left float because of non-finite
# activations is a float model under a quantized label.
MIN_QUANTIZED_FRACTION = 0.5


def _require_quantized(
    report: dict[str, Any],
    nonfinite: list[str],
    cfg: QuantConfig,
    metrics: dict[str, Any] | None = None,
    float_model=None,
) -> None:
    """Fail, with the reason, where quantization left the model float by accident: no node
    quantized in a model with MatMul/Conv nodes (or with activations without a finite
    range), unless the recipe kept them float on purpose (exclude, float regions, automatic
    mixed precision's promotions); or activations without a finite range (NaN/Inf on the
    calibration data) keeping most MatMul/Conv nodes float, whatever the recipe says."""
    from winml_recipes.sdk.errors import QualityGateError

    total = report.get("matmul_conv_total", 0)
    promoted = ((metrics or {}).get("mixed_precision_auto") or {}).get("promoted")
    deliberate = bool(cfg.exclude or cfg.regions or promoted)
    touched = 0
    if nonfinite and float_model is not None:
        around = set(_touching(float_model, nonfinite))
        touched = sum(n.op_type in MATMUL_CONV and n.name in around for n in float_model.graph.node)
    why = (
        f"{len(nonfinite)} activation(s) have no finite range on the calibration data "
        f"(e.g. {', '.join(nonfinite[:3])}), so the nodes around them stay float; look for "
        "NaN/Inf in the calibration samples or the model"
        if nonfinite
        else "check quantize.exclude, the mixed-precision regions and op_types"
    )
    nothing = report.get("nodes_quantized", 0) == 0 and (total or nonfinite)
    if nothing and not deliberate:
        raise QualityGateError(
            f"no node was quantized (nodes_quantized: 0), so the model would ship float under a "
            f"{cfg.weight_type}/{cfg.activation_type} label; {why}",
            metrics={**report, **(metrics or {})},
        )
    if total and touched > (1 - MIN_QUANTIZED_FRACTION) * total:
        raise QualityGateError(
            f"{touched} of the {total} MatMul/Conv nodes stay float (more than "
            f"{1 - MIN_QUANTIZED_FRACTION:.0%}): {why}",
            metrics={**report, **(metrics or {})},
        )


# Largest quantized model (file and sidecars) the divergence repair runs on the target.
REPAIR_MAX_BYTES = 64_000_000


def _repair(float_src, out, cfg: QuantConfig, done, held_out_feeds, cal_options, cal,
            ctx: StepContext) -> dict[str, Any] | None:  # fmt: skip
    """Divergence repair on the target (quant/repair.py), or None where there is no NPU
    target to run on (a CPU target, or its EP absent here) or mixed_precision auto chose
    the types (its promotions are not re-made)."""
    from winml_recipes.quant.ort import quantize_static_qdq
    from winml_recipes.quant.repair import SAMPLES, QuantizeState, repair_divergence
    from winml_recipes.services.runtime import availability, provider_for, run_on_target
    from winml_recipes.services.samples import take

    if provider_for(ctx.target).is_cpu or not availability(cfg.ep).available:
        return None
    if cfg.auto is not None:
        return {"checked": False, "why": "mixed_precision auto chose the types"}
    size = sum(p.stat().st_size for p in out.parent.glob(out.name + "*"))
    if size > REPAIR_MAX_BYTES:
        return {
            "checked": False,
            "why": f"the quantized model is {size / 1e6:.0f} MB, over the "
            f"{REPAIR_MAX_BYTES / 1e6:.0f} MB its target runs are tried at (an emulated NPU "
            "takes minutes per layer at that size); `compare` locates a divergence",
        }
    from winml_recipes.sdk.errors import WinmlError

    from_files = any(cal_options.get(k) for k in HELD_OUT_KEYS)
    try:  # the samples after calibration's
        feeds = take(held_out_feeds(SAMPLES, {}, cal.samples if from_files else 0), SAMPLES)
    except WinmlError:
        feeds = []
    if not feeds:  # every sample went to calibration: check on those
        feeds = take(held_out_feeds(SAMPLES, {}, 0), SAMPLES)
    rules = quant_rules(cfg)
    work = ctx.work_dir / "divergence-repair"

    def requantize(state, dest: Path) -> None:
        from winml_recipes.quant.calibrate import write_ort_cache

        dest.parent.mkdir(parents=True, exist_ok=True)
        ranges_path = dest.parent / "ranges.json"
        write_ort_cache(state.ranges, ranges_path)
        quantize_static_qdq(done.src, dest, cfg, ranges_path, state.overrides, state.exclude,
                            rules)  # fmt: skip

    def on_target(path: Path, prefix_feeds) -> list:
        return run_on_target(path, prefix_feeds, ctx.target.device, ep=cfg.ep).outputs

    state = QuantizeState(dict(done.ranges), dict(done.overrides), list(done.exclude))
    return repair_divergence(
        done.src, out, state, requantize, feeds, on_target, cfg.activation_type, work,
        ctx.progress,
    )  # fmt: skip


@dataclass
class _Quantized:
    """One calibration + quantization of a float model (with some algorithms)."""

    src: Path  # the float model onnxruntime quantized last (rewritten / tuned)
    ranges_path: Path
    overrides: dict[str, list[dict[str, Any]]]
    exclude: list[str]
    nonfinite: list[str]
    sentinels: dict[str, dict[str, list[float]]]
    ep_metrics: dict[str, Any]
    calibration_seconds: float
    insertion_seconds: float
    algorithms: dict[str, Any] = field(default_factory=dict)
    ranges: dict[str, Any] = field(default_factory=dict)  # what ranges_path holds
    # what onnxruntime's quantizer got wrong and was repaired (quant/validity.py)
    repairs: list[dict[str, str]] = field(default_factory=list)


def _quantize_with(
    src: Path,
    model,
    out: Path,
    cfg: QuantConfig,
    algorithms: tuple[str, ...],
    exclude: list[str],
    counted: _Counted,
    ctx: StepContext,
    work_dir: Path,
    keep,
) -> _Quantized:
    """Calibrate `model` (loaded from `src`, changed in place) and quantize it to `out`,
    with `algorithms`: float rewrites before calibration, weight tuning after a first
    quantization (then quantized again)."""
    from winml_recipes.quant.algorithms import FLOAT_REWRITES, WEIGHT_TUNING
    from winml_recipes.quant.calibrate import (
        CalibrationSettings,
        calibrate,
        tensors_to_calibrate,
        write_ort_cache,
    )
    from winml_recipes.quant.mixed import compile_regions
    from winml_recipes.quant.ort import quantize_static_qdq
    from winml_recipes.services.models import save_model

    cal = cfg.calibration
    assert cal is not None
    rules = quant_rules(cfg)
    record: dict[str, Any] = {}
    if set(algorithms) & set(FLOAT_REWRITES):
        from winml_recipes.quant.algorithms.run import float_rewrites

        model, record["float_rewrites"] = float_rewrites(
            model, src, algorithms, counted.factory, cal.samples, work_dir / "algorithms"
        )
        src = save_model(model, work_dir / "rewritten" / "model.onnx")
    from winml_recipes.graph.pooling import whole_map_pools_to_global

    # exact; onnxruntime's int8 fusion computes a window that overhangs the map wrongly
    pools = whole_map_pools_to_global(model)
    if pools:
        src = save_model(model, work_dir / "global-pools" / "model.onnx")
    tensors = tensors_to_calibrate(model, list(cfg.op_types) or None)
    # Histogram settings the recipe leaves unset keep the calibrator's defaults.
    histogram = {k: v for k in ("num_bins", "percentile") if (v := getattr(cal, k)) is not None}
    settings = CalibrationSettings(
        method=cal.method, symmetric=cfg.activation_symmetric, **histogram
    )
    settings = replace(
        settings, num_quantized_bins=_quantized_bins(cfg.activation_type, settings.num_bins)
    )
    started = time.perf_counter()
    nonfinite: list[str] = []
    sentinels: dict[str, dict[str, list[float]]] = {}
    ranges = calibrate(
        src,
        counted,
        settings,
        tensors=tensors,
        work_dir=work_dir,
        on_outputs=keep,
        nonfinite=nonfinite,
        sentinels=sentinels,
    )
    calibration_seconds = time.perf_counter() - started
    ep_metrics: dict[str, Any] = {"whole_map_average_pools": pools} if pools else {}
    if sentinels or rules is not None:
        from winml_recipes.quant.calibrate import replace_sentinel_constants

        changed = bool(sentinels) and bool(replace_sentinel_constants(model, sentinels))
        after = rules.after_calibration(model) if rules is not None else {}
        ep_metrics.update(after)
        if changed or _changed(after):
            src = save_model(model, work_dir / "finite-sentinels" / "model.onnx")
    if rules is not None:
        ranges, adjusted = rules.adjust_ranges(model, ranges, tensors)
        ep_metrics.update(adjusted)
        ranges, rewritten = rules.rewrite_with_ranges(model, ranges)
        if rewritten:
            ep_metrics.update(rewritten)
            src = save_model(model, work_dir / "rescaled" / "model.onnx")
    ranges_path = work_dir / "ranges.json"
    write_ort_cache(ranges, ranges_path)
    overrides, float_nodes = compile_regions(cfg.regions, model, tensors)
    # Precision choices measured on the float model's values (on the CPU EP, where they were
    # measured; NPU EPs have their own repair, quant/repair.py), from one tapped run:
    # LayerNormalization inputs with rows too narrow for one 8-bit encoding get 16 bit, the
    # score chains a TopK selects by stay float when their keys span a few 8-bit steps.
    from winml_recipes.quant import narrow_rows as rows
    from winml_recipes.quant import selection_keys as topk
    from winml_recipes.quant.calibration_taps import tapped_values

    on_cpu = cfg.ep == "cpu"
    ln_inputs = rows.candidates(model, ranges, cfg.activation_type) if on_cpu else {}
    chains = topk.key_chains(model, ranges, cfg.activation_type) if on_cpu else {}
    values = tapped_values(
        model, [*ln_inputs, *topk.tapped(chains, ranges)], counted.factory, work_dir
    )
    narrow = rows.narrow_rows(model, ranges, ln_inputs, values) if values else {}
    narrow = {t: v for t, v in narrow.items() if t not in overrides}  # the recipe's choice
    if narrow:
        wide = "int16" if cfg.activation_type.startswith("int") else "uint16"
        overrides |= {
            t: [{"quant_type": wide}] for t in rows.promoted(narrow) if t not in overrides
        }
        ep_metrics["layernorm_rows_16bit"] = narrow
    keys = topk.selection_keys(ranges, chains, values) if values else {}
    if keys:
        ep_metrics["topk_keys_float"] = keys
        float_nodes = [*float_nodes, *(n for k in keys.values() for n in k["nodes"])]
    # the producers and readers of a tensor with no range stay float
    float_nodes = [*float_nodes, *_touching(model, nonfinite)]
    if rules is not None:  # nodes the EP cannot run quantized, with its reasons
        ep_float = rules.float_nodes(model)
        if ep_float:
            ep_metrics["ep_float_nodes"] = ep_float
        float_nodes = [*float_nodes, *ep_float]
    exclude = [*exclude, *[n for n in dict.fromkeys(float_nodes) if n not in exclude]]
    del model
    started = time.perf_counter()
    repairs = quantize_static_qdq(src, out, cfg, ranges_path, overrides, exclude, rules)
    _check_valid(out, src, counted)
    insertion_seconds = time.perf_counter() - started
    if set(algorithms) & set(WEIGHT_TUNING):
        from winml_recipes.quant.algorithms.run import tune_weights

        tuned, record["weights"] = tune_weights(
            src, out, algorithms, counted.factory, cal.samples, work_dir / "tuning",
            ctx.progress, TUNING_BUDGET_SECONDS,
        )  # fmt: skip
        if tuned is not None:
            src = tuned
            started = time.perf_counter()
            repairs = quantize_static_qdq(src, out, cfg, ranges_path, overrides, exclude, rules)
            _check_valid(out, src, counted)
            insertion_seconds += time.perf_counter() - started
    return _Quantized(
        src, ranges_path, overrides, exclude, nonfinite, sentinels, ep_metrics,
        calibration_seconds, insertion_seconds, record, dict(ranges), repairs,
    )  # fmt: skip


def _check_valid(out: Path, float_src: Path, counted: _Counted) -> None:
    """onnx's checker and one CPU run of `out` on the first calibration sample: an invalid
    graph is this step's error, naming the node, before any target runs it."""
    from winml_recipes.quant.validity import check, first_feed

    check(out, float_src, first_feed(counted.factory))


# SeqMSE and bias correction stop tuning layers after this (the rest keep min/max).
TUNING_BUDGET_SECONDS = 900.0


class _Counted:
    """Wraps a feed factory and records how many samples one pass consumed."""

    def __init__(self, factory, on_sample=None) -> None:
        self.factory = factory
        self.max_seen = 0
        self.on_sample = on_sample

    def __call__(self):
        for seen, feed in enumerate(self.factory(), start=1):
            self.max_seen = max(self.max_seen, seen)
            yield feed
            if self.on_sample is not None:
                self.on_sample(seen)


# The phases around calibration that hold weights, measured on the full-size SAM 3 vision
# encoder (1.8 GB of weights, opset 20): onnxruntime's quantize_static alone peaks at
# 2.5 GB (8- and 16-bit alike, in a fresh process) while this pass still holds the float
# model (+1.9 GB); saving the model converted to opset 21 (16-bit) peaks at 7.0 GB. Before
# shape inference and the opset converter ran on light views (onnx/lightview.py), the
# step peaked at 16.2 GB, inside onnxruntime's own conversion to opset 21.
INSERTION_WEIGHT_FACTOR = 4.0


def _touching(model, tensors: list[str]) -> list[str]:
    """Names of the nodes that produce or read any of `tensors`."""
    wanted = set(tensors)
    return [
        n.name
        for n in model.graph.node
        if n.name and (wanted & set(n.output) or wanted & set(n.input))
    ]


def _required_opset(cfg: QuantConfig) -> int:
    """21 for 16-bit types (which Q/DQ take from opset 21), 13 when the output needs
    per-channel DequantizeLinear (`axis`), else 10. onnxruntime's quantizer would convert
    a 16-bit model to 21 itself, on the model with its weights loaded: 16.2 GB for the
    full-size SAM 3 vision encoder, against 4.6 GB for one already at 21."""
    if cfg.activation_type.endswith("16") or cfg.weight_type.endswith("16"):
        return 21
    return 13 if cfg.per_channel else 10


def _upgrade_opset(model, cfg: QuantConfig):
    """The model converted to the opset its quantized form needs, or None if it has it.

    onnxruntime's quantizer upgrades an old model itself, after our calibration: the ranges
    were then computed on the old graph, and the opset adapters (Softmax below 13, ...) make
    tensors that have none ("Only an existing tensor can be modified"); below 13 a
    per-channel DequantizeLinear gets an `axis` the opset does not have. Converting first,
    with onnx's version converter, calibrates the graph that is quantized. The weights'
    bytes move from `model` into the converted model (only one copy is ever held).
    """
    from onnx import version_converter

    from winml_recipes.sdk.errors import PassError
    from winml_recipes.services.models import light_view, with_weights

    current = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    needed = _required_opset(cfg)
    if current >= needed:
        return None
    try:
        # on a view without the weights' bytes, which are then moved over (see lightview)
        converted = version_converter.convert_version(light_view(model), needed)
        # The converter writes value infos without shapes, which the checker refuses
        # ("Field 'shape' of 'type' is required"): they are dropped. What the checker says
        # of the source itself (an exporter's output without a shape at IR 6) is no
        # failure of the conversion.
        for value in [v for v in converted.graph.value_info if not v.type.HasField("tensor_type")
                      or not v.type.tensor_type.HasField("shape")]:  # fmt: skip
            converted.graph.value_info.remove(value)
        # Outputs of other domains' ops (HTP's com.microsoft Gelu, written by prepare) keep
        # the types the source declares: shape inference cannot type them, and without a
        # type nothing after them would be calibrated (onnxruntime's quantizer then loops
        # for ever on tensors that share an unquantized input's parameters).
        foreign = {o for n in converted.graph.node if n.domain not in ("", "ai.onnx")
                   for o in n.output}  # fmt: skip
        typed = {v.name for v in converted.graph.value_info}
        converted.graph.value_info.extend(
            v for v in model.graph.value_info if v.name in foreign and v.name not in typed
        )
        problem = _checker_error(converted)
        if problem is not None and problem != _checker_error(light_view(model)):
            raise ValueError(problem)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise PassError(
            f"the model is opset {current} and its quantized form needs opset {needed}; "
            f"onnx's version converter failed ({first}); convert the model to opset {needed} "
            "with the exporter that made it"
        ) from None
    return with_weights(converted, model)


def _checker_error(model) -> str | None:
    import onnx

    try:
        onnx.checker.check_model(model, full_check=False)
    except onnx.checker.ValidationError as exc:
        return str(exc)
    return None


def _changed(metrics: dict[str, Any]) -> bool:
    """Whether an EP hook's metrics record a change (any non-empty value, any count > 0)."""

    def some(v: Any) -> bool:
        return any(some(x) for x in v.values()) if isinstance(v, dict) else bool(v)

    return any(some(v) for v in metrics.values())


def _quantized_bins(activation_type: str, num_bins: int) -> int:
    """Entropy's target bins: 128 for 8-bit (TensorRT's choice); for 16-bit, half the
    histogram. The 2**15 a 16-bit type could hold would need a histogram of over 32,768
    bins (gigabytes across a model's activations) and the KL search then clips nothing."""
    return 128 if activation_type.endswith("8") else max(128, num_bins // 2)


def calibration_options(config: QuantizeOptions) -> dict[str, Any] | None:
    """The calibration options that are set, as feeds.feeds_for reads them (None: none)."""
    cal = config.calibration
    return None if cal is None else {k: v for k, v in vars(cal).items() if v is not None}


def _held_out_name(own: dict[str, Any], cal: dict[str, Any], seed: int, contract) -> str:
    from winml_recipes.services.samples import describe_source

    if own:
        return describe_source(own, contract, held_out=True)
    name = describe_source(cal, contract, held_out=True)
    if any(cal.get(k) for k in HELD_OUT_KEYS):
        return f"{name} (samples after the calibration ones)"
    return name if name.startswith("bundled") else f"{name} (seed {seed})"


def _base_metrics(cfg: QuantConfig) -> dict[str, Any]:
    return {
        "mode": cfg.mode,
        "format": cfg.format,
        "ep_rules": get_ep(cfg.ep).quant_rules.name if quant_rules(cfg) else None,
        "activation_type": cfg.activation_type,
        "weight_type": cfg.weight_type,
        "per_channel": cfg.per_channel,
        "activation_symmetric": cfg.activation_symmetric,
        "weight_symmetric": cfg.weight_symmetric,
        "reduce_range": cfg.reduce_range,
    }
