"""Constant folding once shapes are static: Shape, Range, ConstantOfShape, Expand, ...

With static input shapes, the subgraphs a model uses to compute sizes, anchor grids or
position ids at run time (Shape -> Gather -> Range -> ...) compute constants. HTP (the npu's EP)
refuses Range and several other shape ops, so they are folded into initializers here by
onnxscript's constant folder (its node-level shape inference makes Shape constant once
the input shapes are). The folder also inlines the taken branch of an `If` whose condition
became a constant; those are recorded under their own rule.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass, field

import onnx_ir as ir

from winml_recipes.graph.log import RewriteLog

# Largest tensor (in elements) the folder may create or read: 1,048,576 elements, 4 MiB of
# float32. What the folded subgraphs compute (shape vectors, index and position tables, a
# detector's anchor grid: 8,400 x 2 at 640 px, 34,000 x 2 at 1280 px) is far below it, while
# a ConstantOfShape / Expand broadcasting a scalar to an activation-sized tensor (a
# [1, 256, 288, 288] mask: 21 M elements) would be written into the model file as a weight
# and is left to run instead.
MAX_FOLDED_ELEMENTS = 1 << 20
MAX_ROUNDS = 4
RULE_FOLD = "fold_constants"
RULE_IF = "inline_constant_if"


@dataclass
class FoldResult:
    removed: Counter = field(default_factory=Counter)  # op type -> nodes folded away
    rounds: int = 0


# Scatter inputs (data, updates) that stay computed: sam3-tiny's decoder, folded, had its
# last ScatterElements' updates become a quantized initializer, and HTP then failed to
# finalize the w8a16 and uint8 graphs (a MEM_ALLOC error; the same as exported
# finalized). HTP runs what feeds them either way: nothing it refuses is kept.
_KEEP_FEEDING = {"ScatterElements": (0, 2), "ScatterND": (0, 2), "Scatter": (0, 2)}


def _scatter_operands(graph: ir.Graph) -> set[int]:
    """ids of the values a scatter reads as data or updates."""
    out: set[int] = set()
    for node in graph:
        for k in _KEEP_FEEDING.get(node.op_type, ()) if node.domain == "" else ():
            if k < len(node.inputs) and node.inputs[k] is not None:
                out.add(id(node.inputs[k]))
    return out


def _should_fold(node: ir.Node, keep: set[int]) -> bool | None:
    """ConstantOfShape is on the folder's keep list (to keep files small); with a constant
    shape its size is checked by the output limit like any other folded tensor. Values a
    scatter reads as data or updates are not folded (see _KEEP_FEEDING)."""
    if any(id(v) in keep for v in node.outputs):
        return False
    if node.op_type == "ConstantOfShape" and node.domain == "":
        shape = node.inputs[0] if node.inputs else None
        return True if shape is not None and shape.const_value is not None else None
    return None


def fold_constants(
    model: ir.Model, log: RewriteLog, max_elements: int = MAX_FOLDED_ELEMENTS
) -> FoldResult:
    """Fold until nothing changes (at most MAX_ROUNDS rounds); record the nodes removed."""
    import onnx_ir.passes.common as common
    from onnxscript.optimizer import fold_constants_ir

    before = {id(n): (n.name, n.op_type) for n in model.graph}
    result = FoldResult()
    for _ in range(MAX_ROUNDS):
        result.rounds += 1
        keep = _scatter_operands(model.graph)
        changed = fold_constants_ir(
            model,
            onnx_shape_inference=True,
            input_size_limit=max_elements,
            output_size_limit=max_elements,
            should_fold=functools.partial(_should_fold, keep=keep),
        ).modified
        changed |= common.RemoveUnusedNodesPass()(model).modified
        if not changed:
            break
    kept = {id(n) for n in model.graph}
    for key, (name, op_type) in before.items():
        if key in kept:
            continue
        if op_type == "If":
            log.add(RULE_IF, name)
        else:
            log.add(RULE_FOLD, name)
            result.removed[op_type] += 1
    return result
