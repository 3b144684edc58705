"""Attention in query chunks, so no score tensor is larger than HTP prepares in bounded memory.

`MatMul(A, B) -> [Mul/Div/Add/Sub by a side operand]* -> Softmax(last axis) -> MatMul(., V)`
(what torch's dynamo export writes for SDPA: A = Q * sqrt(scale), B = K^T * sqrt(scale); an
eager export puts a Mul or Div after the first MatMul and an Add of a mask) becomes, when the
score tensor has more elements than the bound: A split along its query axis (-2), the chain
run on each chunk of rows, the chunks' outputs concatenated on that axis. Each output row
depends only on its own query row, so the numbers are the same in float.

An onnx_ir pass, not an onnxscript pattern rule: the chain between the MatMuls has any
number of elementwise steps with the side operand on either side, and the replacement's
size depends on the shapes (one branch per chunk).
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from winml_recipes.graph.log import RewriteLog

RULE = "chunk_attention_queries"
_CHAIN_OPS = ("Mul", "Div", "Add", "Sub")
# More chunks than this would mean one branch per few query rows: left as it is, logged.
MAX_CHUNKS = 256
# Query rows per chunk are a multiple of this where a chunk holds that many.
ALIGN = 64


def _dims(value: ir.Value | None) -> list[int] | None:
    if value is None or value.shape is None:
        return None
    dims = list(value.shape)
    return dims if all(isinstance(d, int) for d in dims) else None


def _only_reader(value: ir.Value) -> ir.Node | None:
    if value.is_graph_output():
        return None
    readers = [user for user, _ in value.uses()]
    return readers[0] if len(readers) == 1 else None


def _match(softmax: ir.Node) -> tuple[ir.Node, list[tuple[ir.Node, int]], ir.Node] | str:
    """(first MatMul, the elementwise chain in order with the index of each step's scores
    operand, the MatMul after the Softmax), or why the Softmax is not the pattern."""
    scores = softmax.inputs[0]
    shape = _dims(scores)
    if shape is None or len(shape) < 2:
        return "the scores' shape is not static"
    axis = softmax.attributes.get_int("axis", -1)
    if axis % len(shape) != len(shape) - 1:
        return "the Softmax is not over the last axis"
    chain: list[tuple[ir.Node, int]] = []
    value = scores
    while True:
        node = value.producer()
        if node is None:
            return "the scores are not computed by a MatMul"
        if _only_reader(value) is None:
            return f"{node.name} has other readers"
        if node.op_type == "MatMul" and node.domain == "":
            first = node
            break
        if node.op_type not in _CHAIN_OPS or node.domain != "" or len(node.inputs) != 2:
            return f"a {node.op_type} between the MatMul and the Softmax"
        if _dims(node.outputs[0]) != shape:
            return f"{node.op_type} {node.name} changes the scores' shape"
        candidates = [j for j, v in enumerate(node.inputs) if _continues(v, shape)]
        if len(candidates) != 1:
            return f"{node.op_type} {node.name}: not one operand that is the scores"
        side = _dims(node.inputs[1 - candidates[0]])
        if side is None:
            return f"{node.op_type} {node.name}: the other operand's shape is not static"
        chain.insert(0, (node, candidates[0]))
        value = node.inputs[candidates[0]]
    if _dims(first.outputs[0]) != shape or len(_dims(first.inputs[0]) or []) < 2:
        return "the first MatMul's query operand is not a matrix"
    after = _only_reader(softmax.outputs[0])
    if after is None or after.op_type != "MatMul" or after.inputs[0] is not softmax.outputs[0]:
        return "the Softmax is not read by one MatMul (probabilities x values)"
    out = _dims(after.outputs[0])
    if out is None or len(out) != len(shape) or out[-2] != shape[-2]:
        return "the MatMul after the Softmax does not keep the query rows"
    return first, chain, after


def _continues(value: ir.Value | None, shape: list[int]) -> bool:
    """Whether `value` can be the scores further up the chain (a MatMul's or a chain op's
    output of the scores' shape)."""
    node = value.producer() if value is not None else None
    return (
        node is not None
        and node.domain == ""
        and node.op_type in ("MatMul", *_CHAIN_OPS)
        and _dims(value) == shape
    )


def _sizes(rows: int, elements: int, bound: int, align: int = ALIGN) -> list[int] | str:
    """Rows per chunk, each chunk's scores within `bound` elements: multiples of `align`
    rows (the last takes the rest) where a chunk holds that many, else as even as possible."""
    per_row = elements // rows
    if per_row > bound:
        return f"one query row has {per_row} scores, over the bound of {bound}"
    fit = max(1, bound // per_row)
    if fit >= align:
        step = fit // align * align
        count = math.ceil(rows / step)
        sizes = [step] * (count - 1) + [rows - step * (count - 1)]
    else:
        count = math.ceil(rows / fit)
        base, extra = divmod(rows, count)
        sizes = [base + (1 if k < extra else 0) for k in range(count)]
    if count > MAX_CHUNKS:
        return f"{count} chunks would be needed (at most {MAX_CHUNKS})"
    return sizes


class ChunkedAttentionPass(ir.passes.InPlacePass):
    """Attention whose score tensor has more than `bound` elements, computed in query
    chunks (see the module docstring); logged as `chunk_attention_queries`."""

    rule_name = RULE

    def __init__(self, log: RewriteLog, bound: int) -> None:
        super().__init__()
        self.log = log
        self.bound = bound

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        opset = model.opset_imports.get("", 0)
        changed = 0
        for graph in (model.graph, *model.graph.subgraphs()):
            for softmax in [n for n in graph if n.op_type == "Softmax" and n.domain == ""]:
                shape = _dims(softmax.inputs[0])
                if shape is None or math.prod(shape) <= self.bound:
                    continue
                found = _match(softmax)
                if isinstance(found, str):
                    self.log.keep(RULE, softmax.name, found)
                    continue
                if opset < 13:
                    self.log.keep(RULE, softmax.name, "opset below 13 (Split takes no sizes)")
                    continue
                sizes = _sizes(shape[-2], math.prod(shape), self.bound)
                if isinstance(sizes, str):
                    self.log.keep(RULE, softmax.name, sizes)
                    continue
                _chunk(graph, softmax, *found, sizes)
                self.log.add(RULE, softmax.name)
                changed += 1
        return ir.passes.PassResult(model, bool(changed))


def _chunk(
    graph: ir.Graph,
    softmax: ir.Node,
    first: ir.Node,
    chain: list[tuple[ir.Node, int]],
    after: ir.Node,
    sizes: list[int],
) -> None:
    """Replace first -> chain -> softmax -> after by one branch per chunk of query rows."""
    base = softmax.name or softmax.outputs[0].name or "attention"
    rank = len(_dims(softmax.inputs[0]) or [])
    new: list[ir.Node] = []
    split_sizes = ir.Value(
        name=f"{base}_chunk_rows",
        const_value=ir.tensor(np.array(sizes, np.int64), name=f"{base}_chunk_rows"),
    )
    split_sizes.shape, split_sizes.dtype = ir.Shape([len(sizes)]), ir.DataType.INT64
    graph.register_initializer(split_sizes)

    def split(value: ir.Value, tag: str) -> list[ir.Value]:
        """`value` in chunks of rows along its query axis (-2), or shared by every chunk
        when it broadcasts over that axis."""
        dims = _dims(value) or []
        if len(dims) < 2 or dims[-2] == 1:
            return [value] * len(sizes)
        node = ir.node("Split", [value, split_sizes], attributes={"axis": len(dims) - 2},
                       num_outputs=len(sizes), name=f"{base}_split_{tag}")  # fmt: skip
        for k, out in enumerate(node.outputs):
            out.name = f"{base}_{tag}_chunk{k}"
            out.dtype = value.dtype
            out.shape = ir.Shape([*dims[:-2], sizes[k], dims[-1]])
        new.append(node)
        return list(node.outputs)

    def step(node: ir.Node, inputs: list[ir.Value], k: int, rows: int) -> ir.Value:
        out_name = node.outputs[0].name
        copy = ir.node(node.op_type, inputs, attributes=dict(node.attributes),
                       domain=node.domain, name=f"{node.name or out_name}_chunk{k}")  # fmt: skip
        out = copy.outputs[0]
        dims = _dims(node.outputs[0]) or []
        out.name = f"{node.outputs[0].name}_chunk{k}"
        out.dtype = node.outputs[0].dtype
        out.shape = ir.Shape([*dims[:-2], rows, dims[-1]])
        new.append(copy)
        return out

    queries = split(first.inputs[0], "queries")
    sides = [split(node.inputs[1 - at], f"operand{i}") for i, (node, at) in enumerate(chain)]
    outputs = []
    for k, rows in enumerate(sizes):
        value = step(first, [queries[k], first.inputs[1]], k, rows)
        for i, (node, at) in enumerate(chain):
            inputs = [value, sides[i][k]] if at == 0 else [sides[i][k], value]
            value = step(node, inputs, k, rows)
        value = step(softmax, [value], k, rows)
        outputs.append(step(after, [value, after.inputs[1]], k, rows))
    old = after.outputs[0]
    concat = ir.node("Concat", outputs, attributes={"axis": rank - 2}, name=f"{base}_concat")
    joined = concat.outputs[0]
    joined.dtype, joined.shape = old.dtype, old.shape
    new.append(concat)
    graph.insert_before(after, new)
    ir.convenience.replace_all_uses_with(old, joined, replace_graph_outputs=True)
    name, old.name = old.name, None
    joined.name = name
    graph.remove([first, *(n for n, _ in chain), softmax, after], safe=True)
