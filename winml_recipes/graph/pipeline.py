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

# Stage name -> the rules it applies (a stage is what the exactness check can name).
STAGES: dict[str, tuple[str, ...]] = {
    "fold": (RULE_FOLD, RULE_IF),
    "gathernd": (RULE_GATHERND,),
    "recurrent": (RULE_LSTM, RULE_GRU),
}


@dataclass
class Prepared:
    model: onnx.ModelProto
    log: RewriteLog
    folded: dict[str, int] = field(default_factory=dict)  # op type -> nodes folded away
    seconds: dict[str, float] = field(default_factory=dict)


def _stage_fns(max_elements: int) -> dict[str, Callable[[ir.Model, RewriteLog], Any]]:
    return {
        "fold": lambda m, log: fold_constants(m, log, max_elements),
        "gathernd": rewrite_gathernd,
        "recurrent": unroll_recurrent,
    }


def prepare(
    proto: onnx.ModelProto,
    stages: Sequence[str] = tuple(STAGES),
    max_elements: int = MAX_FOLDED_ELEMENTS,
) -> Prepared:
    """Run `stages` (in STAGES order) on a copy of `proto`."""
    import onnx_ir.passes.common as common

    model = ir.from_proto(proto)
    # Shapes of every value (fix_shapes keeps none but the graph's I/O): the rules read them.
    common.ShapeInferencePass(strict_mode=False)(model)
    log = RewriteLog()
    result = Prepared(proto, log)
    fns = _stage_fns(max_elements)
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
    # Inferred shapes are not kept: later steps infer their own.
    result.model.graph.ClearField("value_info")
    return result
