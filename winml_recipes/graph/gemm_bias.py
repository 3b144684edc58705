"""A Gemm's constant C of shape [1, N] as the vector [N] it broadcasts as (exact).

tf2onnx writes a Keras Dense bias as a [1, N] constant (`Dense/Reshape:0`), and
onnxruntime's MatMul + Add fusion (the normalize step) keeps that shape as the Gemm's C.
onnxruntime's QDQ quantizer (1.31) then takes C as a per-channel bias of N rows: with 8-bit
activations its int32-bias weight-scale adjustment compares a whole row where it expects one
value and raises ("The truth value of an array with more than one element is ambiguous":
magika at cpu/int8), and otherwise it writes a [N] scale on axis 0, whose size is 1, which
onnxruntime refuses to run (quant/validity.py repairs that one). Gemm's output is [M, N] and C
broadcasts to it one way, so [1, N] and [N] give the same result bit for bit.
"""

from __future__ import annotations

import onnx_ir as ir

RULE = "gemm_bias_as_vector"


class GemmBiasAsVectorPass(ir.passes.InPlacePass):
    """Reshape every Gemm's constant [1, N] C to [N] (a C other nodes read too gets a copy
    for this Gemm)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        changed = 0
        for node in ir.traversal.RecursiveGraphIterator(model.graph):
            if node.op_type != "Gemm" or node.domain not in ("", "ai.onnx") or len(node.inputs) < 3:
                continue
            bias = node.inputs[2]
            value = bias.const_value if bias is not None else None
            if value is None or len(value.shape) != 2 or value.shape[0] != 1:
                continue
            if bias.is_graph_input():  # a caller may feed its own C
                continue
            flat = value.numpy().reshape(-1)
            if len(bias.uses()) == 1:  # only this Gemm reads it: the same name, reshaped
                bias.const_value = ir.tensor(flat, name=bias.name)
                bias.shape = ir.Shape(flat.shape)
            else:
                node.replace_input_with(2, _copy(node, bias, flat))
            changed += 1
        return ir.passes.PassResult(model, modified=changed > 0)


def _copy(node: ir.Node, bias: ir.Value, flat) -> ir.Value:
    """A new initializer holding `flat`, named after `bias`."""
    graph = node.graph
    assert graph is not None
    name = f"{bias.name}_vector"
    while name in graph.initializers:
        name += "_"
    vector = ir.tensor(flat, name=name)
    copy = ir.Value(name=name, shape=ir.Shape(flat.shape), type=ir.TensorType(vector.dtype),
                    const_value=vector)  # fmt: skip
    graph.register_initializer(copy)
    return copy
