"""The float rewrites QNN HTP needs, as onnxscript rewrite rules (exact in float).

Each rule matches one node (its op type), `check` refuses with a `MatchResult` reason what
it cannot rewrite exactly, and the replacement names its nodes, values and constants after
the matched node as the protobuf rewrites of earlier versions did, so a rewritten model is
the same model. Why HTP needs each rewrite is said on the rule (measured, onnxruntime-qnn
2.7, QNN SDK 2.51).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from winml_recipes.graph.log import RewriteLog

MatchResult = pattern.MatchResult

_ELEMENTWISE = {"Add": 0.0, "Sub": 0.0, "Mul": 1.0, "Div": 1.0}


def const(value: ir.Value | None) -> np.ndarray | None:
    """The value of an initializer or a Constant node's output, else None."""
    if value is None:
        return None
    tensor = ir.convenience.get_const_tensor(value)
    return None if tensor is None else tensor.numpy()


def static_dims(value: ir.Value | None) -> list[int | None] | None:
    """The value's shape, None for a dim that is not static (None: no shape known)."""
    if value is None or value.shape is None:
        return None
    return [d if isinstance(d, int) else None for d in value.shape]


def _attr_int(node: ir.Node, name: str, default: int) -> int:
    return node.attributes.get_int(name, default)


def _reduction_none(node: ir.Node) -> bool:
    return node.attributes.get_string("reduction", "none") in ("", "none")


class HtpRule(pattern.RewriteRuleClassBase):
    """One op type; `validate` returns a refusal reason or the facts `replace` needs."""

    op_type: ClassVar[str]
    # Refusals worth listing in the prepare record (not every Add that is no `x + 0`).
    log_refusals: ClassVar[bool] = True
    rule_name: ClassVar[str]

    def __init__(self, log: RewriteLog, op_type: str | None = None) -> None:
        self.op_type = op_type or type(self).op_type
        super().__init__(name=f"{self.rule_name}[{self.op_type}]")
        self.log = log
        self._facts: Any = None

    def pattern(self, op, *inputs):
        return getattr(op, self.op_type)(_allow_other_inputs=True, _outputs=["out"])

    def check(self, context, out: ir.Value, **_: Any) -> MatchResult:
        node = out.producer()
        facts = self.validate(node)
        if isinstance(facts, str):
            if self.log_refusals:
                self.log.keep(self.rule_name, node.name, facts)
            return MatchResult().fail(facts, node)
        self._facts = facts  # onnxscript calls rewrite() right after a check that passed
        return MatchResult()

    def rewrite(self, op, out: ir.Value, **_: Any) -> ir.Value:
        node = out.producer()
        self.log.add(self.rule_name, node.name)
        return self.replace(op, node, self._facts)

    def validate(self, node: ir.Node) -> Any:
        raise NotImplementedError

    def replace(self, op, node: ir.Node, facts: Any) -> ir.Value:
        raise NotImplementedError


def _base(node: ir.Node) -> str:
    return node.outputs[0].name


class BatchNormToMulAdd(HtpRule):
    """BatchNormalization (inference) -> x * s + b with per-channel constants, exactly.

    A BatchNormalization no Conv absorbs (on a sequence, after a Transpose, as in text
    recognizers) is wrong on HTP in a 16-bit QDQ graph: 6.9 dB against 32 dB in the CPU
    EP's simulation of the same model. As a Mul and an Add by constants it is right.
    """

    op_type = "BatchNormalization"
    rule_name = "batchnorm_to_mul_add"

    def validate(self, node: ir.Node) -> Any:
        if _attr_int(node, "training_mode", 0):
            return "training_mode=1"
        values = [const(v) for v in node.inputs[1:5]]
        if len(values) < 4 or any(v is None for v in values):
            return "scale, bias, mean or variance is not a constant"
        rank = len(static_dims(node.inputs[0]) or [])
        if rank < 2:
            return "the input's rank is unknown or below 2"
        gamma, beta, mean, var = (np.asarray(v, np.float64) for v in values)
        eps = node.attributes.get_float("epsilon", 1e-5)
        scale = gamma / np.sqrt(var + eps)
        shift = beta - mean * scale
        per_channel = [-1] + [1] * (rank - 2)
        return scale.reshape(per_channel), shift.reshape(per_channel)

    def replace(self, op, node: ir.Node, facts: Any) -> ir.Value:
        scale, shift = facts
        base, name = _base(node), node.name or _base(node)
        s = op.initializer(ir.tensor(scale.astype(np.float32), name=f"{base}_bn_scale"))
        b = op.initializer(ir.tensor(shift.astype(np.float32), name=f"{base}_bn_shift"))
        mid = op.Mul(node.inputs[0], s, _name=f"{name}_scale", _outputs=[f"{base}_bn_scaled"])
        return op.Add(mid, b, _name=f"{name}_shift", _outputs=[base])


class WhereOfConstantsToArithmetic(HtpRule):
    """Where(c, a, b) with float scalar constants a, b -> Cast(c) * (a - b) + b, exactly.

    onnxruntime's quantizer leaves such a Where's constants in float; HTP then fails to
    finalize the graph (QNN_COMMON_ERROR_MEM_ALLOC), as on the attention mask BERT builds
    with `Where(mask, 0, finfo.min)`. As a Mul and an Add the constants are quantized.
    """

    op_type = "Where"
    rule_name = "where_of_constants_to_arithmetic"
    log_refusals = False  # most Wheres choose between computed values

    def validate(self, node: ir.Node) -> Any:
        a, b = (const(v) for v in node.inputs[1:3])
        if a is None or b is None or a.size != 1 or b.size != 1 or a.dtype.kind != "f":
            return "the choices are not two float scalar constants"
        if not (np.isfinite(a).all() and np.isfinite(b).all()):
            return "an infinite choice (0 * inf is NaN): left a Where"
        # in float64: 0 - finfo.min is finfo.max, exactly representable
        step = np.asarray(a, np.float64) - np.asarray(b, np.float64)
        step = np.clip(step, -np.finfo(a.dtype).max, np.finfo(a.dtype).max).astype(a.dtype)
        return a, b, step

    def replace(self, op, node: ir.Node, facts: Any) -> ir.Value:
        a, b, step = facts
        base, name = _base(node), node.name or _base(node)
        delta = op.initializer(ir.tensor(step.reshape(a.shape), name=f"{base}_delta"))
        offset = op.initializer(ir.tensor(np.asarray(b, a.dtype), name=f"{base}_base"))
        to = ir.DataType.from_numpy(a.dtype)
        cond = op.Cast(node.inputs[0], to=to, _name=f"{name}_cast", _outputs=[f"{base}_cond"])
        scaled = op.Mul(cond, delta, _name=f"{name}_mul", _outputs=[f"{base}_scaled"])
        return op.Add(scaled, offset, _name=f"{name}_add", _outputs=[base])


def _scalar_index(value: ir.Value | None) -> int | None:
    """A constant (or an Expand of one) holding one index everywhere."""
    found = const(value)
    if found is None:
        node = value.producer() if value is not None else None
        if node is None or node.op_type != "Expand":
            return None
        found = const(node.inputs[0])
    if found is None or found.size == 0:
        return None
    flat = np.asarray(found).ravel()
    return int(flat[0]) if (flat == flat[0]).all() else None


def _is_channel(gather: ir.Node | None, data: ir.Value, k: int, axis: int, rank: int) -> bool:
    if gather is None or gather.op_type != "Gather" or gather.inputs[0] is not data:
        return False
    index = const(gather.inputs[1])
    g_axis = _attr_int(gather, "axis", 0) % rank
    return g_axis == axis and index is not None and index.ndim == 0 and int(index) == k


class ChannelScatterToElementwise(HtpRule):
    """`x[..., k] = f(x[..., k])` (Gather -> f -> Unsqueeze -> ScatterElements, torch's
    select_scatter) with f an elementwise op by a constant -> one elementwise op by a
    per-channel constant (identity elsewhere), exactly.

    Quantized, one tensor would hold both the old and the new channel values (SAM 3: pixels
    in [0, 112] and fractions in [0, 1]); 8 bits cannot carry both (pred_masks 3 dB on HTP
    and in the CPU simulation alike), and HTP cannot finalize the u8/u16 mixes that would
    widen just that tensor.
    """

    op_type = "ScatterElements"
    rule_name = "channel_scatter_to_elementwise"

    def validate(self, node: ir.Node) -> Any:
        if len(node.inputs) != 3 or not _reduction_none(node):
            return "a reduction"
        data, indices, updates = node.inputs
        shape = static_dims(data)
        if not shape or None in shape:
            return "the data's shape is not static"
        rank = len(shape)
        axis = _attr_int(node, "axis", 0) % rank
        k = _scalar_index(indices)
        unsq = updates.producer() if updates is not None else None
        if k is None or unsq is None or unsq.op_type != "Unsqueeze":
            return "not one constant channel written from an Unsqueeze"
        f = unsq.inputs[0].producer() if unsq.inputs[0] is not None else None
        if f is None:
            return "the update is not computed from the channel"
        if f.op_type == "Gather" and _is_channel(f, data, k, axis, rank):
            op_type, c = "Mul", np.float32(1.0)  # x[..., k] = x[..., k]: nothing changes
        elif f.op_type in _ELEMENTWISE:
            g = f.inputs[0].producer() if f.inputs[0] is not None else None
            c = const(f.inputs[1])
            if c is None or not _is_channel(g, data, k, axis, rank):
                return "the update is not the channel by a constant"
            op_type = f.op_type
        else:
            return f"the update is computed by {f.op_type}, not an elementwise op"
        trailing = rank - 1 - axis
        c = np.asarray(c, dtype=np.float32)
        if c.ndim > trailing:
            return "the constant has more dims than the channel"
        table_shape = [shape[axis]] + [1] * (trailing - c.ndim) + list(c.shape)
        table = np.full(table_shape, _ELEMENTWISE.get(op_type, 1.0), dtype=np.float32)
        table[k] = np.broadcast_to(c, table_shape[1:])
        return op_type, table

    def replace(self, op, node: ir.Node, facts: Any) -> ir.Value:
        op_type, table = facts
        base = _base(node)
        name = f"{base}_channel_{op_type.lower()}"
        table_value = op.initializer(ir.tensor(table, name=name))
        return op.op(op_type, node.inputs[0], table_value, _name=node.name, _outputs=[base])


def _constant_or_expanded(value: ir.Value | None) -> np.ndarray | None:
    """A constant, or an Expand of a constant to a static shape, as an array (else None)."""
    found = const(value)
    if found is not None:
        return found
    node = value.producer() if value is not None else None
    shape = static_dims(value)
    if node is None or node.op_type != "Expand" or not shape or None in shape:
        return None
    found = const(node.inputs[0])
    return None if found is None else np.broadcast_to(found, shape)


class ConstantScatterToArithmetic(HtpRule):
    """ScatterElements / ScatterND writing constant updates at constant indices into a
    tensor of static shape -> x * keep + table (keep 0 where written, 1 elsewhere; table
    the updates where written, 0 elsewhere): exact for finite x.

    HTP writes a scatter's update integers into the data with the data's encoding; a
    constant update is quantized as a weight with its own scale, so the written values
    come out wrong (SAM 3's box corners: 5.5 dB against the CPU EP on that tensor).
    """

    rule_name = "constant_scatter_to_arithmetic"

    def validate(self, node: ir.Node) -> Any:
        if len(node.inputs) != 3 or not _reduction_none(node):
            return "a reduction"
        data, indices, updates = node.inputs
        shape = static_dims(data)
        index = _constant_or_expanded(indices)
        values = const(updates)
        if not shape or None in shape:
            return "the data's shape is not static"
        if index is None or values is None:
            return "indices or updates are not constants"
        if values.dtype.kind != "f" or index.dtype.kind not in "iu":
            return "the updates are not float"
        keep = np.ones(shape, dtype=values.dtype)
        table = np.zeros(shape, dtype=values.dtype)
        try:
            if node.op_type == "ScatterElements":
                axis = _attr_int(node, "axis", 0) % len(shape)
                where = index % shape[axis]
                values = np.broadcast_to(values, where.shape)
                np.put_along_axis(keep, where, 0, axis)
                np.put_along_axis(table, where, values, axis)
            else:
                where = tuple(np.moveaxis(index, -1, 0) % np.array(shape[: index.shape[-1]])
                              .reshape(-1, *[1] * (index.ndim - 1)))  # fmt: skip
                keep[where] = 0
                table[where] = values
        except (ValueError, IndexError):
            return "indices the op would refuse"
        return keep, table

    def replace(self, op, node: ir.Node, facts: Any) -> ir.Value:
        keep, table = facts
        base, name = _base(node), node.name or _base(node)
        k = op.initializer(ir.tensor(keep, name=f"{base}_scatter_keep"))
        t = op.initializer(ir.tensor(table, name=f"{base}_scatter_table"))
        mid = op.Mul(node.inputs[0], k, _name=f"{name}_keep", _outputs=[f"{base}_kept"])
        return op.Add(mid, t, _name=f"{name}_table", _outputs=[base])


class ConstantGatherNDToGather(HtpRule):
    """GatherND(x, constant indices) -> Reshape(x, [n, *rest]) -> Gather(axis 0, flat
    indices), or a single Reshape when the flat indices are 0..n-1 in order; exact.

    HTP refuses GatherND; dynamo's BERT export reads its attention mask that way. (The
    prepare stage `gathernd` rewrites the general case first; this is the form quantize
    always produced, kept for the models that skip that stage.)
    """

    op_type = "GatherND"
    rule_name = "constant_gathernd_to_gather"

    def validate(self, node: ir.Node) -> Any:
        if _attr_int(node, "batch_dims", 0):
            return "batch_dims is not 0"
        index = const(node.inputs[1])
        shape = static_dims(node.inputs[0])
        if index is None or index.ndim < 1:
            return "the indices are not a constant"
        if not shape or None in shape:
            return "the data's shape is not static"
        k = index.shape[-1]
        if k > len(shape) or index.dtype.kind not in "iu":
            return "the indices do not fit the data"
        lead, rest = np.array(shape[:k]), shape[k:]
        if not ((-lead <= index) & (index < lead)).all():
            return "an index out of range (the op would fail)"
        flat = np.ravel_multi_index(tuple(np.moveaxis(index % lead, -1, 0)), lead)
        count = int(np.prod(lead))
        return flat, count, rest, [*index.shape[:-1], *rest]

    def replace(self, op, node: ir.Node, facts: Any) -> ir.Value:
        flat, count, rest, out_shape = facts
        base, name = _base(node), node.name or _base(node)
        j = 0
        if flat.size == count and (flat.ravel() == np.arange(count)).all():
            source = node.inputs[0]
        else:
            flat_shape = op.initializer(
                ir.tensor(np.array([count, *rest], np.int64), name=f"{base}_flat_shape")
            )
            indices = op.initializer(ir.tensor(flat.astype(np.int64), name=f"{base}_flat_indices"))
            rows = op.Reshape(
                node.inputs[0], flat_shape, _name=f"{name}_0", _outputs=[f"{base}_rows"]
            )
            source = op.Gather(rows, indices, _name=f"{name}_1", _outputs=[f"{base}_picked"])
            j = 2
        shape = op.initializer(ir.tensor(np.array(out_shape, np.int64), name=f"{base}_shape"))
        return op.Reshape(source, shape, _name=f"{name}_{j}", _outputs=[base])


class ZeroConstantAddToIdentity(HtpRule):
    """`x + 0` / `x - 0` (constant all-zero float operand, no broadcasting growth) -> x.

    Add/Sub of an all-zero constant followed by a Relu that the quantizer folds into the
    Q/DQ pair is wrong on HTP (3 dB SQNR against 95 dB on the CPU EP, in a two-node graph);
    they compute nothing, so they are bypassed. The replacement is an Identity named as
    the node was, which IdentityEliminationPass removes unless it gives a graph output its
    name.
    """

    rule_name = "zero_constant_add"
    log_refusals = False

    def validate(self, node: ir.Node) -> Any:
        if len(node.inputs) != 2:
            return "not two operands"
        zero_at = None
        for k in (1, 0):
            values = const(node.inputs[k])
            if values is not None and values.dtype.kind == "f" and values.size and not values.any():
                zero_at = k
                break
        if zero_at is None:
            return "no all-zero float constant operand"
        if node.op_type == "Sub" and zero_at == 0:
            return "0 - x is not x"
        return _other_unbroadcast(node, zero_at)

    def replace(self, op, node: ir.Node, facts: Any) -> ir.Value:
        return op.Identity(facts, _name=node.name, _outputs=[_base(node)])


class ReduceUnitAxes(HtpRule):
    """A reduction (keepdims=1) over axes of which some have static size 1 -> the same
    reduction over the other axes only (an Identity when none is left), exactly: reducing a
    size-1 axis with its dim kept changes nothing.

    HTP gets such a reduction wrong: Swin's pooler (Transpose -> Unsqueeze -> ReduceMean over
    axes [-1, -2] of a [1, 32, 1, 64] tensor) gave one constant for every channel, -26.3 dB
    against the CPU EP on the same six-node QDQ unit (w8a16, onnxruntime-qnn 2.7), and the
    tiny Swin's top-1 agreement was 0; over axis [-1] alone the same unit is right (68.2 dB).
    """

    rule_name = "reduce_unit_axes"
    log_refusals = False

    def validate(self, node: ir.Node) -> Any:
        if _attr_int(node, "keepdims", 1) != 1:
            return "keepdims=0 (the size-1 axes would be removed)"
        shape = static_dims(node.inputs[0])
        if shape is None:
            return "the input's rank is not known"
        from_input = len(node.inputs) > 1 and node.inputs[1] is not None
        if from_input:
            axes = const(node.inputs[1])
            if axes is None:
                return "the axes are not a constant"
            axes = [int(a) for a in np.asarray(axes).ravel()]
        else:
            attr = node.attributes.get("axes")
            axes = list(attr.as_ints()) if attr is not None else []
        if not axes:
            return "no axes (all, or none with noop_with_empty_axes)"
        rank = len(shape)
        axes = [a % rank for a in axes]
        kept = [a for a in axes if shape[a] != 1]
        if len(kept) == len(axes):
            return "no axis of static size 1"
        return node.inputs[0], kept, from_input

    def replace(self, op, node: ir.Node, facts: Any) -> ir.Value:
        x, kept, from_input = facts
        base = _base(node)
        if not kept:
            return op.Identity(x, _name=node.name, _outputs=[base])
        attrs = {k: v for k, v in node.attributes.items() if k != "axes"}
        if from_input:
            axes = op.initializer(ir.tensor(np.array(kept, np.int64), name=f"{base}_axes"))
            return op.op(node.op_type, x, axes, **attrs, _name=node.name, _outputs=[base])
        return op.op(node.op_type, x, axes=kept, **attrs, _name=node.name, _outputs=[base])


class WholeMapAveragePoolToGlobal(HtpRule):
    """An AveragePool whose window covers the whole map (no pads, one output position per
    axis) -> GlobalAveragePool, exactly: both average every element (a window that
    overhangs the map with ceil_mode averages only the elements inside it, as onnxruntime
    and torch compute it).

    HTP refuses such a pool: EfficientNet's head (`nn.AvgPool2d(1280, ceil_mode=True)` on a
    2x2 map: kernel 320 in the tiny config) failed to load with `AveragePool with domain
    com.ms.internal.nhwc ... was not selected by that EP`.
    """

    op_type = "AveragePool"
    rule_name = "whole_map_average_pool"

    def validate(self, node: ir.Node) -> Any:
        shape = static_dims(node.inputs[0])
        if shape is None or len(shape) < 3 or any(d is None for d in shape[2:]):
            return "the input's spatial dims are not static"
        if node.attributes.get_string("auto_pad", "NOTSET") not in ("NOTSET", ""):
            return "auto_pad"
        pads = node.attributes.get_ints("pads", [])
        if any(pads):
            return "padded"
        if any(d != 1 for d in node.attributes.get_ints("dilations", []) or []):
            return "dilated"
        kernel = node.attributes.get_ints("kernel_shape", [])
        spatial = shape[2:]
        if len(kernel) != len(spatial) or any(k < d for k, d in zip(kernel, spatial, strict=True)):
            return "the window does not cover the map"
        strides = node.attributes.get_ints("strides", None) or [1] * len(kernel)
        ceil = _attr_int(node, "ceil_mode", 0)
        for d, k, st in zip(spatial, kernel, strides, strict=True):
            size = (d - k + (st - 1 if ceil else 0)) // st + 1 if d >= k else (1 if ceil else 0)
            if size != 1:
                return "more than one output position"
        return node.inputs[0]

    def replace(self, op, node: ir.Node, facts: Any) -> ir.Value:
        return op.GlobalAveragePool(facts, _name=node.name, _outputs=[_base(node)])


class ReduceL2ToSqrtOfSum(HtpRule):
    """ReduceL2(x) -> Sqrt(ReduceSum(x * x)) over the same axes (what ReduceL2 computes).

    A quantized ReduceL2 fails HTP's graph finalize (QNN_COMMON_ERROR_MEM_ALLOC): ConvNeXt
    V2's global response normalization (ReduceL2 -> ReduceMean -> Add -> Div) in a 12-node
    w8a16 graph, and sentence embedders' L2 normalization; the same graph with the sum of
    squares loads and agrees with the CPU EP (68.8 dB).
    """

    op_type = "ReduceL2"
    rule_name = "reduce_l2_to_sqrt_of_sum"

    def validate(self, node: ir.Node) -> Any:
        if len(node.inputs) > 1 and node.inputs[1] is not None:
            axes = const(node.inputs[1])
            if axes is None:
                return "the axes are not a constant"
            return node.inputs[0], [int(a) for a in np.asarray(axes).ravel()]
        attr = node.attributes.get("axes")
        return node.inputs[0], list(attr.as_ints()) if attr is not None else []

    def replace(self, op, node: ir.Node, facts: Any) -> ir.Value:
        x, axes = facts
        base = _base(node)
        attrs = {k: v for k, v in node.attributes.items() if k != "axes"}
        square = op.Mul(x, x, _name=f"{node.name}_square", _outputs=[f"{base}_square"])
        inputs = [square]
        if axes:
            inputs.append(op.initializer(ir.tensor(np.array(axes, np.int64), name=f"{base}_axes")))
        total = op.ReduceSum(*inputs, **attrs, _name=f"{node.name}_sum", _outputs=[f"{base}_sum"])
        return op.Sqrt(total, _name=node.name, _outputs=[base])


class InfiniteBoundToIdentity(HtpRule):
    """`Max(x, -inf)` / `Min(x, +inf)` (a constant operand of that infinity, no broadcasting
    growth) -> x, exactly: jax2tf writes the initial value of a max reduction so (magika's
    softmax: `Max(ReduceMax(x), -inf)`). Quantized, the constant gets an infinite scale (its
    Dequantize is NaN); kept float, HTP still quantizes it: top-1 agreement 0.125 on HTP
    against 1.0 on the CPU EP. An Identity named as the node was, as zero_constant_add."""

    rule_name = "infinite_bound_to_identity"
    log_refusals = False

    def validate(self, node: ir.Node) -> Any:
        if len(node.inputs) != 2:
            return "not two operands"
        bound = -np.inf if node.op_type == "Max" else np.inf
        for k in (1, 0):
            values = const(node.inputs[k])
            if values is None or values.dtype.kind != "f" or not values.size:
                continue
            if not (values == bound).all():
                continue
            return _other_unbroadcast(node, k)
        return f"no constant {bound} operand"

    def replace(self, op, node: ir.Node, facts: Any) -> ir.Value:
        return op.Identity(facts, _name=node.name, _outputs=[_base(node)])


class MergeConstantChain(HtpRule):
    """op(op(x, A), B) -> op(x, A (*|+) B) for Mul/Div (product) and Add/Sub (sum) by
    constants, when the inner result has no other reader (what the scatter rewrites leave
    behind: one quantized constant instead of two)."""

    rule_name = "merge_constant_chain"
    log_refusals = False

    def validate(self, node: ir.Node) -> Any:
        inner = node.inputs[0].producer() if node.inputs[0] is not None else None
        if inner is None or inner.op_type != node.op_type or inner.domain != node.domain:
            return "the first operand is not computed by the same op"
        if inner.outputs[0].is_graph_output() or len(inner.outputs[0].uses()) != 1:
            return "the inner result has other readers"
        if len(node.inputs) != 2 or len(inner.inputs) != 2:
            return "not two operands"
        a, b = const(inner.inputs[1]), const(node.inputs[1])
        if a is None or b is None or a.dtype != b.dtype:
            return "the operands are not two constants of one type"
        combined = a * b if node.op_type in ("Mul", "Div") else a + b
        return inner.inputs[0], np.asarray(combined)

    def replace(self, op, node: ir.Node, facts: Any) -> ir.Value:
        x, combined = facts
        base = _base(node)
        merged = op.initializer(ir.tensor(combined, name=f"{base}_merged"))
        return op.op(node.op_type, x, merged, _name=node.name, _outputs=[base])


class ErfGeluPass(ir.passes.InPlacePass):
    """x * 0.5 * (1 + erf(x / sqrt(2))) (as exporters write GELU) -> com.microsoft Gelu.

    The QNN EP takes no Erf (HTP refuses the node), and has a Gelu. An onnx_ir pass, not
    onnxscript's erfgelu rules: those match two of the four operand orders and only a Div
    by sqrt(2), where exporters also write a Mul by 1/sqrt(2); and the Gelu takes the
    Erf's place (after x, before any reader), where a rule would put it after the last Mul.
    """

    rule_name = "erf_gelu_to_gelu"

    def __init__(self, log: RewriteLog) -> None:
        super().__init__()
        self.log = log

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        fused = 0
        for graph in (model.graph, *model.graph.subgraphs()):
            for erf in [n for n in graph if n.op_type == "Erf" and n.domain == ""]:
                found = _gelu_chain(erf)
                if isinstance(found, str):
                    self.log.keep(self.rule_name, erf.name, found)
                    continue
                x, half, dead = found
                out = dead[2].outputs[0]
                gelu = ir.node(
                    "Gelu", [x], domain="com.microsoft", name=f"{erf.name or x.name}_gelu"
                )
                graph.insert_before(erf, gelu)
                new = gelu.outputs[0]
                # typed, since onnx's shape inference does not know the op: calibration
                # ranges (and so quantization) need the output's type
                new.dtype = out.dtype or ir.DataType.from_numpy(half.dtype)
                if out.is_graph_output():
                    new.shape = out.shape  # a graph output keeps its declared shape
                ir.convenience.replace_all_uses_with(out, new, replace_graph_outputs=True)
                name, out.name = out.name, None
                new.name = name
                graph.remove([erf, *dead], safe=True)
                self.log.add(self.rule_name, erf.name)
                fused += 1
        if fused and "com.microsoft" not in model.opset_imports:
            model.opset_imports["com.microsoft"] = 1
        return ir.passes.PassResult(model, bool(fused))


def _gelu_chain(erf: ir.Node) -> tuple[ir.Value, np.ndarray, list[ir.Node]] | str:
    """(x, the 0.5 constant, the nodes the Gelu replaces after the Erf) or why not."""

    def scalar(value: ir.Value | None) -> float | None:
        found = const(value)
        return float(found) if found is not None and found.size == 1 else None

    def only(value: ir.Value, op_type: str) -> ir.Node | None:
        readers = [user for user, _ in value.uses()]
        return readers[0] if len(readers) == 1 and readers[0].op_type == op_type else None

    def other(user: ir.Node, value: ir.Value) -> ir.Value:
        return user.inputs[1] if user.inputs[0] is value else user.inputs[0]

    scale = erf.inputs[0].producer() if erf.inputs[0] is not None else None
    if scale is None or scale.op_type not in ("Div", "Mul"):
        return "the Erf's input is not a Div or Mul"
    x, c = scale.inputs[0], scalar(scale.inputs[1])
    if c is None or not math.isclose(
        c if scale.op_type == "Div" else 1 / c, math.sqrt(2), rel_tol=1e-3
    ):
        return "the Erf's input is not x / sqrt(2)"
    add = only(erf.outputs[0], "Add")
    if add is None or scalar(other(add, erf.outputs[0])) != 1.0:
        return "the Erf is not followed by + 1"
    m1 = only(add.outputs[0], "Mul")
    m2 = only(m1.outputs[0], "Mul") if m1 is not None else None
    if m1 is None or m2 is None:
        return "the + 1 is not followed by two Muls"
    first, second = other(m1, add.outputs[0]), other(m2, m1.outputs[0])
    if {first, second} - {x} and sorted([first is x, second is x]) != [False, True]:
        return "the Muls are not by x and 0.5"
    half = second if first is x else first
    if scalar(half) != 0.5:
        return "the Muls are not by x and 0.5"
    dead = [add, m1, m2]
    if len(scale.outputs[0].uses()) == 1:
        dead.append(scale)
    return x, const(half), dead


class NanGuardPass(ir.passes.InPlacePass):
    """In a QDQ graph, `Where(IsNaN(t), v, t)` with t a DequantizeLinear output -> t.

    A dequantized value is never NaN, so the guard (what exporters write for SDPA's
    `softmax.masked_fill(isnan, 0)`) selects t everywhere: exact in the quantized graph.
    HTP cannot finalize a graph where a boolean made from quantized values (IsNaN of a DQ
    output, then Where) feeds quantized ops (QNN_COMMON_ERROR_MEM_ALLOC). An onnx_ir pass:
    the readers move to t, which keeps its name (a rule would give t the Where's name).
    """

    rule_name = "fold_nan_guard"

    def __init__(self, log: RewriteLog) -> None:
        super().__init__()
        self.log = log

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        folded = 0
        for graph in (model.graph, *model.graph.subgraphs()):
            for check in [n for n in graph if n.op_type in ("IsNaN", "IsInf") and n.domain == ""]:
                tensor = check.inputs[0]
                source = tensor.producer() if tensor is not None else None
                if source is None or source.op_type != "DequantizeLinear":
                    continue
                for where, _ in list(check.outputs[0].uses()):
                    if where.op_type != "Where" or list(where.inputs[::2]) != [
                        check.outputs[0],
                        tensor,
                    ]:
                        continue
                    if where.outputs[0].is_graph_output():
                        self.log.keep(self.rule_name, where.name, "the Where gives a graph output")
                        continue
                    ir.convenience.replace_all_uses_with(where.outputs[0], tensor)
                    self.log.add(self.rule_name, where.name)
                    folded += 1
        if folded:
            ir.passes.common.RemoveUnusedNodesPass()(model)
        return ir.passes.PassResult(model, bool(folded))


def _producer(value: ir.Value | None, op_type: str) -> ir.Node | None:
    node = value.producer() if value is not None else None
    return node if node is not None and node.op_type == op_type and node.domain == "" else None


def _ints(value: ir.Value | None) -> list[int] | None:
    found = const(value)
    return None if found is None or found.dtype.kind not in "iu" else np.ravel(found).tolist()


def _axes(node: ir.Node, rank: int) -> list[int] | None:
    """A Squeeze/Unsqueeze's axes (input, or attribute before opset 13), made non-negative."""
    found = _ints(node.inputs[1]) if len(node.inputs) > 1 else None
    if found is None and "axes" in node.attributes:
        found = list(node.attributes.get_ints("axes"))
    return None if found is None else [a % rank for a in found]


def _half(value: ir.Value | None, k: int) -> ir.Value | None:
    """v when `value` is `Squeeze(Slice(v, k, k + 1, axis=-1), axis=-1)` with v [.., 2]."""
    squeeze = _producer(value, "Squeeze")
    sliced = _producer(squeeze.inputs[0], "Slice") if squeeze is not None else None
    dims = static_dims(sliced.inputs[0]) if sliced is not None else None
    if squeeze is None or sliced is None or not dims or dims[-1] != 2:
        return None
    last = len(dims) - 1
    starts, ends, *rest = (_ints(v) for v in sliced.inputs[1:])
    axes = rest[0] if rest else [last]
    steps = rest[1] if len(rest) > 1 else [1]
    if None in (starts, ends, axes, steps) or len(starts) != 1 or len(axes) != 1:
        return None
    # as Slice clamps: start/end in [0, 2] after adding 2 to a negative one
    start, end = (min(max(v + 2 if v < 0 else v, 0), 2) for v in (starts[0], ends[0]))
    if axes[0] % len(dims) != last or steps != [1] or (start, end) != (k, k + 1):
        return None
    return sliced.inputs[0] if _axes(squeeze, len(dims)) == [last] else None


class RotatePairwiseToGather(HtpRule):
    """The pairwise rotation of rotary embeddings (transformers' `rotate_pairwise`:
    `stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2)`, exported as Reshape to [.., D/2,
    2], Slice + Squeeze of each half, Neg, Unsqueeze both, Concat on the new last axis,
    Reshape back) -> Gather(x, [1, 0, 3, 2, ..], axis=-1) * [-1, 1, -1, 1, ..], exactly.

    The rank-5 Concat on a new last axis of size 2 is where QNN HTP's graph preparation of
    SAM 3's 1008 px encoder grows past 16 GB (docs/sam3-htp-memory.md); a Gather of the
    permuted index and a Mul by the signs stay rank 4 (the merge rule then folds the signs
    into the constant sin table the rotation is multiplied by). An index permutation is what
    onnxscript's rewriter has no rule for.
    """

    op_type = "Reshape"
    rule_name = "rotate_pairwise_to_gather"
    log_refusals = False  # most Reshapes are no rotation

    def validate(self, node: ir.Node) -> Any:
        concat = _producer(node.inputs[0], "Concat")
        dims = static_dims(node.inputs[0])
        if concat is None or not dims or len(concat.inputs) != 2 or dims[-1] != 2:
            return "not a Concat of two halves on a new last axis"
        if _attr_int(concat, "axis", 0) % len(dims) != len(dims) - 1:
            return "not a Concat on the last axis"
        first, second = (_producer(v, "Unsqueeze") for v in concat.inputs)
        if first is None or second is None:
            return "the halves are not Unsqueezed"
        if any(_axes(u, len(dims)) != [len(dims) - 1] for u in (first, second)):
            return "the halves are not Unsqueezed on the last axis"
        neg = _producer(first.inputs[0], "Neg")
        pairs = _half(neg.inputs[0], 1) if neg is not None else None
        if pairs is None or _half(second.inputs[0], 0) is not pairs:
            return "not (-x[..., 1], x[..., 0]) of one pairs tensor"
        view = _producer(pairs, "Reshape")
        x = view.inputs[0] if view is not None else None
        shape, out = static_dims(x), static_dims(node.outputs[0])
        if not shape or None in shape or shape != out or [*shape[:-1], shape[-1] // 2, 2] != dims:
            return "the pairs are not x's last axis in pairs, or the result is not x's shape"
        if x.dtype is None or not x.dtype.is_floating_point():
            return "x is not float"
        return x, shape[-1]

    def replace(self, op, node: ir.Node, facts: Any) -> ir.Value:
        x, d = facts
        base, name = _base(node), node.name or _base(node)
        perm = np.arange(d).reshape(-1, 2)[:, ::-1].ravel()
        sign = np.tile(np.array([-1, 1]), d // 2).astype(x.dtype.numpy())
        index = op.initializer(ir.tensor(perm.astype(np.int64), name=f"{base}_pair_swap"))
        signs = op.initializer(ir.tensor(sign, name=f"{base}_pair_signs"))
        swapped = op.Gather(x, index, axis=-1, _name=f"{name}_swap", _outputs=[f"{base}_swapped"])
        return op.Mul(swapped, signs, _name=f"{name}_signs", _outputs=[base])


def _other_unbroadcast(node: ir.Node, constant_at: int) -> Any:
    """The operand beside the constant at `constant_at`, when the constant cannot broadcast
    it to a larger shape (so the node's output is that operand's shape); else why not."""
    other = node.inputs[1 - constant_at]
    shape = static_dims(other)
    const_shape = list(node.inputs[constant_at].shape or [])
    if shape is None or len(const_shape) > len(shape):
        return "the constant could broadcast x to a larger shape"
    for got, c in zip(reversed(shape), reversed(const_shape), strict=False):
        if c != 1 and got != c:
            return "the constant broadcasts x to a larger shape"
    return other


# Unary elementwise ops HTP refuses on a tensor of rank 5 or more (each alone between Q and
# DQ on a [1, 2, 3, 16, 16] input, w8a16, onnxruntime-qnn 2.7): the ops that place at rank 5
# (Sigmoid, Relu, Abs, Exp, LeakyRelu, HardSigmoid) are left alone.
HIGH_RANK_REFUSED_UNARY = ("Tanh", "Sqrt", "Elu", "Neg", "Sin", "Erf", "Softplus")


class HighRankUnaryToRank4(HtpRule):
    """A unary elementwise op on a static tensor of rank >= 5 -> Reshape to rank 4 (the
    leading axes merged), the op, Reshape back; exact (an elementwise op does not see the
    shape).

    HTP refuses Tanh (and the others of HIGH_RANK_REFUSED_UNARY) at rank 5, at every
    precision and whatever its output encoding: an image decoder ending in Tanh on
    [1, T, C, H, W] frames had its `frame` QuantizeLinear and Tanh nodes refused; at rank 4
    the same ops place and agree with the CPU EP.
    """

    rule_name = "high_rank_unary_to_rank4"
    log_refusals = False

    def validate(self, node: ir.Node) -> Any:
        shape = static_dims(node.inputs[0])
        if shape is None or len(shape) < 5:
            return "rank below 5 or not known"
        if any(d is None for d in shape):
            return "the input's dims are not static"
        return node.inputs[0], shape

    def replace(self, op, node: ir.Node, facts: Any) -> ir.Value:
        x, shape = facts
        base = _base(node)
        flat = [int(np.prod(shape[:-3])), *shape[-3:]]
        to4 = op.initializer(ir.tensor(np.array(flat, np.int64), name=f"{base}_rank4_shape"))
        back = op.initializer(ir.tensor(np.array(shape, np.int64), name=f"{base}_shape"))
        x4 = op.Reshape(x, to4, _name=f"{node.name}_to_rank4", _outputs=[f"{base}_rank4_in"])
        attrs = dict(node.attributes.items())
        y4 = op.op(node.op_type, x4, **attrs, _name=node.name, _outputs=[f"{base}_rank4"])
        return op.Reshape(y4, back, _name=f"{node.name}_from_rank4", _outputs=[base])
