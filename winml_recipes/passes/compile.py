"""compile: an EPContext model for the target's execution provider (its plugin says
whether it compiles: `compiles = "epcontext"`).

Creating a session on the EP with `ep.context_enable=1` makes it compile the graph and write
`model_ctx.onnx` (an `EPContext` node holding, or pointing at, the EP's context binary):
what a device loads without compiling again. The compiled model is then loaded back on the
same EP and its outputs compared with the uncompiled model's on that EP.
"""

from __future__ import annotations

import time
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
        from winml_recipes.sdk.runtime import provider_for

        ep = provider_for(target)
        if ep.is_cpu:
            return "the target's execution provider is the CPU EP: nothing to compile"
        if ep.compiles is None:
            return f"the target's execution provider {ep.key} compiles nothing ahead of time"
        return None

    def estimate_memory(
        self, src: Path, config: CompileConfig, inputs: EstimateInputs
    ) -> MemoryEstimate | None:
        from winml_recipes.sdk.memory import forward_estimate, larger, preparation_estimate
        from winml_recipes.sdk.runtime import provider_for

        # the EP prepares the graph (in a child process), then both models run on it
        prepared = preparation_estimate(
            src, inputs.contract, provider_for(inputs.target), "compile"
        )
        if config.samples == 0:  # loaded back, not run
            return prepared
        return larger(
            prepared, forward_estimate(src, inputs.contract, "compiled vs uncompiled forward")
        )

    def opens_on_target(self, config: CompileConfig) -> bool:
        return True  # with CPU fallback off

    def key_material(self, config: CompileConfig, ctx: StepContext) -> Any:
        from winml_recipes.sdk.runtime import identity, provider_for

        return {"execution_provider": identity(provider_for(ctx.target).key)}

    def run(
        self, src: Path | None, out_dir: Path, config: CompileConfig, ctx: StepContext
    ) -> StepResult:
        from winml_recipes.sdk.runtime import (
            availability,
            compare_runs,
            compile_epcontext,
            explain,
            identity,
            open_session,
            provider_for,
        )
        from winml_recipes.sdk.samples import synthetic, take

        assert src is not None
        ep = provider_for(ctx.target)
        avail = availability(ep.key)
        if not avail.available:
            if config.require_ep:
                raise PassError(f"{ep.provider} cannot be used here: {avail.reason}")
            return StepResult(skipped=f"{ep.provider} not available here: {avail.reason}")
        compiled = out_dir / COMPILED
        provider_options = _provider_options(config, ep)
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
        artifacts = sorted(p.name for p in out_dir.iterdir() if p.is_file())
        artifacts.remove(COMPILED)
        record = {
            "execution_provider": identity(ep.key),
            "provider_options": provider_options,
            "embed": config.embed,
        }
        if config.samples == 0:  # loaded back (every node on the EP), not run
            started = time.perf_counter()
            open_session(compiled, ep.key, fallback=False, device=device)
            record["compiled_vs_uncompiled"] = None
            record["loaded_back_seconds"] = round(time.perf_counter() - started, 2)
            return StepResult(None, record, artifacts=(COMPILED, *artifacts),
                              ship_model=config.keep_uncompiled)  # fmt: skip
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
        agreement = compare_runs(before, after)
        max_abs = max(m["max_abs"] for m in agreement.values())
        return StepResult(
            None,
            {
                **record,
                "compiled_vs_uncompiled": {
                    "max_abs": max_abs,
                    "bit_exact": max_abs == 0.0,
                    "samples": config.samples,
                },
            },
            artifacts=(COMPILED, *artifacts),
            ship_model=config.keep_uncompiled,
        )


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
