"""The state one dequantize run shares between its rules and passes, and its graph edits.

Rules and passes rewrite the same onnx_ir model in turn; they share the names taken (new
tensors are named after the quantized ones without the quantizer's suffix, "w_quantized"
-> "w"), which nodes the run created (the report counts only original patterns, and a
created node that cannot be rewritten is reported as the node it came from), and why a
node was refused.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx_ir as ir

from winml_recipes.quant.dequantize.report import PHRASES, DequantizeReport, Leftover, snake
from winml_recipes.quant.dequantize.values import (
    ALLOWED_ATTRS,
    FLOAT_DTYPES,
    QLINEAR_DTYPES,
    QUANT_DOMAINS,
    base_name,
    const,
    const_tensor,
    dtype_of,
    input_at,
    label,
    strip_quant_suffix,
)


class Refused(Exception):
    """A pattern that cannot be rewritten: the node stays and `reason` explains it."""

    def __init__(self, node: ir.Node, reason: str) -> None:
        super().__init__(reason)
        self.node = node
        self.reason = reason


class DequantizeState:
    """Bookkeeping and graph edits of one run over `model` (edited in place)."""

    def __init__(self, model: ir.Model) -> None:
        self.model = model
        self.counts: Counter[str] = Counter()
        self.internal: set[ir.Node] = set()  # nodes this run created
        self.origin: dict[ir.Node, tuple[str, str]] = {}  # created node -> original node
        self.fresh: set[ir.Value] = set()  # values this run created (renamable)
        self.retired: set[ir.Value] = set()  # values whose name was handed over
        self.reasons: dict[ir.Node, str] = {}  # refused node -> why
        self.owner: dict[ir.Graph, ir.Graph | ir.Function] = {}
        self.function_graphs: set[ir.Graph] = set()
        self.names: set[str] = set()
        self.remaining: list[Leftover] = []
        self.index()

    # -- bookkeeping

    def index(self) -> None:
        """(Re)read graph owners and taken names (after a step that named values itself)."""
        self.owner = {}
        for graph in self.graph_likes():
            key = graph.graph if isinstance(graph, ir.Function) else graph
            self.owner[key] = graph
            if isinstance(graph, ir.Function):
                self.function_graphs.add(graph.graph)
            for name in ir.convenience.create_value_mapping(graph, include_subgraphs=False):
                self.names.add(name)

    def graph_likes(self) -> list[ir.Graph | ir.Function]:
        out: list[ir.Graph | ir.Function] = [self.model.graph, *self.model.graph.subgraphs()]
        for fn in self.model.functions.values():
            out.append(fn)
            out.extend(fn.graph.subgraphs())
        return out

    def nodes(self) -> list[ir.Node]:
        return [node for graph in self.graph_likes() for node in list(graph)]

    def fresh_name(self, base: str) -> str:
        base = base or "dq"
        name, i = base, 0
        while name in self.names:
            i += 1
            name = f"{base}_{i}"
        self.names.add(name)
        return name

    def float_name(self, quantized_name: str | None, suffix: str = "") -> str:
        return self.fresh_name(strip_quant_suffix(quantized_name) + suffix)

    def origin_of(self, node: ir.Node) -> tuple[str, str]:
        return self.origin.get(node, (label(node), node.op_type))

    def adopt(self, nodes: list[ir.Node], anchor: ir.Node) -> None:
        """Mark `nodes` as created by this run on behalf of `anchor`."""
        origin = self.origin_of(anchor)
        for node in nodes:
            self.internal.add(node)
            self.origin[node] = origin
            self.fresh.update(node.outputs)

    def count_replaced(self, op_type: str) -> None:
        self.counts[f"{snake(op_type)}_replaced"] += 1

    def refuse(self, refusal: Refused) -> None:
        self.reasons.setdefault(refusal.node, refusal.reason)

    def report(self) -> DequantizeReport:
        counts = {k: self.counts[k] for k in PHRASES if self.counts.get(k)}
        return DequantizeReport(counts=counts, changed=bool(counts), remaining=list(self.remaining))

    # -- graph edits (passes; rules build through onnxscript's tape instead)

    def insert(
        self,
        anchor: ir.Node,
        op_type: str,
        inputs,
        attributes=None,
        *,
        name: str,
        out_names: list[str] | None = None,
        num_outputs: int = 1,
    ) -> ir.Node:
        """A new node just before `anchor`, its outputs named (fresh names by default)."""
        node = ir.node(
            op_type, inputs, attributes=attributes or {}, num_outputs=num_outputs, name=name
        )
        for i, out in enumerate(node.outputs):
            out.name = (out_names[i] if out_names and i < len(out_names) else None) or (
                self.fresh_name(f"{name}_out{i}" if num_outputs > 1 else f"{name}_out")
            )
        self.owner[anchor.graph].insert_before(anchor, node)
        self.adopt([node], anchor)
        return node

    def dq(self, anchor, data, scale, zp, *, axis: int | None = None, tag: str) -> ir.Value:
        """DequantizeLinear(data) before `anchor`, named after the data."""
        attrs = {} if axis is None else {"axis": axis}
        inputs = [data, scale] + ([zp] if zp is not None else [])
        node = self.insert(
            anchor,
            "DequantizeLinear",
            inputs,
            attrs,
            name=f"{base_name(anchor)}/dq_{tag}",
            out_names=[self.float_name(data.name, "_dq")],
        )
        return node.outputs[0]

    def float_op(
        self, anchor, op_type, inputs, attrs=None, *, out: ir.Value, name: str | None = None
    ) -> ir.Value:
        """The float op replacing `anchor`, its output named after `out` without the suffix."""
        node = self.insert(
            anchor,
            op_type,
            inputs,
            attrs,
            name=name or strip_quant_suffix(base_name(anchor)),
            out_names=[self.float_name(out.name)],
        )
        return node.outputs[0]

    def constant_name(self, source: str | ir.Value, reader: ir.Node) -> str:
        """A name for a float constant made from `source`, without the quantizer's suffix.

        A `source` read only by `reader` (about to go) gives up its own name.
        """
        if isinstance(source, ir.Value):
            base = strip_quant_suffix(source.name)
            if base == source.name:
                self.free_name(source, reader)
        else:
            base = strip_quant_suffix(source)
        return self.fresh_name(base)

    def constant(self, anchor: ir.Node, array: np.ndarray, source: str | ir.Value) -> ir.Value:
        """A new constant next to `anchor`: an initializer, or a Constant node in a function."""
        name = self.constant_name(source, anchor)
        tensor = ir.tensor(array, name=name)
        graph = anchor.graph
        if graph in self.function_graphs:
            node = ir.node("Constant", [], attributes={"value": tensor}, name=f"{name}_const")
            node.outputs[0].name = name
            self.owner[graph].insert_before(anchor, node)
            value = node.outputs[0]
        else:
            value = ir.Value(name=name, const_value=tensor)
            graph.register_initializer(value)
        value.type = ir.TensorType(tensor.dtype)
        value.shape = ir.Shape(array.shape)
        self.fresh.add(value)
        return value

    def free_name(self, value: ir.Value, user: ir.Node) -> None:
        """Rename `value` out of the way when `user` is its only reader."""
        if not value.name or value.is_graph_input() or value.is_graph_output():
            return
        if any(usage.node is not user for usage in value.uses()):
            return
        old = value.name
        new = self.fresh_name(f"{old}__quantized")
        self.retired.add(value)
        if value.is_initializer():
            ir.convenience.rename_values(value, new)
        else:
            value.name = new
        self.names.discard(old)

    def replace(self, old: ir.Value, new: ir.Value) -> None:
        """Point every use of `old` (graph outputs too, keeping their names) at `new`."""
        if new.type is None and old.type is not None and old.dtype in FLOAT_DTYPES:
            new.type = old.type
        if new.shape is None and old.shape is not None:
            new.shape = old.shape
        graph = old.graph
        name = old.name
        if not old.is_graph_output():
            takes_name = new in self.fresh and not new.is_initializer()
            if takes_name and name and old not in self.fresh and old not in self.retired:
                self.retire(old)
                new.name = name
            old.replace_all_uses_with(new)
            return
        renamable = (
            new.producer() is not None
            and new.graph is graph
            and not new.is_graph_output()
            and not new.is_graph_input()
            and not new.is_initializer()
        )
        if not renamable:
            anchor = old.producer()
            assert anchor is not None
            ident = self.insert(anchor, "Identity", [new], name=f"{name}_identity")
            new = ident.outputs[0]
            new.type, new.shape = old.type, old.shape
        self.retire(old)
        new.name = name
        old.replace_all_uses_with(new, replace_graph_outputs=True)

    def retire(self, value: ir.Value) -> None:
        """Move `value` (about to be dropped) off its name so a replacement can take it."""
        value.name = self.fresh_name(f"{value.name}__replaced")
        self.retired.add(value)

    def remove(self, node: ir.Node) -> None:
        self.owner[node.graph].remove(node, safe=True)

    # -- checks shared by rules and passes (raise Refused)

    def param(self, node: ir.Node, index: int, what: str, *, dynamic_ok: bool = False):
        """The scale/zero-point input `index`: must be a constant (or DQL output if allowed)."""
        value = input_at(node, index)
        if value is None or const_tensor(value) is not None:
            return value
        producer = value.producer()
        if (
            dynamic_ok
            and producer is not None
            and producer.op_type == "DynamicQuantizeLinear"
            and producer.domain in QUANT_DOMAINS
        ):
            return value
        raise Refused(
            node, f"{what} '{value.name}' is not a constant (fold it to an initializer first)"
        )

    @staticmethod
    def const_input(node: ir.Node, index: int, what: str) -> np.ndarray:
        arr = const(input_at(node, index))
        if arr is None:
            value = input_at(node, index)
            raise Refused(node, f"{what} '{value.name if value else '?'}' is not a constant")
        return arr

    @staticmethod
    def check_attrs(node: ir.Node) -> None:
        allowed = ALLOWED_ATTRS.get(node.op_type, frozenset())
        for name, attr in node.attributes.items():
            if name not in allowed:
                raise Refused(node, f"attribute '{name}' is not supported")
            if name == "channels_last" and int(attr.value) != 0:
                raise Refused(node, "attribute channels_last=1 is not supported")

    @staticmethod
    def check_dtype(node: ir.Node, value: ir.Value | None, allowed) -> None:
        dtype = dtype_of(value)
        if dtype is not None and dtype not in allowed:
            raise Refused(node, f"dtype {dtype.name.lower()} is not supported")

    def qlinear_params(self, node: ir.Node, slots: list[tuple[int, int, int]]) -> None:
        """Constant scales/zero points and int8/uint8 dtypes of a QLinear op."""
        self.check_attrs(node)
        for data, scale, zp in slots:
            self.param(node, scale, "scale")
            self.param(node, zp, "zero point")
            self.check_dtype(node, input_at(node, zp), QLINEAR_DTYPES)
            if data >= 0:
                self.check_dtype(node, input_at(node, data), QLINEAR_DTYPES)

    @staticmethod
    def scalar_params(node: ir.Node, indices: list[int]) -> None:
        for i in indices:
            arr = const(input_at(node, i))
            if arr is not None and arr.size != 1:
                raise Refused(node, "per-axis scales or zero points are not supported")
