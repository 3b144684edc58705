"""prepare: fold what static shapes made constant and rewrite what the NPU refuses, exactly.

Runs after fix_shapes. Stages (winml_recipes.graph): `fold` (Shape, Range, ConstantOfShape,
Expand, ... subgraphs to initializers; `If` with a constant condition inlined), `gathernd`
(GatherND with constant indices as Gather/Slice), `recurrent` (LSTM/GRU unrolled over the
static sequence length), `ep` (the target EP plugin's exact float rewrites, its
`graph_rules()`: for the NPU's default EP BatchNorm as Mul/Add, erf GELU as Gelu, scatters
and GatherND at constant positions, x + 0, ...; nothing for the CPU EP). The
rewritten model is run against the input model on the CPU EP on seeded inputs from the I/O
contract; outputs that differ beyond the tolerance of
graph/exactness.py fail the step, naming the stage and its rules.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from winml_recipes.sdk.config import option
from winml_recipes.sdk.errors import PassError
from winml_recipes.sdk.passes import Pass, model_file, register
from winml_recipes.sdk.target import Target
from winml_recipes.sdk.types import ModelFacts, StepContext, StepResult

if TYPE_CHECKING:
    import onnx

    from winml_recipes.sdk.ep import GraphRules
    from winml_recipes.sdk.estimates import EstimateInputs, MemoryEstimate

Stage = Literal["fold", "gathernd", "recurrent", "ep"]


@dataclass(frozen=True)
class PrepareConfig:
    stages: tuple[Stage, ...] = option(
        ("fold", "gathernd", "recurrent", "ep"),
        "Stages to run (always in this order): fold (constant subgraphs, If with a constant "
        "condition), gathernd (GatherND with constant indices as Gather/Slice), recurrent "
        "(LSTM/GRU unrolled over the static sequence length), ep (the target execution "
        "provider's exact float rewrites, from its plugin; for the NPU's default EP: "
        "BatchNorm as Mul/Add, erf GELU as Gelu, scatters and GatherND at constant positions "
        "as arithmetic, x + 0 bypassed).",
    )
    max_folded_elements: int = option(
        1 << 20,
        "Largest tensor (elements) constant folding may create; larger ones keep running.",
        minimum=1,
    )
    check_samples: int = option(
        1,
        "Seeded samples on which the rewritten model must match the input model on the CPU "
        "EP (0: no check).",
        minimum=0,
        maximum=16,
    )
    seed: int = option(0, minimum=0)


@register
class PreparePass(Pass[PrepareConfig]):
    name = "prepare"
    version = 3
    summary = (
        "Target preparation after fix_shapes: fold constant subgraphs, GatherND with constant "
        "indices as Gather/Slice, LSTM/GRU unrolled, the target EP's float rewrites; checked "
        "exact on the CPU EP."
    )
    uses_contract = True
    makes = frozenset({"ep_prepared"})  # the target EP's float rewrites (its `ep` stage)
    # the `ep` stage runs the target EP's rules (the key holds the target and its plugin's code)
    target_dependent = True

    def skip_reason(self, facts: ModelFacts, config: PrepareConfig, target: Target) -> str | None:
        if facts.quantized:
            return f"source already quantized ({facts.quant_summary})"
        if not config.stages:
            return "no stages chosen"
        return None

    def estimate_memory(
        self, src: Path, config: PrepareConfig, inputs: EstimateInputs
    ) -> MemoryEstimate | None:
        from winml_recipes.services.memory import forward_estimate, larger, rewrite_estimate

        phases = [rewrite_estimate(src, self.name)]
        if config.check_samples:
            phases.append(forward_estimate(src, inputs.contract, "exactness check forward"))
        return larger(*phases)

    def run(
        self, src: Path | None, out_dir: Path, config: PrepareConfig, ctx: StepContext
    ) -> StepResult:
        from winml_recipes.graph.pipeline import prepare, stage_rules
        from winml_recipes.graph.recurrent import UnrollBudgetError
        from winml_recipes.services.models import load_model, save_model

        assert src is not None
        source = load_model(src)
        before = len(source.graph.node)
        ep_rules = _ep_rules(ctx.target, config)
        try:
            done = prepare(source, config.stages, config.max_folded_elements, ep_rules)
        except UnrollBudgetError as exc:
            raise PassError(str(exc)) from None
        metrics: dict[str, Any] = {
            "nodes_before": before,
            "nodes_after": len(done.model.graph.node),
            "rewrites": done.log.to_metrics(),
            "folded": done.folded,
            "seconds": done.seconds,
        }
        if ep_rules is not None:
            metrics["ep_rules"] = ep_rules.name
        if done.log.kept:
            metrics["kept"] = done.log.kept
        if not done.log.nodes:
            return StepResult(None, metrics, skipped="nothing to fold or rewrite")
        out = save_model(done.model, model_file(out_dir))
        if config.check_samples:
            feeds = _feeds(source, ctx, config)
            problem = _difference(src, out, feeds, ctx)
            if problem:
                stage = _culprit(source, src, feeds, config, ctx, ep_rules)
                rules = ", ".join(stage_rules(stage, ep_rules))
                raise PassError(
                    f"prepare stage '{stage}' ({rules}) is not exact: {problem}; leave it out "
                    f"with prepare: {{stages: [...]}} and report the model"
                )
            metrics["checked_samples"] = len(feeds)
        return StepResult(out, metrics)


def _feeds(model: onnx.ModelProto, ctx: StepContext, config: PrepareConfig) -> list:
    """Seeded inputs from the contract, shaped as the model's (static) inputs are."""
    from winml_recipes.services.models import make_inputs, specs_from_model

    specs, dims = specs_from_model(model)
    by_name = {s.name: s for s in ctx.contract.inputs}
    chosen = []
    for spec in specs:
        given = by_name.get(spec.name)
        chosen.append(replace(given, shape=spec.shape) if given is not None else spec)
    return make_inputs(chosen, dims, config.seed + ctx.seed + 4099, config.check_samples)


def _difference(src: Path, out: Path, feeds: list, ctx: StepContext) -> str | None:
    from winml_recipes.graph.exactness import first_difference
    from winml_recipes.services.runtime import run_reference as run_model

    return first_difference(run_model(src, feeds), run_model(out, feeds))


def _ep_rules(target: Target, config: PrepareConfig) -> GraphRules | None:
    """The target EP plugin's float rewrites, when the `ep` stage is chosen."""
    from winml_recipes.services.runtime import provider_for

    return provider_for(target).graph_rules() if "ep" in config.stages else None


def _culprit(
    source: onnx.ModelProto,
    src: Path,
    feeds: list,
    config: PrepareConfig,
    ctx: StepContext,
    ep_rules: GraphRules | None,
) -> str:
    """The first stage whose output (with the stages before it) is not exact."""
    from winml_recipes.graph.pipeline import STAGES, prepare
    from winml_recipes.services.models import save_model

    chosen = [s for s in STAGES if s in config.stages]
    for k in range(1, len(chosen) + 1):
        partial = prepare(source, chosen[:k], config.max_folded_elements, ep_rules)
        path = save_model(partial.model, ctx.work_dir / f"stage{k}.onnx")
        if _difference(src, path, feeds, ctx):
            return chosen[k - 1]
    return chosen[-1]
