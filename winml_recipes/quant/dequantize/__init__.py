"""Dequantize: rewrite a post-training-quantized ONNX model back into a plain float model.

Design: "expand, fold, collapse", as onnxscript rules and onnx_ir passes in one
PassManager (see `dequantize_passes`):

1. expand   every fused quantized op becomes DequantizeLinear on its quantized inputs ->
            the float op -> QuantizeLinear on its quantized output (rules.py: one rewrite
            rule per op, whose check says why it cannot); weight-only ops become the float
            op over a float weight; the DynamicQuantizeLinear -> ConvInteger/MatMulInteger
            -> Cast -> Mul fusions of `quantize_dynamic` become Conv/MatMul (a pass).
2. fold     DequantizeLinear of a constant becomes a float constant `(W - zp) * scale`.
3. collapse QuantizeLinear -> DequantizeLinear become a direct edge (passes.py).

A quantized op that is left is an error naming it and, when a rule or pass refused it,
why ("cannot dequantize node conv1 (QLinearConv): scale 'xs' is not a constant ...").
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx
import onnx_ir as ir

from winml_recipes.quant.dequantize.passes import (
    Cleanup,
    CollapseQDQ,
    ExpandFusedOps,
    FindRemaining,
    FoldWeightDQ,
    IntegerFusions,
    UniqueNodeNames,
)
from winml_recipes.quant.dequantize.report import DequantizeReport, Leftover
from winml_recipes.quant.dequantize.rules import fused_op_rules
from winml_recipes.quant.dequantize.state import DequantizeState
from winml_recipes.quant.dequantize.values import QUANT_OPS, is_quant_op
from winml_recipes.sdk.errors import PassError

__all__ = ["QUANT_OPS", "DequantizeReport", "Leftover", "dequantize_model", "dequantize_passes"]


def dequantize_passes(state: DequantizeState) -> ir.passes.PassManager:
    """The run, in order: expand, fold, collapse, fold again, clean up, report."""
    rules = fused_op_rules(state, {(n.domain, n.op_type) for n in state.nodes()})
    fold = FoldWeightDQ(state)  # one instance: equal weights share one constant
    return ir.passes.PassManager(
        [
            *([ExpandFusedOps(state, rules)] if rules else []),
            IntegerFusions(state),
            fold,
            CollapseQDQ(state),
            fold,  # DQs that hoisting moved onto constants
            Cleanup(state),
            UniqueNodeNames(state),
            FindRemaining(state, rules),
        ]
    )


def dequantize_model(model: onnx.ModelProto) -> tuple[onnx.ModelProto, DequantizeReport]:
    """A float copy of `model` and what was rewritten; `model` itself is not modified.

    Raises a one-line PassError when quantized ops remain: those no rule covers, and those
    a rule refused (a scale that is not a constant, an attribute or dtype this rewrite
    does not support), with the rule's reason.
    """
    if not any(is_quant_op(n.op_type, n.domain) for n in _all_proto_nodes(model)):
        return _copy(model), DequantizeReport()
    # onnx_ir wraps (does not copy) the tensors of the proto it reads, and renaming a value
    # renames its tensor: work on a copy so the caller's model is never touched.
    ir_model = ir.from_proto(_copy(model))
    state = DequantizeState(ir_model)
    dequantize_passes(state)(ir_model)
    report = state.report()
    if report.remaining:
        raise PassError(report.error_message())
    if not report.changed:
        return _copy(model), report
    return ir.to_proto(ir_model), report


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _all_proto_nodes(model: onnx.ModelProto) -> Iterator[onnx.NodeProto]:
    def walk(nodes) -> Iterator[onnx.NodeProto]:
        for node in nodes:
            yield node
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    yield from walk(attr.g.node)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    for g in attr.graphs:
                        yield from walk(g.node)

    yield from walk(model.graph.node)
    for fn in model.functions:
        yield from walk(fn.node)
