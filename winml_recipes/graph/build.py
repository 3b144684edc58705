"""Emitting replacement nodes into an onnx_ir graph: unique names, constants, swap-in."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx_ir as ir


class Emitter:
    """Nodes and initializers that replace one node, named after it (`<node>/<what>_<i>`).

    Initializers are registered in the graph at once; nodes are kept until `replace`
    inserts them where the old node was (an ir.Tape bound to the graph would append them
    at its end instead).
    """

    def __init__(self, graph: ir.Graph, node: ir.Node) -> None:
        self.graph = graph
        self.node = node
        self.prefix = node.name or node.op_type
        self.tape = ir.tape.Tape()
        self._count = 0

    def _name(self, what: str) -> str:
        self._count += 1
        return f"{self.prefix}/{what}_{self._count}"

    def op(self, op_type: str, inputs: Sequence[ir.Value | None], **attributes: Any) -> ir.Value:
        name = self._name(op_type)
        value = self.tape.op(op_type, list(inputs), attributes=attributes or None, name=name)
        value.name = f"{name}_out"
        return value

    def const(self, array: np.ndarray, what: str) -> ir.Value:
        name = self._name(what)
        while name in self.graph.initializers:
            name = self._name(what)
        value = ir.Value(
            name=name,
            shape=ir.Shape(array.shape),
            type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
            const_value=ir.tensor(array, name=name),
        )
        self.graph.register_initializer(value)
        return value

    def replace(self, old: Sequence[ir.Value | None], new: Sequence[ir.Value | None]) -> None:
        """Swap the node for the emitted nodes; `new[i]` takes over `old[i]` (None: unused)."""
        pairs = [(o, n) for o, n in zip(old, new, strict=True) if o is not None and n is not None]
        ir.convenience.replace_nodes_and_values(
            self.graph,
            self.node,
            [self.node],
            list(self.tape.nodes),
            [o for o, _ in pairs],
            [n for _, n in pairs],
        )


def constant(value: ir.Value | None) -> np.ndarray | None:
    """The value's constant array (initializer or folded), None when it is not constant."""
    if value is None or value.const_value is None:
        return None
    return value.const_value.numpy()


def static_shape(value: ir.Value | None) -> tuple[int, ...] | None:
    """The value's shape when every dim is a known int."""
    if value is None or value.shape is None:
        return None
    dims = tuple(value.shape.dims)
    if not all(isinstance(d, int) and d >= 0 for d in dims):
        return None
    return dims  # type: ignore[return-value]


def used(value: ir.Value | None) -> bool:
    """Whether an output is read by a node or is a graph output."""
    if value is None or not value.name:
        return False
    return bool(value.uses()) or value.is_graph_output()


def opset(model: ir.Model) -> int:
    return int(model.opset_imports.get("", 0))
