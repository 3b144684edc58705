"""compile: an EPContext model for the target's execution provider (its plugin says
whether it compiles: `compiles = "epcontext"`).

Creating a session on the EP with `ep.context_enable=1` makes it compile the graph and write
`model_ctx.onnx` (an `EPContext` node holding, or pointing at, the EP's context binary):
what a device loads without compiling again. The compiled model is then loaded back on the
same EP and its outputs compared with the uncompiled model's on that EP.

A graph whose preparation would not fit the memory budget (the EP plugin's
PreparationCost), or any graph with `parts: N`, is compiled as N consecutive parts cut at
tensor boundaries and stitched into one `model_ctx.onnx` holding one EPContext node (and
context binary) per part (runtime/splitcompile.py); the comparison is then with the
uncompiled parts run in sequence on the EP.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from winml_recipes.sdk.config import option
from winml_recipes.sdk.errors import ExecutionProviderError, PassError
from winml_recipes.sdk.passes import Pass, register
from winml_recipes.sdk.target import Target
from winml_recipes.sdk.types import ModelFacts, StepContext, StepResult

if TYPE_CHECKING:
    from winml_recipes.sdk.estimates import EstimateInputs, MemoryEstimate

COMPILED = "model_ctx.onnx"
HtpArch = Literal[68, 69, 73, 75, 79, 81]


@dataclass(frozen=True)
class CompileConfig:
    htp_arch: HtpArch | None = option(
        None,
        "Hexagon architecture to compile for (e.g. 73 for Snapdragon X Elite). Default: the EP's.",
    )
    soc_model: int | None = option(
        None, "SoC model id (e.g. 60 for Snapdragon X Elite). Default: the EP's.", minimum=0
    )
    embed: bool = option(
        False,
        "Embed the context binary in model_ctx.onnx (default: a .bin file beside it).",
    )
    keep_uncompiled: bool = option(True, "Ship model.onnx beside the compiled model.")
    require_ep: bool = option(
        False,
        "Fail where the EP cannot load on this host (default: the step is skipped with the "
        "reason).",
    )
    parts: int | None = option(
        None,
        "Compile the graph as this many consecutive parts, cut at tensor boundaries, in "
        "one model_ctx.onnx with an EPContext node per part. Default: one part, or the "
        "fewest whose every part's preparation estimate fits the memory budget.",
        minimum=1,
        maximum=16,
    )
    cut_after: tuple[str, ...] | None = option(
        None,
        "Cut the graph right after these tensors (QuantizeLinear outputs), in graph order: "
        "one part more than names. Wins over parts.",
    )
    boundary: Literal["quantized", "float"] = option(
        "quantized",
        "What crosses between parts of a QDQ graph: the quantized tensor (a Q output) or "
        "its float DequantizeLinear output, quantized again at the next part's start.",
    )
    samples: int = option(
        1,
        "Synthetic samples run through both the compiled and the uncompiled model on the EP "
        "(they must agree). 0: the compiled model is only loaded back with CPU fallback off, "
        "for graphs an emulated backend runs too slowly (a full-size encoder on an x86_64 "
        "host's HTP emulation: hours per sample).",
        minimum=0,
        maximum=16,
    )
    seed: int = option(0, minimum=0)


@register
class CompilePass(Pass[CompileConfig]):
    name = "compile"
    version = 1
    summary = "EPContext model for the target's EP (e.g. an NPU's): compiled once, loaded as is."
    devices = frozenset({"npu"})
    uses_contract = True

    def skip_reason(self, facts: ModelFacts, config: CompileConfig, target: Target) -> str | None:
        from winml_recipes.services.runtime import provider_for

        ep = provider_for(target)
        if ep.is_cpu:
            return "the target's execution provider is the CPU EP: nothing to compile"
        if ep.compiles is None:
            return f"the target's execution provider {ep.key} compiles nothing ahead of time"
        return None

    def estimate_memory(
        self, src: Path, config: CompileConfig, inputs: EstimateInputs
    ) -> MemoryEstimate | None:
        from winml_recipes.sdk.estimates import MemoryEstimate
        from winml_recipes.services.memory import (
            forward_estimate,
            larger,
            preparation_estimate,
            quantized_later,
        )
        from winml_recipes.services.runtime import provider_for

        ep = provider_for(inputs.target)
        if quantized_later(src, inputs.target):  # checked on the QDQ graph when it runs
            return None
        prepare = preparation_estimate(src, inputs.contract, ep, "compile")
        try:
            split = _split_plan(src, config, ep, inputs.contract, inputs.budget_mb)
        except PassError:  # e.g. no split fits: the whole graph's estimate says so
            split = None
        if split is not None and split.count and prepare is not None:  # one at a time
            worst = max(split.estimates_mb)
            prepare = MemoryEstimate(
                worst,
                f"compile in {split.count} parts ({split.why}): the largest part's "
                f"preparation for {ep.key} (whole graph: {prepare.mb:.0f} MB)",
                prepare.lower_by,
            )
        if config.samples == 0:  # loaded back, not run
            return prepare
        # the EP prepares the graph (in a child process), then both models run on it
        return larger(
            prepare, forward_estimate(src, inputs.contract, "compiled vs uncompiled forward")
        )

    def opens_on_target(self, config: CompileConfig) -> bool:
        return True  # with CPU fallback off

    def key_material(self, config: CompileConfig, ctx: StepContext) -> Any:
        from winml_recipes.services.runtime import identity, provider_for

        ep = provider_for(ctx.target)
        key: dict[str, Any] = {"execution_provider": identity(ep.key)}
        if ctx.input_model is not None and ep.compiles is not None:
            from winml_recipes.services.runtime import SPLIT_VERSION

            # the budget decides the part count: the count (not the budget) is in the key
            try:
                split = _split_plan(ctx.input_model, config, ep, ctx.contract, ctx.budget_mb)
            except PassError:  # run() says it
                split = None
            if split is not None and split.count:
                key["split"] = {"parts": split.count, "version": SPLIT_VERSION}
        return key

    def run(
        self, src: Path | None, out_dir: Path, config: CompileConfig, ctx: StepContext
    ) -> StepResult:
        from winml_recipes.services.runtime import (
            compile_epcontext,
            explain,
            open_session,
            provider_for,
            skip_if_unavailable,
        )
        from winml_recipes.services.samples import synthetic, take

        assert src is not None
        ep = provider_for(ctx.target)
        if (skipped := skip_if_unavailable(ep, required=config.require_ep)) is not None:
            return skipped
        compiled = out_dir / COMPILED
        provider_options = _provider_options(config, ep)
        split = _split_plan(src, config, ep, ctx.contract, ctx.budget_mb)
        if split.count:
            return _run_split(src, out_dir, config, ctx, ep, split, provider_options)
        # A child process compiles: the same bytes wherever and after whatever it runs.
        try:
            compile_epcontext(
                src,
                compiled,
                ep.key,
                embed=config.embed,
                provider_options=provider_options,
                device=ctx.target.device,
            )
        except ExecutionProviderError as exc:  # no node named: bisect to the failing region
            raise explain(exc, src, ep.key, provider_options=provider_options,
                          progress=ctx.progress) from None  # fmt: skip
        if not compiled.is_file():
            raise PassError(f"{ep.provider} wrote no EPContext model")
        device = ctx.target.device
        if config.samples == 0:
            return _loaded_back(out_dir, config, ep, device, provider_options, {})
        uncompiled = open_session(
            src, ep.key, fallback=False, provider_options=provider_options, device=device
        )
        loaded = open_session(compiled, ep.key, fallback=False, device=device)
        feeds = take(
            synthetic(ctx.contract, config.samples, config.seed + ctx.seed),
            config.samples,
        )
        before = [uncompiled.run(f, i) for i, f in enumerate(feeds)]
        after = [loaded.run(f, i) for i, f in enumerate(feeds)]
        return _record(
            out_dir, config, ep, provider_options,
            compiled_vs_uncompiled=_agreement(before, after, config.samples),
        )  # fmt: skip


def _split_plan(src: Path, config: CompileConfig, ep: Any, contract: Any, budget_mb: Any) -> Any:
    """The parts this compile makes (count 0: the graph is compiled whole)."""
    from winml_recipes.services.memory import contract_shapes, resolve_budget
    from winml_recipes.services.runtime import plan_split

    if ep.compiles is None:
        from winml_recipes.services.runtime import SplitPlan

        return SplitPlan((), (), None, "")
    budget = budget_mb if budget_mb is not None else resolve_budget(None)
    try:
        shapes = contract_shapes(contract)
        return plan_split(
            src, ep, shapes, config.parts, budget, config.boundary, config.cut_after or ()
        )
    except ValueError as exc:  # a tensor without a type: shapes not static yet
        raise PassError(f"compile: cannot split the graph into parts: {exc}") from None


def _run_split(
    src: Path,
    out_dir: Path,
    config: CompileConfig,
    ctx: StepContext,
    ep: Any,
    split: Any,
    provider_options: dict[str, str],
) -> StepResult:
    """Compile `split`'s parts into one stitched model_ctx.onnx; compare it with the
    uncompiled parts run one after another on the EP (the whole graph may not prepare)."""
    from winml_recipes.services.runtime import (
        compile_parts,
        open_session,
        part_models,
    )
    from winml_recipes.services.samples import synthetic, take

    compiled = out_dir / COMPILED
    device = ctx.target.device
    work = ctx.work_dir / "parts"
    try:
        parts = compile_parts(
            split, src, work, compiled, ep.key,
            embed=config.embed, provider_options=provider_options, device=device,
        )  # fmt: skip
    except ExecutionProviderError as exc:
        raise PassError(f"compile in {split.count} parts: {exc.message}") from None
    split_record = {
        "parts": parts,
        "boundary": config.boundary,
        "why": split.why,
        "whole_estimate_mb": None if split.whole_mb is None else round(split.whole_mb),
    }
    if config.samples == 0:
        return _loaded_back(out_dir, config, ep, device, provider_options, {"split": split_record})
    feeds = take(synthetic(ctx.contract, config.samples, config.seed + ctx.seed), config.samples)
    before: list[dict[str, Any]] = [dict(f) for f in feeds]
    for path in part_models(split, work):  # one session at a time
        session = open_session(
            path, ep.key, fallback=False, provider_options=provider_options, device=device
        )
        names = [i.name for i in session.session.get_inputs()]
        for i, values in enumerate(before):
            values.update(session.run({n: values[n] for n in names}, i))
        del session
    outputs = _graph_outputs(src)
    before = [{n: v[n] for n in outputs} for v in before]
    loaded = open_session(compiled, ep.key, fallback=False, device=device)
    after = [loaded.run(f, i) for i, f in enumerate(feeds)]
    against = f"the {split.count} uncompiled parts in sequence on the EP"
    return _record(
        out_dir, config, ep, provider_options,
        split=split_record,
        compiled_vs_uncompiled=_agreement(before, after, config.samples, against=against),
    )  # fmt: skip


def _loaded_back(
    out_dir: Path,
    config: CompileConfig,
    ep: Any,
    device: str,
    provider_options: dict[str, str],
    extra: dict[str, Any],
) -> StepResult:
    """`samples: 0`: the compiled model loaded back on the EP with CPU fallback off (every
    node placed there), not run; the record says so."""
    import time

    from winml_recipes.services.runtime import open_session

    started = time.perf_counter()
    open_session(out_dir / COMPILED, ep.key, fallback=False, device=device)
    return _record(
        out_dir, config, ep, provider_options,
        **extra,
        compiled_vs_uncompiled=None,
        loaded_back_seconds=round(time.perf_counter() - started, 2),
    )  # fmt: skip


def _agreement(
    before: list[dict[str, Any]], after: list[dict[str, Any]], samples: int, **extra: Any
) -> dict[str, Any]:
    """The compiled model's outputs (`after`) against the uncompiled ones (`before`)."""
    from winml_recipes.services.runtime import compare_runs

    max_abs = max(m["max_abs"] for m in compare_runs(before, after).values())
    return {"max_abs": max_abs, "bit_exact": max_abs == 0.0, "samples": samples, **extra}


def _record(
    out_dir: Path,
    config: CompileConfig,
    ep: Any,
    provider_options: dict[str, str],
    **fields: Any,
) -> StepResult:
    """The step's result: model_ctx.onnx first among the files in `out_dir`, the EP and
    its options, then `fields` (whole graph, split or loaded back) in their order."""
    from winml_recipes.services.runtime import identity

    artifacts = sorted(p.name for p in out_dir.iterdir() if p.is_file())
    artifacts.remove(COMPILED)
    return StepResult(
        None,
        {
            "execution_provider": identity(ep.key),
            "provider_options": provider_options,
            "embed": config.embed,
            **fields,
        },
        artifacts=(COMPILED, *artifacts),
        ship_model=config.keep_uncompiled,
    )


def _graph_outputs(path: Path) -> list[str]:
    from winml_recipes.services.models import load_model

    return [o.name for o in load_model(path, load_external_data=False).graph.output]


def _provider_options(config: CompileConfig, ep: Any) -> dict[str, str]:
    """The compile options the recipe set, as the EP's provider options (its plugin's
    `compile_options` names them); an option the EP does not take is an error."""
    out = {}
    for name in ("htp_arch", "soc_model"):
        value = getattr(config, name)
        if value is None:
            continue
        if name not in ep.compile_options:
            raise PassError(
                f"compile: {name} is not an option of the {ep.key} execution provider; remove it"
            )
        out[ep.compile_options[name]] = str(value)
    return out
