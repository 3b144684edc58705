"""Tensors above HTP's rank computed at rank `max_rank` or less, by merging adjacent dims.

QNN HTP (onnxruntime-qnn 2.7) places tensors of rank 5 at most: Unsqueeze, Add and Q/DQ on a
rank-6 tensor are refused (tests/integration/test_rank_limit_htp.py). A multi-scale
deformable attention (RT-DETR, Deformable DETR) computes its sampling locations at rank 6:
offsets viewed as [B, Q, heads, levels, points, 2] plus reference points unsqueezed to
[B, Q, 1, 1, 1, 2], scaled, then one Gather per level.

A *region* is a connected set of nodes reading or writing tensors of rank r > max_rank (one
frame of axes). When every node of it is elementwise (broadcasting operands), a Slice or a
Gather (scalar index) on an axis, or a Reshape/Unsqueeze/Squeeze into or out of the region,
adjacent axes (i, i+1) can be merged in every tensor of the region at once, exactly: row-major
order is unchanged by a merge, an elementwise operand broadcasts alike when its two dims are
both 1 or both the full dims, and a Slice/Gather on another axis only has its axis renumbered.
The region is rewritten on the merged shapes: operands from outside are reshaped into the
frame (constants re-laid), entries Reshape straight to the merged shape, and what leaves
the region (Gather/Reshape outputs, graph outputs) is reshaped back to its own shape.
Exact in float: the same numbers in the same order.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from winml_recipes.graph.log import RewriteLog

RULE = "fold_high_rank_axes"

ELEMENTWISE = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Where", "Equal", "Less", "Greater",
    "And", "Or", "Sigmoid", "Relu", "Tanh", "Neg", "Exp", "Log", "Sqrt", "Abs", "Floor",
    "Ceil", "Erf", "Sin", "Cos", "Cast", "Clip", "Identity", "Softplus", "Elu", "LeakyRelu",
    "HardSigmoid", "Reciprocal", "Round", "Not",
})  # fmt: skip
# ops that take a tensor of any shape into the region, or out of it, by a row-major reshape
RESHAPES = frozenset({"Reshape", "Unsqueeze", "Squeeze", "Flatten"})


def _dims(value: ir.Value | None) -> list[int] | None:
    if value is None or value.shape is None:
        return None
    dims = list(value.shape)
    return dims if all(isinstance(d, int) for d in dims) else None


def _const(value: ir.Value | None) -> np.ndarray | None:
    tensor = ir.convenience.get_const_tensor(value) if value is not None else None
    return None if tensor is None else tensor.numpy()


class _Region:
    """One frame of rank-r tensors and the nodes that touch them."""

    def __init__(self, nodes: list[ir.Node], values: set[ir.Value], rank: int) -> None:
        self.nodes, self.values, self.rank = nodes, values, rank
        # the frame shape of every value the merge rules look at (outside operands padded)
        self.frame: dict[ir.Value, list[int]] = {}
        self.axis: dict[ir.Node, list[int]] = {}  # the frame axes a Slice/Gather works on

    def why_not(self) -> str | None:
        """Read the nodes' frames and axes; why the region cannot be folded, or None."""
        for node in self.nodes:
            ins = [v for v in node.inputs if v is not None]
            inside = [v in self.values for v in node.inputs]
            out = node.outputs[0]
            if node.domain != "" or len(node.outputs) != 1:
                return f"{node.name}: {node.op_type} is not an op the fold knows"
            if node.op_type in ELEMENTWISE:
                for v in [*ins, out]:
                    dims = _dims(v)
                    if dims is None or len(dims) > self.rank:
                        return f"{node.name}: {v.name} has no static shape in the frame"
                    self.frame[v] = [1] * (self.rank - len(dims)) + dims
            elif node.op_type in ("Slice", "Gather") and inside[0]:
                axes = self._axes(node)
                if isinstance(axes, str):
                    return f"{node.name}: {axes}"
                if _dims(out) is None:
                    return f"{node.name}: {node.op_type} without a static output shape"
                self.axis[node] = axes
                self.frame[node.inputs[0]] = _dims(node.inputs[0]) or []
                if node.op_type == "Slice":
                    self.frame[out] = _dims(out) or []
            elif node.op_type in RESHAPES:
                if _dims(out) is None or _dims(node.inputs[0]) is None:
                    return f"{node.name}: {node.op_type} without static shapes"
                for v in (node.inputs[0], out):
                    if v in self.values:
                        self.frame[v] = _dims(v) or []
            else:
                return f"{node.name}: {node.op_type} is not an op the fold knows"
        if any(len(self.frame.get(v, [])) != self.rank for v in self.values):
            return "the region's tensors are not all of one rank with static shapes"
        return None

    def _axes(self, node: ir.Node) -> list[int] | str:
        rank = self.rank
        if node.op_type == "Gather":
            index = node.inputs[1]
            if _dims(index) != []:
                return "a Gather with more than one index"
            axis = node.attributes.get_int("axis", 0)
            return [axis % rank]
        if len(node.inputs) < 4 or _const(node.inputs[3]) is None:
            return "a Slice without constant axes"
        if any(_const(v) is None for v in node.inputs[1:3]):
            return "a Slice without constant starts and ends"
        return [int(a) % rank for a in _const(node.inputs[3]).ravel()]

    def mergeable(self, i: int) -> bool:
        """May frame axes i and i+1 be merged everywhere?"""
        if any(i in axes or i + 1 in axes for axes in self.axis.values()):
            return False
        for node in self.nodes:
            if node.op_type not in ELEMENTWISE:
                continue
            out = self.frame[node.outputs[0]][i : i + 2]
            for v in node.inputs:
                if v is None:
                    continue
                pair = self.frame[v][i : i + 2]
                if pair not in ([1, 1], out):
                    return False
        return True

    def merge(self, i: int) -> None:
        for v, dims in self.frame.items():
            self.frame[v] = [*dims[:i], dims[i] * dims[i + 1], *dims[i + 2 :]]
        for node, axes in self.axis.items():
            self.axis[node] = [a - 1 if a > i else a for a in axes]
        self.rank -= 1


def _regions(graph: ir.Graph, max_rank: int) -> list[_Region]:
    """The connected regions of tensors above `max_rank` (by shared values)."""
    high = {
        v
        for node in graph
        for v in (*node.inputs, *node.outputs)
        if v is not None and v.shape is not None and len(v.shape) > max_rank
    }
    parent: dict[ir.Value, ir.Value] = {v: v for v in high}

    def root(v: ir.Value) -> ir.Value:
        while parent[v] is not v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    touching = []
    for node in graph:
        mine = [v for v in (*node.inputs, *node.outputs) if v in high]
        if mine:
            touching.append((node, mine))
            for v in mine[1:]:
                parent[root(v)] = root(mine[0])
    groups: dict[ir.Value, tuple[list[ir.Node], set[ir.Value]]] = {}
    for node, mine in touching:
        nodes, values = groups.setdefault(root(mine[0]), ([], set()))
        nodes.append(node)
        values.update(mine)
    return [
        _Region(nodes, values, max(len(v.shape) for v in values))
        for nodes, values in groups.values()
    ]


class _Writer:
    """Builds the folded region's nodes before the node each replaces."""

    def __init__(self, graph: ir.Graph, region: _Region) -> None:
        self.graph, self.region = graph, region
        self.new: dict[ir.Value, ir.Value] = {}  # region values -> folded
        self.laid: dict[ir.Value, ir.Value] = {}  # outside operands -> as the frame reads them

    def constant(self, name: str, array: np.ndarray) -> ir.Value:
        value = ir.Value(name=name, const_value=ir.tensor(array, name=name))
        value.shape, value.dtype = ir.Shape(list(array.shape)), ir.DataType.from_numpy(array.dtype)
        self.graph.register_initializer(value)
        return value

    def node(self, at: ir.Node, op: str, inputs: list, name: str, dims: list[int], like: ir.Value,
             **attrs) -> ir.Value:  # fmt: skip
        new = ir.node(op, inputs, attributes=attrs, name=name)
        out = new.outputs[0]
        out.name, out.dtype, out.shape = name, like.dtype, ir.Shape(dims)
        self.graph.insert_before(at, new)
        return out

    def reshape(self, at: ir.Node, x: ir.Value, dims: list[int], name: str) -> ir.Value:
        shape = self.constant(f"{name}_shape", np.array(dims, np.int64))
        return self.node(at, "Reshape", [x, shape], name, dims, x)

    def operand(self, at: ir.Node, v: ir.Value | None) -> ir.Value | None:
        """`v` as the folded node reads it: folded, re-laid or reshaped into the frame."""
        if v is None or v in self.new:
            return self.new.get(v) if v is not None else None
        if v not in self.laid:
            self.laid[v] = self._lay(at, v)
        return self.laid[v]

    def _lay(self, at: ir.Node, v: ir.Value) -> ir.Value:
        target = self.region.frame[v]
        dims = _dims(v) or []
        if len(dims) <= len(target) and all(d == 1 for d in target[: len(target) - len(dims)]) \
                and target[len(target) - len(dims):] == dims:  # fmt: skip
            return v  # broadcasts alike as it is
        array = _const(v)
        if array is not None:
            return self.constant(f"{v.name}_rank{len(target)}", array.reshape(target))
        return self.reshape(at, v, target, f"{v.name}_rank{len(target)}")

    def leave(self, old: ir.Value, new: ir.Value) -> None:
        """`new` takes `old`'s place (its readers, its name, a graph output)."""
        ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)
        name, old.name = old.name, None
        new.name = name

    def rewrite(self, node: ir.Node) -> None:
        region, out = self.region, node.outputs[0]
        rank = region.rank
        name = f"{out.name}_rank{rank}"
        op = node.op_type
        if op in ELEMENTWISE:
            ins = [self.operand(node, v) for v in node.inputs]
            attrs = {k: a.value for k, a in node.attributes.items()}
            new = ir.node(op, ins, attributes=attrs, name=f"{node.name or out.name}_rank{rank}")
            new.outputs[0].name, new.outputs[0].dtype = name, out.dtype
            new.outputs[0].shape = ir.Shape(region.frame[out])
            self.graph.insert_before(node, new)
            self.new[out] = new.outputs[0]
        elif op in ("Slice", "Gather"):
            x = self.operand(node, node.inputs[0])
            axes = region.axis[node]
            if op == "Slice":
                axes_v = self.constant(f"{name}_axes", np.array(axes, np.int64))
                ins = [x, node.inputs[1], node.inputs[2], axes_v, *node.inputs[4:]]
                self.new[out] = self.node(node, "Slice", ins, name, region.frame[out], out)
            else:
                dims = [d for a, d in enumerate(region.frame[node.inputs[0]]) if a != axes[0]]
                y = self.node(node, "Gather", [x, node.inputs[1]], name, dims, out,
                              axis=axes[0])  # fmt: skip
                self.leave(out, self.reshape(node, y, _dims(out) or [], f"{name}_back"))
        elif out in region.values:  # into the region (or within it: row-major either way)
            x = self.new.get(node.inputs[0], node.inputs[0])
            self.new[out] = self.reshape(node, x, region.frame[out], name)
        else:  # out of it
            x = self.operand(node, node.inputs[0])
            self.leave(out, self.reshape(node, x, _dims(out) or [], name))

    def finish(self) -> None:
        for old, new in self.new.items():
            if old.is_graph_output():
                self.leave(old, self.reshape(self.region.nodes[-1], new, _dims(old) or [],
                                             f"{old.name}_back"))  # fmt: skip
        self.graph.remove(self.region.nodes, safe=True)


class RankFoldPass(ir.passes.InPlacePass):
    """Each region above `max_rank` folded to `max_rank` by merging adjacent axes (module
    docstring); a region it cannot fold is logged with the node that stops it."""

    rule_name = RULE

    def __init__(self, log: RewriteLog, max_rank: int = 5) -> None:
        super().__init__()
        self.log, self.max_rank = log, max_rank

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        changed = 0
        for graph in (model.graph, *model.graph.subgraphs()):
            for region in _regions(graph, self.max_rank):
                why = region.why_not() or self._fold(region)
                if why:
                    self.log.keep(RULE, region.nodes[0].name, why)
                    continue
                writer = _Writer(graph, region)
                for node in region.nodes:
                    writer.rewrite(node)
                writer.finish()
                for node in region.nodes:
                    self.log.add(RULE, node.name)
                changed += 1
        return ir.passes.PassResult(model, bool(changed))

    def _fold(self, region: _Region) -> str | None:
        while region.rank > self.max_rank:
            pair = next((i for i in range(region.rank - 1) if region.mergeable(i)), None)
            if pair is None:
                return f"no two adjacent axes of the rank-{region.rank} tensors can merge"
            region.merge(pair)
        return None
