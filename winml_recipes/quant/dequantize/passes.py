"""The dequantize steps that are not one fixed-arity pattern, as onnx_ir passes.

- IntegerFusions: DynamicQuantizeLinear -> ConvInteger/MatMulInteger -> Cast -> a chain of
  Muls by the scales [-> Add bias], as `quantize_dynamic` writes it; the chain's length
  and the shape of the scale product vary.
- FoldWeightDQ: DequantizeLinear of a constant -> a float constant `(W - zp) * scale`,
  one constant per distinct weight, named after the weight ("w_quantized" -> "w").
- CollapseQDQ: QuantizeLinear -> DequantizeLinear (and DynamicQuantizeLinear -> DQ) -> a
  direct edge, for every DQ of the Q at once (a Shape reading the Q moves to the float
  tensor); a DQ behind an integer data-movement op (Transpose, Reshape, MaxPool, ...)
  moves above it first so the pair meets. A pair whose range starts exactly at 0 (zero
  point at the dtype minimum) clamps negatives: onnxruntime removed a Relu there and let
  the range do its work, so the collapse puts a Relu back unless the producer is already
  non-negative. The upper end of the range is not restored (it cannot be told apart
  from the calibration range).
- Cleanup, UniqueNodeNames, FindRemaining: dead code, duplicate names of created nodes,
  and the quantized ops left, each with the reason a rule or pass gave.

Why these are not onnxscript rules: the rewriter gives the replaced value's name to its
replacement, so collapsing Q -> DQ onto `x` would rename `x` (a graph input, or a tensor
other consumers know by name), and a folded weight would be named after the DQ output;
a Q read by several DQs and a Shape, the Mul chains and the hoisting are not fixed-arity.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass, RemoveUnusedOpsetsPass
from onnxscript.rewriter import RewritePass, pattern

from winml_recipes.quant.dequantize.report import Leftover
from winml_recipes.quant.dequantize.state import DequantizeState, Refused
from winml_recipes.quant.dequantize.values import (
    DT,
    PASSTHROUGH,
    QLINEAR_DTYPES,
    QMIN,
    QUANT_DOMAINS,
    SHAPE_ONLY_OPS,
    attr_int,
    base_name,
    const,
    const_eval,
    const_tensor,
    dequantize_array,
    dtype_of,
    effective_zp,
    input_at,
    is_quant_op,
    is_scalar_param,
    label,
    non_negative,
    same_param,
    strip_quant_suffix,
)


class _StatePass(ir.passes.InPlacePass):
    """A pass over the model of one run, sharing its DequantizeState."""

    def __init__(self, state: DequantizeState) -> None:
        super().__init__()
        self.state = state


class ExpandFusedOps(RewritePass):
    """The fused-op rules (rules.py) through onnxscript's RewritePass."""

    def __init__(self, state: DequantizeState, rules: list[pattern.RewriteRule]) -> None:
        super().__init__(rules)
        self.state = state

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        names = {node: node.name for graph in self.state.graph_likes() for node in graph}
        result = super().call(model)
        if result.modified:
            # onnxscript names every unnamed node and dedups names (NameFixPass) and gives
            # new nodes the rule's name and the matched node's metadata: keep the nodes not
            # rewritten as they were and new nodes bare (as the passes make them).
            for node, name in names.items():
                node.name = name
            for graph in self.state.graph_likes():
                for node in graph:
                    if node in self.state.internal:
                        node.metadata_props.clear()
            self.state.index()
        return result


class IntegerFusions(_StatePass):
    """ConvInteger / MatMulInteger fusions of `quantize_dynamic` -> Conv / MatMul."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for node in self.state.nodes():
            is_integer = node.op_type in ("ConvInteger", "MatMulInteger")
            if is_integer and node.domain in QUANT_DOMAINS and node.graph is not None:
                try:
                    self._integer_fusion(node)
                except Refused as refusal:
                    self.state.refuse(refusal)
                    continue
                modified = True
        return ir.passes.PassResult(model, modified)

    def _integer_fusion(self, node: ir.Node) -> None:
        """DQL -> ConvInteger/MatMulInteger -> Cast -> Mul(scales) [-> Add bias] to float.

        Each integer input is either dynamic (a DynamicQuantizeLinear output with its zero
        point) or a constant. The Mul chain after the Cast must multiply by the dynamic
        scales and by constants; the constants (the weight scale) fold into the constant
        input. Anything else is refused, with the reason.
        """
        self.state.check_attrs(node)
        sides = [self._integer_side(node, 0, 2), self._integer_side(node, 1, 3)]
        if None in sides:
            raise Refused(node, "an input is neither a constant nor a DynamicQuantizeLinear output")
        chain = self._scale_chain(node, sides)
        if chain is None:
            raise Refused(node, "its output is not Cast(to float) -> Mul by the input scales")
        last_mul, factor, dtype = chain
        is_conv = node.op_type == "ConvInteger"
        const_sides = [i for i, side in enumerate(sides) if side[0] == "const"]
        weight_side = const_sides[-1] if const_sides else None
        arrays: dict[int, np.ndarray] = {}
        for i in const_sides:
            _, value, _, zp = sides[i]
            q = const(value).astype(np.int64)
            zarr = const(zp)
            if zarr is not None:
                q = q - self._broadcast_zp(zarr, q, axis=0 if (is_conv or i == 0) else -1)
            mult = np.float32(1.0)
            if factor is not None and i == weight_side:
                mult = self._weight_factor(factor, q, is_conv=is_conv, is_weight=i == 1)
                if mult is None:
                    raise Refused(node, "the constant scales are not per output channel")
            arrays[i] = (q.astype(np.float32) * mult).astype(dtype)
        operands: list[ir.Value] = []
        for i, (kind, value, scale, zp) in enumerate(sides):
            if kind == "dynamic":
                operands.append(self.state.dq(node, value, scale, zp, tag="ab"[i]))
            else:
                operands.append(self.state.constant(node, arrays[i], value))
        out = last_mul.outputs[0]
        attrs = dict(node.attributes) if is_conv else {}
        y = self.state.float_op(
            last_mul,
            "Conv" if is_conv else "MatMul",
            operands,
            attrs,
            out=out,
            name=strip_quant_suffix(base_name(node)),
        )
        self.state.origin[y.producer()] = (label(node), node.op_type)
        if factor is not None and weight_side is None:  # both inputs dynamic
            scale_value = self.state.constant(last_mul, factor.astype(dtype), "dq_scale")
            mul = self.state.insert(
                last_mul,
                "Mul",
                [y, scale_value],
                name=f"{base_name(node)}/scale",
                out_names=[self.state.float_name(out.name, "_scaled")],
            )
            y = mul.outputs[0]
        elif is_conv:
            out = self._fold_conv_bias(y, out, dtype)
        self.state.replace(out, y)
        self.state.counts["conv_integer_replaced" if is_conv else "matmul_integer_replaced"] += 1

    def _integer_side(self, node: ir.Node, data_index: int, zp_index: int):
        """(kind, data, scale, zp) for one input of an integer op, or None if unrecognised."""
        data, zp = input_at(node, data_index), input_at(node, zp_index)
        if data is None:
            return None
        if const_tensor(data) is not None:
            if zp is not None and const_tensor(zp) is None:
                raise Refused(node, f"zero point '{zp.name}' is not a constant")
            self.state.check_dtype(node, data, QLINEAR_DTYPES)
            return ("const", data, None, zp)
        producer = data.producer()
        if (
            producer is not None
            and producer.op_type == "DynamicQuantizeLinear"
            and producer.domain in QUANT_DOMAINS
            and data is producer.outputs[0]
            and zp is producer.outputs[2]
        ):
            return ("dynamic", data, producer.outputs[1], zp)
        return None

    def _scale_chain(self, node: ir.Node, sides):
        """The Cast -> Mul... after an integer op: (last Mul, constant product, float dtype)."""
        out = node.outputs[0]
        uses = out.uses()
        if len(uses) != 1 or out.is_graph_output():
            return None
        cast = uses[0].node
        if cast.op_type != "Cast" or cast.domain not in ("", "ai.onnx"):
            return None
        to = DT(attr_int(cast, "to", 0))
        if to != DT.FLOAT:  # DynamicQuantizeLinear reads float32: the float op stays float32
            return None
        need_dynamic = [s[2] for s in sides if s[0] == "dynamic"]  # may hold one scale twice
        need_const = any(s[0] == "const" for s in sides)
        consts: list[np.ndarray] = []
        cur, last = cast.outputs[0], None
        while need_dynamic or (need_const and not consts):
            uses = cur.uses()
            if len(uses) != 1 or cur.is_graph_output():
                return None
            mul, idx = uses[0].node, uses[0].idx
            if mul.op_type != "Mul" or mul.domain not in ("", "ai.onnx") or len(mul.inputs) != 2:
                return None
            leaves = self._factor_leaves(mul.inputs[1 - idx])
            if leaves is None:
                return None
            for leaf in leaves:
                if leaf in need_dynamic:
                    need_dynamic.remove(leaf)
                    continue
                arr = const(leaf)
                if arr is None:
                    return None
                consts.append(arr.astype(np.float32))
            cur, last = mul.outputs[0], mul
        if last is None:
            return None
        product = None
        for arr in consts:
            product = arr if product is None else product * arr
        return last, product, to.numpy()

    def _factor_leaves(self, value: ir.Value | None, depth: int = 0) -> list[ir.Value] | None:
        """Leaves of a Mul tree of scales (constants and DynamicQuantizeLinear scales)."""
        if value is None or depth > 4:
            return None
        if const(value) is not None:
            return [value]
        producer = value.producer()
        if producer is None:
            return None
        if producer.op_type == "DynamicQuantizeLinear" and value is producer.outputs[1]:
            return [value]
        if producer.op_type == "Mul" and producer.domain in ("", "ai.onnx"):
            left = self._factor_leaves(producer.inputs[0], depth + 1)
            right = self._factor_leaves(producer.inputs[1], depth + 1)
            if left is None or right is None:
                return None
            return left + right
        return None

    @staticmethod
    def _broadcast_zp(zp: np.ndarray, q: np.ndarray, axis: int) -> np.ndarray:
        zp = zp.astype(np.int64)
        if zp.size == 1:
            return zp.reshape(())
        shape = [1] * q.ndim
        shape[axis % q.ndim] = zp.size
        return zp.reshape(shape)

    @staticmethod
    def _weight_factor(
        factor: np.ndarray, q: np.ndarray, *, is_conv: bool, is_weight: bool
    ) -> np.ndarray | None:
        """The scale product (which multiplies the op output) reshaped onto the input q."""
        if factor.size == 1:
            return factor.reshape(())
        if not is_weight:
            return None
        if is_conv:
            # output [N, M, ...]: the factor must be per output channel M (dim 0 of W)
            padded = (1,) * (q.ndim - factor.ndim) + factor.shape
            if len(padded) != q.ndim or factor.size != q.shape[0] or padded[1] != q.shape[0]:
                return None
            return factor.reshape((q.shape[0],) + (1,) * (q.ndim - 1))
        # MatMul output [..., N]: the factor must vary along N only
        if factor.shape[-1] != q.shape[-1] or factor.size != q.shape[-1]:
            return None
        return factor.reshape(-1)

    def _fold_conv_bias(self, y: ir.Value, out: ir.Value, dtype) -> ir.Value:
        """Conv output + per-channel constant (the trailing bias Add) -> Conv bias input."""
        uses = out.uses()
        if len(uses) != 1 or out.is_graph_output():
            return out
        add, idx = uses[0].node, uses[0].idx
        if add.op_type != "Add" or add.domain not in ("", "ai.onnx") or len(add.inputs) != 2:
            return out
        bias = const_eval(add.inputs[1 - idx])
        conv = y.producer()
        weight = const(conv.inputs[1])
        if bias is None or weight is None or len(conv.inputs) > 2:
            return out
        channels, rank = weight.shape[0], weight.ndim
        padded = (1,) * (rank - bias.ndim) + bias.shape
        if len(padded) != rank or padded[1] != channels or bias.size != channels:
            return out
        value = self._bias_value(conv, add.inputs[1 - idx], bias.reshape(-1).astype(dtype))
        conv.resize_inputs(3)
        conv.replace_input_with(2, value)
        self.state.counts["bias_add_folded"] += 1
        return add.outputs[0]

    def _bias_value(self, conv: ir.Node, operand: ir.Value, bias: np.ndarray) -> ir.Value:
        """The 1-D bias: the original tensor when the Add used Reshape(b) of a 1-D `b`."""
        source = operand.producer()
        if source is not None and source.op_type == "Reshape":
            original = source.inputs[0]
            arr = const(original)
            if arr is not None and arr.shape == bias.shape and arr.dtype == bias.dtype:
                return original
            return self.state.constant(conv, bias, original)
        return self.state.constant(conv, bias, operand)

    # weight-only ops


class FoldWeightDQ(_StatePass):
    """DequantizeLinear of a constant -> the float constant (shared by equal DQs)."""

    def __init__(self, state: DequantizeState) -> None:
        super().__init__(state)
        self.folded: dict[tuple, ir.Value] = {}

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for node in self.state.nodes():
            is_dq = node.op_type == "DequantizeLinear" and node.domain in QUANT_DOMAINS
            if is_dq and const_tensor(node.inputs[0]) is not None:
                try:
                    self._fold_dq(node)
                except Refused as refusal:
                    self.state.refuse(refusal)
                    continue
                modified = True
        return ir.passes.PassResult(model, modified)

    def _fold_dq(self, node: ir.Node) -> None:
        data_value = node.inputs[0]
        dtype = dtype_of(data_value)
        if dtype not in QMIN:
            raise Refused(node, f"dtype {dtype.name.lower()} is not supported")
        scale_value = self.state.param(node, 1, "scale")
        zp_value = self.state.param(node, 2, "zero point")
        axis = attr_int(node, "axis", 1)
        block = attr_int(node, "block_size", 0)
        out_dtype_attr = attr_int(node, "output_dtype", 0)
        key = (data_value, scale_value, zp_value, axis, block, out_dtype_attr, node.graph)
        value = self.folded.get(key)
        if value is None:
            scale = const(scale_value)
            out_dtype = DT(out_dtype_attr).numpy() if out_dtype_attr else scale.dtype
            arr = dequantize_array(
                const(data_value),
                scale,
                const(zp_value),
                axis=axis,
                block_size=block,
                out_dtype=out_dtype,
            )
            out = node.outputs[0]
            if out.name and not out.is_graph_output():  # its name is free for the constant
                free = out.name
                self.state.retire(out)
                self.state.names.discard(free)
            value = self.state.constant(node, arr, data_value)
            self.folded[key] = value
        self.state.replace(node.outputs[0], value)
        self.state.remove(node)
        if node not in self.state.internal:
            self.state.counts["weight_dq_folded"] += 1


class CollapseQDQ(_StatePass):
    """Q -> DQ pairs (and DQL -> DQ) -> direct edges, hoisting DQs above data movement."""

    def __init__(self, state: DequantizeState) -> None:
        super().__init__(state)
        self.relu_of: dict[ir.Value, ir.Value] = {}

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        changed, modified = True, False
        while changed:
            changed = False
            for node in self.state.nodes():
                if node.graph is None:
                    continue  # removed earlier in this sweep
                if node.op_type == "DequantizeLinear" and node.domain in QUANT_DOMAINS:
                    try:
                        changed |= self._collapse_dq(node)
                    except Refused as refusal:
                        self.state.refuse(refusal)
            modified |= changed
        return ir.passes.PassResult(model, modified)

    def _collapse_dq(self, dq: ir.Node) -> bool:
        source = dq.inputs[0]
        producer = source.producer() if source is not None else None
        if producer is None:
            return False
        if producer.domain in QUANT_DOMAINS and producer.op_type == "QuantizeLinear":
            return self._collapse_pair(producer, dq)
        if producer.domain in QUANT_DOMAINS and producer.op_type == "DynamicQuantizeLinear":
            if (
                source is producer.outputs[0]
                and input_at(dq, 1) is producer.outputs[1]
                and input_at(dq, 2) is producer.outputs[2]
            ):
                self.state.replace(dq.outputs[0], producer.inputs[0])
                self.state.remove(dq)
                return True
            return False
        if producer.domain in ("", "ai.onnx") and producer.op_type in PASSTHROUGH:
            return self._hoist(producer, dq)
        return False

    def _qdq_dtype(self, node: ir.Node, zp: ir.Value | None) -> ir.DataType:
        if zp is not None:
            return dtype_of(zp)
        if node.op_type == "QuantizeLinear":
            out = attr_int(node, "output_dtype", 0)
            return DT(out) if out else DT.UINT8
        return dtype_of(node.inputs[0]) or DT.UINT8

    def _collapse_pair(self, q: ir.Node, dq: ir.Node) -> bool:
        for node in (q, dq):
            self.state.param(node, 1, "scale", dynamic_ok=True)
            self.state.param(node, 2, "zero point", dynamic_ok=True)
        qtype = self._qdq_dtype(q, input_at(q, 2))
        if qtype not in QMIN or qtype == DT.INT32:
            raise Refused(q, f"dtype {qtype.name.lower()} is not supported")
        same = (
            same_param(input_at(q, 1), input_at(dq, 1), zero_default=False)
            and same_param(input_at(q, 2), input_at(dq, 2), zero_default=True)
            and attr_int(q, "block_size", 0) == attr_int(dq, "block_size", 0)
        )
        scale = const(input_at(q, 1))
        if same and scale is not None and scale.size > 1:
            same = attr_int(q, "axis", 1) == attr_int(dq, "axis", 1)
        if not same:
            self.state.reasons.setdefault(
                dq, f"its scale or zero point differ from those of {label(q)}: a requantization"
            )
            return False
        x = q.inputs[0]
        zp = effective_zp(input_at(q, 2))
        clamps = (
            zp is not None
            and scale is not None
            and bool(np.all(zp.astype(np.int64) == QMIN[qtype]))
            and bool(np.all(scale > 0))
        )
        new = self._clamped(x, q) if clamps else x
        out_dtype = attr_int(dq, "output_dtype", 0)
        if out_dtype and x.dtype is not None and DT(out_dtype) != x.dtype:
            name = self.state.float_name(dq.outputs[0].name, "_cast")
            new = self.state.insert(dq, "Cast", [new], {"to": out_dtype}, name=name).outputs[0]
        self.state.replace(dq.outputs[0], new)
        self.state.remove(dq)
        if q not in self.state.internal and dq not in self.state.internal:
            self.state.counts["qdq_pairs_collapsed"] += 1
        for usage in list(q.outputs[0].uses()):
            if usage.node.op_type in SHAPE_ONLY_OPS:
                usage.node.replace_input_with(usage.idx, x)
        return True

    def _clamped(self, x: ir.Value, q: ir.Node) -> ir.Value:
        """`x`, behind a Relu when the quantized range [0, max] clamped negatives away."""
        if const_tensor(x) is not None or non_negative(x):
            return x
        if x in self.relu_of:
            return self.relu_of[x]
        name = self.state.fresh_name(f"{x.name}_relu")
        relu = self.state.insert(q, "Relu", [x], name=name, out_names=[name])
        out = relu.outputs[0]
        out.type, out.shape = x.type, x.shape
        self.relu_of[x] = out
        self.state.counts["relu_restored"] += 1
        return out

    def _hoist(self, op: ir.Node, dq: ir.Node) -> bool:
        """DQ(Transpose(q)) -> Transpose(DQ(q)) for per-tensor DQs (all users must agree)."""
        for i in (1, 2):
            value = input_at(dq, i)
            if value is not None and not is_scalar_param(value):
                return False
        data_in, data_out = PASSTHROUGH[op.op_type]
        in_idx = range(len(op.inputs)) if data_in is None else data_in
        out_idx = range(len(op.outputs)) if data_out is None else data_out
        consumers: list[tuple[int, ir.Node]] = []
        for j in out_idx:
            value = op.outputs[j]
            if value.is_graph_output():
                return False
            for usage in value.uses():
                user = usage.node
                if not (
                    user.op_type == "DequantizeLinear"
                    and user.domain in QUANT_DOMAINS
                    and usage.idx == 0
                    and same_param(input_at(user, 1), input_at(dq, 1), zero_default=False)
                    and same_param(input_at(user, 2), input_at(dq, 2), zero_default=True)
                ):
                    return False
                consumers.append((j, user))
        inputs = list(op.inputs)
        for i in in_idx:
            if inputs[i] is not None:
                inputs[i] = self.state.dq(
                    op, inputs[i], dq.inputs[1], input_at(dq, 2), tag=f"in{i}"
                )
        clone = self.state.insert(
            op,
            op.op_type,
            inputs,
            dict(op.attributes),
            name=op.name or base_name(op),
            out_names=[self.state.float_name(o.name) for o in op.outputs],
            num_outputs=len(op.outputs),
        )
        self.state.origin.pop(clone, None)
        for j, user in consumers:
            self.state.replace(user.outputs[0], clone.outputs[j])
            self.state.remove(user)
        for j, out in enumerate(op.outputs):
            if j not in out_idx and out.uses():
                self.state.replace(out, clone.outputs[j])
        if not any(o.uses() or o.is_graph_output() for o in op.outputs):
            self.state.remove(op)
        self.state.counts["passthrough_converted"] += 1
        return True


class Cleanup(_StatePass):
    """Dead nodes, initializers no one reads (subgraphs too) and unused opsets."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = RemoveUnusedNodesPass()(model).modified
        for graph in model.graph.subgraphs():
            for name, value in list(graph.initializers.items()):
                if not value.uses() and not value.is_graph_output():
                    del graph.initializers[name]
                    modified = True
        modified |= RemoveUnusedOpsetsPass()(model).modified
        return ir.passes.PassResult(model, modified)


class UniqueNodeNames(_StatePass):
    """onnxruntime refuses duplicate node names: suffix the ones this run created."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for graph in self.state.graph_likes():
            taken = {n.name for n in graph if n.name and n not in self.state.internal}
            for node in graph:
                if node in self.state.internal and node.name:
                    base, i = node.name, 0
                    while node.name in taken:
                        i += 1
                        node.name = f"{base}_{i}"
                        modified = True
                    taken.add(node.name)
        return ir.passes.PassResult(model, modified)


class FindRemaining(_StatePass):
    """The quantized ops left (model I/O aside), each with why it was not rewritten.

    A reason comes from the pass that refused the node or, for a fused op, from the
    `MatchResult` of the rule that matched it but failed its check (onnxscript's
    MatchingTracer records it; `RewriteRule.match` alone only returns None then).
    """

    def __init__(self, state: DequantizeState, rules: list[pattern.RewriteRule]) -> None:
        super().__init__(state)
        self.rules = rules

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        state, main = self.state, model.graph
        state.remaining = []
        seen: set[tuple[str, str]] = set()
        for node in state.nodes():
            if not is_quant_op(node.op_type, node.domain):
                continue
            if node.graph is main and self._is_interface(node):
                continue
            origin = state.origin_of(node)
            if origin not in seen:
                seen.add(origin)
                state.remaining.append(Leftover(*origin, self._reason(model, node)))
        return ir.passes.PassResult(model, False)

    def _reason(self, model: ir.Model, node: ir.Node) -> str:
        if node in self.state.reasons:
            return self.state.reasons[node]
        container = self.state.owner[node.graph]
        for rule in self.rules:
            tracer = pattern.MatchingTracer()
            rule.match(model, container, node, tracer=tracer)
            for info in tracer.best_matches_map.get(rule, []):
                if info.status == pattern.MatchStatus.CONDITION_FAILED and info.root_node is node:
                    return info.match_result.reason
        return ""

    @staticmethod
    def _is_interface(node: ir.Node) -> bool:
        """A lone DQ of a graph input or a Q feeding only graph outputs: the model's I/O."""
        if node.op_type == "DequantizeLinear":
            return node.inputs[0] is not None and node.inputs[0].is_graph_input()
        if node.op_type == "QuantizeLinear":
            out = node.outputs[0]
            return out.is_graph_output() and not out.uses()
        return False
