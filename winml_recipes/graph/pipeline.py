"""The preparation stages in order, each a function rewriting an ir.Model in place."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx
import onnx_ir as ir

from winml_recipes.graph.fold import MAX_FOLDED_ELEMENTS, RULE_FOLD, RULE_IF, fold_constants
from winml_recipes.graph.gathernd import RULE as RULE_GATHERND
from winml_recipes.graph.gathernd import rewrite_gathernd
from winml_recipes.graph.log import RewriteLog
from winml_recipes.graph.recurrent import RULE_GRU, RULE_LSTM, unroll_recurrent
from winml_recipes.sdk.ep import GraphRules

# Stage name -> the rules it applies (a stage is what the exactness check can name).
STAGES: dict[str, tuple[str, ...]] = {
    "fold": (RULE_FOLD, RULE_IF),
    "gathernd": (RULE_GATHERND,),
    "recurrent": (RULE_LSTM, RULE_GRU),
    # the target EP's exact float rewrites (its plugin's GraphRules; none for the CPU EP):
    # leave "ep" out to turn them off
    "ep": (),
}


@dataclass
class Prepared:
    model: onnx.ModelProto
    log: RewriteLog
    folded: dict[str, int] = field(default_factory=dict)  # op type -> nodes folded away
    seconds: dict[str, float] = field(default_factory=dict)


def _stage_fns(
    max_elements: int, ep_rules: GraphRules | None
) -> dict[str, Callable[[ir.Model, RewriteLog], Any]]:
    return {
        "fold": lambda m, log: fold_constants(m, log, max_elements),
        "gathernd": rewrite_gathernd,
        "recurrent": unroll_recurrent,
        "ep": ep_rules.rewrite if ep_rules is not None else (lambda m, log: log),
    }


def stage_rules(stage: str, ep_rules: GraphRules | None) -> tuple[str, ...]:
    """The rules a stage applies (the `ep` stage's come from the target's EP plugin)."""
    if stage == "ep":
        return ep_rules.rules if ep_rules is not None else ()
    return STAGES[stage]


def prepare(
    proto: onnx.ModelProto,
    stages: Sequence[str] = tuple(STAGES),
    max_elements: int = MAX_FOLDED_ELEMENTS,
    ep_rules: GraphRules | None = None,
) -> Prepared:
    """Run `stages` (in STAGES order) on a copy of `proto`; `ep_rules` are the target EP's
    float rewrites (the `ep` stage)."""
    import onnx_ir.passes.common as common

    model = ir.from_proto(proto)
    # Shapes of every value (fix_shapes keeps none but the graph's I/O): the rules read them.
    common.ShapeInferencePass(strict_mode=False)(model)
    log = RewriteLog()
    result = Prepared(proto, log)
    fns = _stage_fns(max_elements, ep_rules)
    for name in STAGES:
        if name not in stages:
            continue
        start = time.perf_counter()
        out = fns[name](model, log)
        if name == "fold":
            result.folded = dict(sorted(out.removed.items()))
        result.seconds[name] = round(time.perf_counter() - start, 3)
    common.RemoveUnusedNodesPass()(model)
    common.NameFixPass()(model)
    result.model = ir.to_proto(model)
    # Inferred shapes are not kept: later steps infer their own. onnx cannot infer the
    # outputs of other domains' ops (HTP's com.microsoft Gelu): their types stay.
    _keep_value_info(result.model.graph)
    return result


def _keep_value_info(graph: onnx.GraphProto) -> None:
    """Drop the value_info onnx's shape inference can recompute."""
    foreign = {o for n in graph.node if n.domain not in ("", "ai.onnx") for o in n.output}
    kept = [v for v in graph.value_info if v.name in foreign]
    graph.ClearField("value_info")
    graph.value_info.extend(kept)
