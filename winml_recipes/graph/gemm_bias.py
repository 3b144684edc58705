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


def row_biases(model: ir.Model) -> list[tuple[ir.Node, ir.Value]]:
    """Each Gemm (subgraphs included) whose C is a constant [1, N] that is neither a graph
    input nor a graph output (whose shape callers see), with that C. Shapes only: no
    weight is read."""
    found = []
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        if node.op_type != "Gemm" or node.domain not in ("", "ai.onnx") or len(node.inputs) < 3:
            continue
        bias = node.inputs[2]
        value = bias.const_value if bias is not None else None
        if value is None or len(value.shape) != 2 or value.shape[0] != 1:
            continue
        if bias.is_graph_input() or bias.is_graph_output():
            continue
        found.append((node, bias))
    return found


class GemmBiasAsVectorPass(ir.passes.InPlacePass):
    """Reshape every Gemm's constant [1, N] C to [N] (a C other nodes read too gets a copy
    for this Gemm). `rewritten`: (Gemm, C) names, after a call."""

    def __init__(self) -> None:
        super().__init__()
        self.rewritten: list[tuple[str, str]] = []

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        taken = _value_names(model)
        for node, bias in row_biases(model):
            self.rewritten.append((node.name or "", bias.name or ""))
            assert bias.const_value is not None
            flat = bias.const_value.numpy().reshape(-1)
            if len(bias.uses()) == 1:  # only this Gemm reads it: the same name, reshaped
                bias.const_value = ir.tensor(flat, name=bias.name)
                bias.shape = ir.Shape(flat.shape)
            else:
                node.replace_input_with(2, _copy(node, bias, flat, taken))
        return ir.passes.PassResult(model, modified=bool(self.rewritten))


def _copy(node: ir.Node, bias: ir.Value, flat, taken: set[str]) -> ir.Value:
    """A new initializer holding `flat`, named after `bias` and unlike any name in `taken`
    (every value of the model, which it joins)."""
    graph = node.graph
    assert graph is not None
    name = f"{bias.name}_vector"
    while name in taken:
        name += "_"
    taken.add(name)
    vector = ir.tensor(flat, name=name)
    copy = ir.Value(name=name, shape=ir.Shape(flat.shape), type=ir.TensorType(vector.dtype),
                    const_value=vector)  # fmt: skip
    graph.register_initializer(copy)
    return copy


def _value_names(model: ir.Model) -> set[str]:
    """Every value name in the model's graphs, subgraphs included."""
    names: set[str] = set()
    for graph in model.graphs():
        names.update(v.name for v in [*graph.inputs, *graph.initializers.values()] if v.name)
        for node in graph:
            names.update(v.name for v in node.outputs if v.name)
    return names
