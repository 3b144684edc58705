"""verify: run reference and candidate on the same seeded inputs; fail below thresholds."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from winml_recipes.passes import verify_float
from winml_recipes.passes import verify_zeroshot as zeroshot
from winml_recipes.sdk.config import option
from winml_recipes.sdk.errors import PassError, QualityGateError
from winml_recipes.sdk.gates import Gate
from winml_recipes.sdk.held_to import (
    THRESHOLDS,
    Thresholds,
    held_to_options,
    output_gates,
    task_gates,
)
from winml_recipes.sdk.passes import Pass, check_component, register
from winml_recipes.sdk.target import Target
from winml_recipes.sdk.types import DataRead, ModelFacts, PlanContext, StepContext, StepResult

DEFAULT_LEVEL_SAMPLES = 2

if TYPE_CHECKING:
    from winml_recipes.sdk.estimates import EstimateInputs, MemoryEstimate


MAX_HELD_OUT = 64  # held-out samples verified by default (more: say samples explicitly)
SEEDED_SAMPLES = 2  # seeded synthetic or upstream-fed samples by default
FILE_SOURCES = ("npz", "images", "dataset")


@dataclass(frozen=True)
class VerifyConfig:
    min_sqnr_db: float = option(30.0, "Minimum SQNR in dB.")
    min_cosine: float = option(0.99, minimum=-1, maximum=1)
    max_abs: float | None = option(None, "Maximum absolute error.", minimum=0)
    samples: int | None = option(
        None,
        f"Samples to verify on. Default: every held-out sample of npz/images/dataset (up to "
        f"{MAX_HELD_OUT}, said when capped), else {SEEDED_SAMPLES} seeded ones.",
        minimum=1,
        maximum=MAX_HELD_OUT,
    )
    seed: int = option(0, minimum=0)
    npz: str | None = option(
        None,
        "Held-out data: .npz files (a glob, relative to the recipe), as for calibration; the "
        "first `skip` samples are left out.",
    )
    images: str | None = option(
        None,
        "Held-out data: an image folder, preprocessed as the catalog input's `image:` block says.",
    )
    dataset: str | None = option(
        None,
        "Held-out data: a Hugging Face `datasets` split saved with save_to_disk (`PATH:SPLIT` "
        "for a DatasetDict), as for calibration; the first `skip` rows are left out.",
    )
    skip: int = option(
        0,
        "With npz/images/dataset: leave out the first N samples (e.g. the ones calibration used "
        "from the same files).",
        minimum=0,
    )
    inputs_from: str | None = option(
        None,
        "Feed the inputs that this component's float model produces from that component's "
        "float model run on seeded inputs (e.g. the SAM 3 decoder verified on real encoder "
        "embeddings).",
    )
    samples_per_upstream: int = option(
        1,
        "With inputs_from: how many samples share one upstream output (SAM 3: several "
        "prompts per encoded image, each image encoded once).",
        minimum=1,
    )
    zero_shot_with: str | None = option(
        None,
        "A two-tower model's image tower: the text tower component to judge zero-shot image "
        "classification with, after both towers' own checks: each verified image's label is "
        "the most similar label prompt (cosine of the embeddings), float towers vs the "
        "target's towers, gated by zero_shot_min_top1.",
    )
    zero_shot_min_top1: float = option(
        0.8,
        "With zero_shot_with: the share of the images the float towers decide (best prompt "
        "ahead of the second by at least 10% of the image's similarity spread) whose label "
        "the target's towers choose as the float towers do (top1_agreement_decisive).",
        minimum=0,
        maximum=1,
    )
    allow_cpu_fallback: bool = option(
        False,
        "Let nodes the target's EP refuses run on the CPU EP (off: the build fails naming "
        "them). Ignored for CPU targets.",
    )
    allow_calibration_overlap: bool = option(
        False,
        "Verify on data that holds calibration samples (same content) anyway; the manifest "
        "and console say so. Off: the build is refused before it starts.",
    )
    on_target: bool = option(
        True,
        "Run the candidate on the target's EP. false: on the CPU EP, recorded as verified_on: "
        "cpu-simulation (for graphs the emulated EP cannot hold in this machine's memory).",
    )
    require_ep: bool = option(
        False,
        "Fail where the target's EP cannot load on this host, instead of verifying on the CPU "
        "simulation (recorded as verified_on: cpu-simulation).",
    )
    compare_simulation: bool = option(
        True,
        "Also run the candidate on the CPU EP and record those metrics, to show where the "
        "target diverges from the simulation.",
    )
    locate_divergence: bool = option(
        True,
        "With compare_simulation: where an output on the target departs from the CPU "
        "simulation (below 20 dB against it and 6 dB further from float), find the first "
        "layer that departs, on prefixes of the graph, and name it in the verdict.",
    )
    outputs: Mapping[str, Thresholds] | None = option(
        None, "Per-output thresholds overriding the ones above."
    )
    task: Mapping[str, float] | None = option(
        None,
        "Gates on the catalog task's metric (e.g. mask_iou: 0.9, chosen_mask_agreement: 0.95; "
        "README, Task metrics). Default: the metric's own gates; {}: report it, gate nothing.",
    )
    task_decides: bool = option(
        False,
        "Where the catalog task has a task metric, its gates decide: the per-output SQNR / "
        "cosine / max_abs gates are recorded and shown as advisory (the quantized presets, "
        "so `build --onnx` of a known task is not withheld on a secondary number).",
    )
    probability_decision_iou: float | None = option(
        None,
        "Hold outputs the float model keeps inside [0, 1] (probability maps: sigmoid or "
        "softmax scores) to this IoU of their decisions (elements above 0.5, float vs "
        "target) instead of SQNR and cosine, unless `outputs` sets their thresholds (the "
        "quantized presets: 0.8).",
        minimum=0,
        maximum=1,
    )


@register
class VerifyPass(Pass[VerifyConfig]):
    name = "verify"
    version = 2
    summary = (
        "Run the candidate on the target's execution provider and compare it with the float "
        "reference on CPU (SQNR, cosine, max abs)."
    )
    uses_reference = True
    uses_contract = True
    judges_candidate = True

    def held_to(self, config: VerifyConfig) -> dict[str, Any]:
        return held_to_options(config)

    def skip_reason(self, facts: ModelFacts, config: VerifyConfig, target: Target) -> str | None:
        if not facts.has_reference:
            return "no float reference to compare with (the source is quantized: add dequantize)"
        return None

    def estimate_memory(
        self, src: Path, config: VerifyConfig, inputs: EstimateInputs
    ) -> MemoryEstimate | None:
        from winml_recipes.services.memory import forward_estimate, larger

        # Upstream, reference and candidate sessions run one after another.
        phases = [forward_estimate(src, inputs.contract, "candidate forward")]
        if inputs.reference is not None:
            phases.append(forward_estimate(inputs.reference, inputs.contract, "reference forward"))
        for name, (model, contract) in inputs.upstream.items():
            phases.append(forward_estimate(model, contract, f"{name} forward"))
        from winml_recipes.services.memory import preparation_estimate, quantized_later
        from winml_recipes.services.runtime import provider_for

        ep = provider_for(inputs.target)
        # a float source standing in for the QDQ candidate: its preparation waits for it
        if config.on_target and not ep.is_cpu and not quantized_later(src, inputs.target):
            phases.append(preparation_estimate(src, inputs.contract, ep, "candidate session"))
        best = larger(*phases)
        note = ep.estimate_note()
        if best is not None and note:
            best = replace(best, made_of=f"{best.made_of} ({note})")
        return best

    def check(self, config: VerifyConfig, ctx: PlanContext) -> None:
        from winml_recipes.sdk.errors import PlanError
        from winml_recipes.sdk.held_to import check_output_names

        check_output_names(config.outputs or {}, ctx, "verify.outputs")
        if config.inputs_from:
            check_component(config.inputs_from, ctx, "verify.inputs_from")
        if config.zero_shot_with:
            check_component(config.zero_shot_with, ctx, "verify.zero_shot_with")
        chosen = [k for k in ("npz", "images", "dataset", "inputs_from") if getattr(config, k)]
        if len(chosen) > 1:
            raise PlanError(f"verify: {' and '.join(chosen)} are two data sources; keep one")
        if config.npz:
            from winml_recipes.services.samples import check_npz, check_npz_values, npz_files

            files = npz_files(config.npz, ctx.recipe_dir, "verify.npz")
            check_npz(files, ctx.contract, "verify.npz")
            check_npz_values(files, ctx.contract, "verify.npz")  # NaN/Inf named, not scored
        if config.images:
            from winml_recipes.services.samples import image_files

            image_files(config.images, ctx.recipe_dir)
        if config.dataset:
            from winml_recipes.services.samples import check_split, open_split

            check_split(open_split(config.dataset, ctx.recipe_dir), ctx.contract)

    def key_material(self, config: VerifyConfig, ctx: StepContext) -> Any:
        from winml_recipes.services.runtime import identity, provider_for
        from winml_recipes.services.samples import upstream_data_digest

        source = _data_source(config)
        # A result measured on the CPU simulation must not be served once the EP loads.
        from winml_recipes.passes.verify_layers import LAYERS_ENV

        layers = {} if os.environ.get(LAYERS_ENV) != "0" else {"layers": False}
        paired = ctx.upstream.get(config.zero_shot_with or "")
        zero_shot = (
            {"zero_shot": {"candidate": paired.candidate_digest, "prompts": zeroshot.PROMPTS_KEY}}
            if paired is not None
            else {}
        )
        return {
            **layers,  # whether the record holds the per-layer comparison (report.html)
            **zero_shot,  # the other tower's judged model and the label prompts
            "task": ctx.task,  # chooses the task metric
            "data": upstream_data_digest(source, ctx.upstream, ctx.recipe_dir),
            "execution_provider": identity(provider_for(ctx.target).key),
        }

    def data_reads(self, config: VerifyConfig) -> list[DataRead]:
        source = {k: getattr(config, k) for k in FILE_SOURCES if getattr(config, k)}
        if not source:
            return []
        return [
            DataRead(
                "held_out",
                source,
                config.skip,
                config.samples or MAX_HELD_OUT,
                config.allow_calibration_overlap,
            )
        ]

    def depends_on(self, config: VerifyConfig) -> tuple[str, ...]:
        return tuple(c for c in (config.inputs_from, config.zero_shot_with) if c)

    def opens_on_target(self, config: VerifyConfig) -> bool:
        return config.on_target

    def allows_cpu_fallback(self, config: VerifyConfig) -> bool:
        return config.allow_cpu_fallback

    def run(
        self, src: Path | None, out_dir: Path, config: VerifyConfig, ctx: StepContext
    ) -> StepResult:
        from winml_recipes.services.runtime import (
            compare_runs,
            output_metrics,
            run_at_default_level,
            run_model,
        )
        from winml_recipes.services.samples import (
            UpstreamFeeds,
            bundled_audio_input,
            bundled_image_input,
            describe_source,
            feeds_for,
            outputs_for,
            take,
        )

        assert src is not None
        if ctx.reference is None:
            raise PassError("no float reference to compare with")
        same_model = bool(ctx.reference_digest) and ctx.input_digest == ctx.reference_digest
        if same_model and _runs_on_cpu(ctx.target, config):
            # The same model on the same EP would score perfectly whatever happened.
            return StepResult(
                None,
                skipped="the model to verify is its float reference (no step changed it) "
                "and would run on the same CPU EP; there is nothing to compare",
            )
        contract = ctx.contract
        # Verification seeds differ from calibration seeds: quality is measured on unseen data.
        seed = config.seed + ctx.seed + 7919
        bundled = bundled_image_input(contract) or bundled_audio_input(contract)
        from_files = any(getattr(config, k) for k in FILE_SOURCES) or (
            _data_source(config) is None and bundled is not None
        )
        wanted = config.samples or (MAX_HELD_OUT if from_files else SEEDED_SAMPLES)
        factory = feeds_for(
            _data_source(config),
            contract,
            ctx.recipe_dir,
            ctx.upstream,
            asked := wanted + (from_files and config.samples is None),  # +1: was it capped?
            seed,
            ctx.store,
            skip=config.skip,
        )
        feeds = take(factory, asked)
        capped = len(feeds) > wanted
        feeds = feeds[:wanted]
        # An upstream component's reference outputs are kept for its downstream's verify.
        samples = len(feeds)
        forwards: dict[str, int] = {}
        reference = outputs_for(
            ctx.reference,
            ctx.reference_digest,
            feeds,
            ctx.store,
            keep=ctx.feeds_downstream,
            on_sample=lambda done: ctx.progress("reference samples", done, samples),
            counts=forwards,
        )
        options = {
            "allow_cpu_fallback": config.allow_cpu_fallback,
            "require_ep": config.require_ep,
            "on_target": config.on_target,
        }
        started = time.perf_counter()
        target = _run_or_bisect(src, feeds, options, ctx, out_dir)
        target_seconds = round(time.perf_counter() - started, 2)
        advisory = _check_output_shapes(reference[0], target.outputs[0], ctx)
        metrics = output_metrics(reference, target.outputs)
        record: dict[str, Any] = {"samples": samples, **target.record}
        record["target_seconds"] = target_seconds  # what `run` and `perf` estimate from
        if advisory:  # the file's declaration, not the model, was wrong: said, not failed
            record["output_shapes_declared"] = advisory  # printed by presenter.advisory_shapes_line
        source = _data_source(config)
        if source or from_files:  # which data the metrics were measured on, and how many
            record["data_source"] = describe_source(source, contract, held_out=True)
            record["data_samples"] = samples
            if config.allow_calibration_overlap:
                record["calibration_overlap_allowed"] = True
            if capped and config.samples is None:
                record["data_capped"] = (
                    f"the data has more than {wanted} samples; verified on the first {wanted} "
                    "(set verify.samples to choose)"
                )
        if isinstance(factory, UpstreamFeeds):
            record["upstream_forwards"] = {"computed": factory.computed, "reused": factory.reused}
        # float model forwards on these samples: kept ones (quantize's mode auto, an upstream
        # component's verify) are read, not run again
        record["reference_forwards"] = {"computed": 0, "reused": 0} | forwards
        task = _task_metric(ctx, config, reference, target.outputs)
        if config.compare_simulation and target.verified_on not in ("cpu", "cpu-simulation"):
            sim_runs = run_model(src, feeds)
            simulated = compare_runs(reference, sim_runs)
            record["cpu_simulation"] = {"outputs": simulated}
            simulated_task = _task_metric(ctx, config, reference, sim_runs)
            if simulated_task is not None:  # the task metric the simulation gives, beside
                record["cpu_simulation"]["task_metric"] = simulated_task[0]["values"]
            if config.zero_shot_with:
                record["cpu_simulation"]["zero_shot"] = zeroshot.judge(
                    config, ctx, reference, sim_runs, on_target=False
                )[0]["values"]
            if config.locate_divergence and _departs(simulated, metrics, sim_runs, target.outputs):
                record["first_divergence"] = _locate(src, feeds, options, ctx, out_dir)
        record["outputs"] = metrics
        gates = _gates(metrics, config)
        if task is not None:
            record["task_metric"], task_gates = task
            if config.task_decides and task_gates:
                gates = [replace(g, advisory=True) for g in gates]
            gates = [*task_gates, *gates]
        float_gate = verify_float.gate(reference)  # never advisory: it judges the judge
        if float_gate is not None:
            gates.insert(0, float_gate)
        default_gate = None
        if target.verified_on == "cpu":  # what an app's plain InferenceSession runs
            # two samples: a fusion that computes something else shows on any input
            checked = feeds[:DEFAULT_LEVEL_SAMPLES]
            at_default = verify_float.default_level_record(
                compare_runs(reference[: len(checked)], target.outputs[: len(checked)]),
                compare_runs(reference[: len(checked)], run_at_default_level(src, checked)),
            )
            record["at_default_level"] = at_default
            default_gate = verify_float.default_level_gate(at_default)
            gates.insert(0, default_gate)
        if config.zero_shot_with:  # the two towers together, after each tower's own check
            record["zero_shot"], zero_shot_gate = zeroshot.judge(
                config, ctx, reference, target.outputs, on_target=True
            )
            gates.insert(0, zero_shot_gate)
        record["gates"] = [g.to_manifest() for g in gates]
        record["passed"] = all(g.holds for g in gates)
        failed = [g for g in gates if not g.holds]
        judged = float_gate not in failed  # a float model that cannot judge has no error source
        if failed and judged and not record.get("first_divergence", {}).get("found"):
            record["error_source"] = _error_source(src, feeds, ctx)
        if failed:
            raise QualityGateError(
                f"verification on {target.verified_on} failed: "
                + "; ".join(g.line() for g in failed)
                + (verify_float.note(reference, feeds) if float_gate in failed else "")
                + (verify_float.default_level_note(at_default) if default_gate in failed else "")
                + _divergence_note(record.get("first_divergence"))
                + _source_note(record.get("error_source")),
                metrics=record,  # kept in the failed build's manifest
            )
        _record_layers(record, src, feeds, target, ctx)
        return StepResult(None, record)


def _record_layers(
    record: dict[str, Any], src: Path, feeds: list[dict[str, Any]], target: Any, ctx: StepContext
) -> None:
    """The per-layer comparison report.html plots (passes/verify_layers.py), into `record`."""
    from winml_recipes.passes.verify_layers import layer_record, why_not
    from winml_recipes.services.runtime import provider_for

    assert ctx.reference is not None
    why = why_not(src, ctx.reference, ctx.target.device, ctx.target.precision, target.verified_on)
    if why is not None or not feeds:
        return
    ctx.progress("per-layer comparison", 0, 1)
    record["layers"] = layer_record(
        src, ctx.reference, feeds[0], target.outputs[0], ctx.target.device,
        provider_for(ctx.target).key,
    )  # fmt: skip
    ctx.progress("per-layer comparison", 1, 1)


def _run_or_bisect(
    src: Path,
    feeds: list[dict[str, Any]],
    options: dict[str, Any],
    ctx: StepContext,
    out_dir: Path,
) -> Any:
    """The candidate's run on the target. A session the EP cannot finalize (no node named)
    is bisected to the smallest failing region; with CPU fallback allowed, the region's op
    types are then kept on the CPU when that loads (recorded), else the error names them."""
    from winml_recipes.sdk.errors import ExecutionProviderError
    from winml_recipes.services.runtime import explain, provider_for, run_on_target

    samples = len(feeds)
    ep = provider_for(ctx.target)

    def on_sample(done: int) -> None:
        ctx.progress("samples on the target", done, samples)

    try:
        return run_on_target(src, feeds, ctx.target.device, options, on_sample, ep.key)
    except ExecutionProviderError as exc:
        fallback = bool(options["allow_cpu_fallback"])
        explained = explain(exc, src, ep.key, fallback=fallback,
                            progress=ctx.progress)  # fmt: skip
        cpu = explained.data.get("cpu_op_affinity") or {}
        if explained is exc or not (fallback and cpu.get("loads")):
            raise explained from None
    pinned = ep.cpu_pinning(cpu["op_types"], Path(ctx.work_dir))
    assert pinned is not None  # explain() found it loads with the EP's pinning
    target = run_on_target(
        src,
        feeds,
        ctx.target.device,
        {**options, "provider_options": pinned},
        on_sample,
        ep.key,
    )
    target.record["cpu_op_affinity"] = {
        **cpu,
        "why": "the EP could not finalize the graph: " + explained.message.split("; next:")[0],
        "bisection": explained.data["bisection"],
    }
    return target


DEPARTS_DB = 20.0  # target vs simulation below this ... (quant/repair.py's rule)
LOSS_DB = 6.0  # ... and this much further from float than the simulation: departs
LOCATE_SAMPLES = 2  # samples the prefix search runs


def _departs(
    simulated: dict[str, Any], on_target: dict[str, Any], sim_runs: list, target_runs: list
) -> bool:
    """Whether an output on the target departs from the CPU simulation: below DEPARTS_DB
    against it and LOSS_DB further from float (`simulated`, `on_target`: vs float)."""
    from winml_recipes.services.runtime import compare_runs

    apart = compare_runs(sim_runs, target_runs)
    return any(
        apart[n]["sqnr_db"] < DEPARTS_DB
        and simulated[n]["sqnr_db"] - on_target[n]["sqnr_db"] >= LOSS_DB
        for n in simulated
        if n in apart and n in on_target
    )


def _locate(
    src: Path, feeds: list[dict[str, Any]], options: dict[str, Any], ctx: StepContext,
    out_dir: Path,
) -> dict[str, Any]:  # fmt: skip
    """The first layer where the target departs from the simulation, found on prefixes of
    the candidate (quant/prefixes.py), or why it was not found."""
    from winml_recipes.quant.prefixes import first_divergence_by_prefixes
    from winml_recipes.quant.repair import LAYER_DEPARTS_DB, LAYER_LOSS_DB
    from winml_recipes.sdk.errors import WinmlError
    from winml_recipes.services.runtime import provider_for, run_on_target

    assert ctx.reference is not None
    ep = provider_for(ctx.target).key

    def on_target(path: Path, prefix_feeds: list) -> list:
        return run_on_target(path, prefix_feeds, ctx.target.device, options, None, ep).outputs

    ctx.progress("locating the first divergence on prefixes", 0, 1)
    work = Path(ctx.work_dir) / "prefixes"
    try:
        first, search = first_divergence_by_prefixes(
            src, ctx.reference, feeds[:LOCATE_SAMPLES], on_target, work, LAYER_DEPARTS_DB,
            LAYER_LOSS_DB,
        )  # fmt: skip
    except WinmlError as exc:
        return {"found": False, "why": str(exc).splitlines()[0]}
    if first is None:
        return {"found": False, "why": "no prefix departs (the outputs' divergence is the "
                "last layers' together)", **search}  # fmt: skip
    return {"found": True, **first.to_json(), "prefix_loads": search["prefix_loads"]}


SOURCE_MAX_BYTES = 256 << 20  # models above: every activation alive at once is too much


def _error_source(src: Path, feeds: list[dict[str, Any]], ctx: StepContext) -> dict[str, Any]:
    """Where a model withheld for quality loses its precision against float: the first layer
    that departs from float in the CPU simulation (quant/divergence.py)."""
    from winml_recipes.quant.divergence import first_loss_in_simulation
    from winml_recipes.sdk.errors import WinmlError

    assert ctx.reference is not None
    if sum(p.stat().st_size for p in src.parent.glob(src.name + "*")) > SOURCE_MAX_BYTES:
        return {"found": False, "why": "the model is too large to tap every activation"}
    from winml_recipes.quant.divergence import activation_taps
    from winml_recipes.services.models import load_model

    if not activation_taps(load_model(src, load_external_data=False)):
        return {"found": False, "why": "no QuantizeLinear activations to tap (a dynamic model)"}
    try:
        row = first_loss_in_simulation(
            src, ctx.reference, feeds[:LOCATE_SAMPLES], Path(ctx.work_dir) / "error-source"
        )
    except (WinmlError, ValueError) as exc:
        return {"found": False, "why": str(exc).splitlines()[0][:300]}
    if row is None:
        return {"found": False, "why": "no single layer loses it: the loss accumulates"}
    return {"found": True, **row.to_json()}


def _source_note(found: dict[str, Any] | None) -> str:
    if not found or not found.get("found"):
        return ""
    into = found["input_db"]
    return (
        f"; the error comes first from {found['tensor']} ({found['op_type']} "
        f"{found['node']}): {found['simulation_vs_float_db']:.1f} dB vs float in the CPU "
        f"simulation" + ("" if into is None else f", from {into:.1f} dB at its inputs")
    )


def _divergence_note(found: dict[str, Any] | None) -> str:
    if not found or not found.get("found"):
        return ""
    return (
        f"; the target departs from the CPU simulation first at {found['tensor']} "
        f"({found['op_type']} {found['node']}): {found['target_vs_float_db']:.1f} dB vs float "
        f"on the target, {found['simulation_vs_float_db']:.1f} dB simulated"
    )


def _runs_on_cpu(target: Target, config: VerifyConfig) -> bool:
    """Whether the candidate would run on the CPU EP, like the reference (an unchanged
    model on the NPU's EP is still a real comparison: other arithmetic)."""
    from winml_recipes.services.runtime import availability, provider_for

    ep = provider_for(target)
    if ep.is_cpu or not config.on_target:
        return True
    return not availability(ep.key).available


def _data_source(config: VerifyConfig) -> dict[str, Any] | None:
    """Calibration-style data options for feeds_for (None: no data of the recipe's)."""
    keys = ("npz", "images", "dataset", "inputs_from")
    source: dict[str, Any] = {k: getattr(config, k) for k in keys if getattr(config, k)}
    if config.inputs_from and config.samples_per_upstream > 1:
        source["samples_per_upstream"] = config.samples_per_upstream
    return source or None


def _check_output_shapes(
    reference: dict[str, Any], outputs: dict[str, Any], ctx: StepContext
) -> dict[str, dict[str, list]]:
    """Each output's shape against the catalog's. A generated entry's shape (read from the
    model file, `shape_advisory`) that the float model's own run contradicts is returned as
    {output: {declared, ran}} when the candidate runs the float model's shape; anything
    else that differs is an error."""
    contract = ctx.contract
    advisory: dict[str, dict[str, list]] = {}
    for spec in contract.outputs:
        if spec.name not in outputs:
            raise PassError(
                f"output '{spec.name}' of the catalog contract is missing from the model "
                f"(it has: {', '.join(outputs)})"
            )
        got = tuple(outputs[spec.name].shape)
        known = dict(contract.dims)
        want = tuple(d if isinstance(d, int) else known.get(d) for d in spec.shape)
        mismatch = any(w is not None and w != g for w, g in zip(want, got, strict=False))
        if len(got) == len(want) and not mismatch:
            continue
        shown = [d if isinstance(d, int) else known.get(d, d) for d in spec.shape]
        ran = tuple(getattr(reference.get(spec.name), "shape", ()))
        if spec.shape_advisory and spec.name in reference and ran == got:
            advisory[spec.name] = {"declared": shown, "ran": list(ran)}
            continue
        raise PassError(
            f"output '{spec.name}' has shape {list(got)}, the catalog says {shown}"
            + (f" and the float model runs {list(ran)}" if spec.name in reference else "")
            + "; fix the shape in the catalog entry (or the model, if it computes the wrong one)"
        )
    return advisory


def _task_metric(
    ctx: StepContext, config: VerifyConfig, reference: list, candidate: list
) -> tuple[dict[str, Any], list[Gate]] | None:
    """The catalog task's metric on every sample, and its gates (None: no metric applies)."""
    from winml_recipes.sdk.metrics import metric_for

    metric = metric_for(ctx.task, ctx.contract)
    if metric is None:
        return None
    values = metric.values(reference, candidate)
    gates = task_gates(metric, values, config.task)
    record = {
        "task": ctx.task,
        "metric": metric.name,
        "description": metric.description,
        "values": values,
    }
    return record, gates


def _gates(metrics: dict[str, dict[str, float]], config: VerifyConfig) -> list[Gate]:
    """Every output's gates: the step's thresholds, an output's own where `outputs` sets
    them, a probability map's decision IoU where `probability_decision_iou` asks for it."""
    per_output = {
        name: {k: getattr(t, k) for k in THRESHOLDS} for name, t in (config.outputs or {}).items()
    }
    limits = {k: getattr(config, k) for k in THRESHOLDS}
    return output_gates(metrics, limits, per_output, config.probability_decision_iou)
