"""Fused quantized ops as onnxscript rewrite rules: pattern -> float replacement.

Each rule matches one quantized op (its required inputs; optional ones such as a bias or a
zero point are read from the node), `check` refuses what it cannot rewrite exactly with a
`MatchResult` reason ("attribute channels_last=1 is not supported"), and the replacement
is DequantizeLinear on the quantized inputs -> the float op -> QuantizeLinear when the
output was quantized. The DQ of a constant and the Q -> DQ pairs this leaves are folded and
collapsed by the passes that follow (passes.py).

onnxscript gives the matched output's name to the replacement's output, so a tensor keeps
its name; new nodes and constants are named here after the quantized ones.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from winml_recipes.quant.dequantize.state import DequantizeState, Refused
from winml_recipes.quant.dequantize.values import (
    CONV_ATTRS,
    DT,
    POOL_ATTRS,
    attr_float,
    attr_int,
    base_name,
    const,
    dequantize_array,
    dtype_of,
    input_at,
    strip_quant_suffix,
    unpack_bits,
)

MatchResult = pattern.MatchResult
# onnx_ir reads "ai.onnx" as "": these two cover every domain a quantized op is read from.
DOMAINS = ("", "com.microsoft")


class _Builder:
    """Named nodes and constants on onnxscript's tape, for the replacement of `node`."""

    def __init__(self, op, state: DequantizeState, node: ir.Node, container) -> None:
        self.op, self.state, self.node = op, state, node
        self.in_function = isinstance(container, ir.Function)

    def dq(self, data, scale, zp, *, axis: int | None = None, tag: str) -> ir.Value:
        attrs = {} if axis is None else {"axis": axis}
        inputs = [data, scale] + ([zp] if zp is not None else [])
        return self.op.DequantizeLinear(
            *inputs,
            **attrs,
            _name=f"{base_name(self.node)}/dq_{tag}",
            _outputs=[self.state.float_name(data.name, "_dq")],
        )

    def float_op(self, op_type, inputs, attrs=None, *, name: str | None = None, out_name=None):
        """A float node named after the fused op, its output after the fused op's output."""
        return self.op.op(
            op_type,
            *inputs,
            **(attrs or {}),
            _name=name or strip_quant_suffix(base_name(self.node)),
            _outputs=[out_name or self.state.float_name(self.node.outputs[0].name)],
        )

    def step(self, op_type, inputs, attrs=None, *, name: str) -> ir.Value:
        """An intermediate float node `name`, its output `name`_out."""
        out_name = self.state.fresh_name(f"{name}_out")
        return self.float_op(op_type, inputs, attrs, name=name, out_name=out_name)

    def requantize(self, y: ir.Value, scale: ir.Value | None, zp: ir.Value | None) -> ir.Value:
        """Q on the float result when the fused op had a quantized output."""
        if scale is None:
            return y
        out = self.node.outputs[0]
        inputs = [y, scale] + ([zp] if zp is not None else [])
        return self.op.QuantizeLinear(
            *inputs,
            _name=f"{base_name(self.node)}/q",
            _outputs=[self.state.fresh_name(f"{out.name}_q")],
        )

    def constant(self, array: np.ndarray, source: str | ir.Value) -> ir.Value:
        """A float constant: an initializer, or a Constant node inside a function."""
        name = self.state.constant_name(source, self.node)
        tensor = ir.tensor(array, name=name)
        if self.in_function:
            return self.op.Constant(value=tensor, _name=f"{name}_const", _outputs=[name])
        return self.op.initializer(tensor, name)

    def int32_constant(self, value: ir.Value, scale: np.ndarray) -> ir.Value:
        """A constant int32 accumulator input (bias, C) as float: value * scale."""
        return self.constant(const(value).astype(np.float32) * scale, value)

    def matmul_bias(self, a: ir.Value, b: ir.Value, bias: ir.Value | None) -> ir.Value:
        if bias is None:
            return self.float_op("MatMul", [a, b])
        out_name = self.state.float_name(self.node.outputs[0].name, "_matmul")
        mm = self.float_op("MatMul", [a, b], name=base_name(self.node), out_name=out_name)
        return self.float_op("Add", [mm, bias])


def axis_for(scale: ir.Value | None, axis: int) -> int | None:
    """`axis` for a per-axis scale, None for a per-tensor one."""
    arr = const(scale)
    return axis if arr is not None and arr.size > 1 else None


class FusedOpRule(pattern.RewriteRuleClassBase):
    """One quantized op in one domain; subclasses give `pattern`, `validate`, `replace`."""

    op_type: ClassVar[str]

    def __init__(self, state: DequantizeState, domain: str) -> None:
        super().__init__(name=f"{self.op_type}" + (f"[{domain}]" if domain else ""))
        self.state, self.domain = state, domain
        self._container: ir.Graph | ir.Function | None = None

    def fused(self, op, *inputs):
        """The pattern: this op on its leading inputs (optional ones are read from the node)."""
        return getattr(op, self.op_type)(
            *inputs, _domain=self.domain, _allow_other_inputs=True, _outputs=["out"]
        )

    def validate(self, node: ir.Node) -> None:
        """Raise Refused for anything the replacement would not reproduce exactly."""
        self.state.check_attrs(node)

    def check(self, context, out: ir.Value, **_: Any) -> MatchResult:
        # onnxscript calls rewrite() right after a check() that passed, for the same match.
        self._container = context.graph_or_function
        try:
            self.validate(out.producer())
        except Refused as refusal:
            return MatchResult().fail(refusal.reason, refusal.node)
        return MatchResult()

    def rewrite(self, op, out: ir.Value, **bindings: Any) -> ir.Value:
        node = out.producer()
        y = self.replace(_Builder(op, self.state, node, self._container), node, **bindings)
        self.state.adopt(list(op.nodes), node)
        self.state.count_replaced(node.op_type)
        return y

    def replace(self, t: _Builder, node: ir.Node, **bindings: Any) -> ir.Value:
        raise NotImplementedError


class QLinearConvRule(FusedOpRule):
    """QLinearConv(x, w, B) -> Q(Conv(DQ(x), DQ(w), B * x_scale * w_scale))."""

    op_type = "QLinearConv"

    def pattern(self, op, x, xs, xz, w, ws, wz, ys, yz):
        return self.fused(op, x, xs, xz, w, ws, wz, ys, yz)

    def validate(self, node):
        self.state.qlinear_params(node, [(0, 1, 2), (3, 4, 5), (-1, 6, 7)])
        if input_at(node, 8) is not None:
            self.state.const_input(node, 8, "bias")

    def replace(self, t, node, x, xs, xz, w, ws, wz, ys, yz):
        inputs = [t.dq(x, xs, xz, tag="x"), t.dq(w, ws, wz, axis=axis_for(ws, 0), tag="w")]
        bias = input_at(node, 8)
        if bias is not None:
            scale = (const(xs) * const(ws)).astype(np.float32).reshape(-1)
            inputs.append(t.int32_constant(bias, scale))
        attrs = {k: a.value for k, a in node.attributes.items() if k in CONV_ATTRS}
        return t.requantize(t.float_op("Conv", inputs, attrs), ys, yz)


class QLinearMatMulRule(FusedOpRule):
    """QLinearMatMul(a, b) -> Q(MatMul(DQ(a), DQ(b)))."""

    op_type = "QLinearMatMul"

    def pattern(self, op, a, as_, az, b, bs, bz, ys, yz):
        return self.fused(op, a, as_, az, b, bs, bz, ys, yz)

    def validate(self, node):
        self.state.qlinear_params(node, [(0, 1, 2), (3, 4, 5), (-1, 6, 7)])

    def replace(self, t, node, a, as_, az, b, bs, bz, ys, yz):
        af = t.dq(a, as_, az, axis=axis_for(as_, -2), tag="a")
        bf = t.dq(b, bs, bz, axis=axis_for(bs, -1), tag="b")
        return t.requantize(t.float_op("MatMul", [af, bf]), ys, yz)


class QLinearBinaryRule(FusedOpRule):
    """QLinearAdd / QLinearMul(a, b) -> Q(Add / Mul(DQ(a), DQ(b))), per-tensor only."""

    def __init__(self, state: DequantizeState, domain: str, op_type: str) -> None:
        self.op_type = op_type
        super().__init__(state, domain)

    def pattern(self, op, a, as_):
        return self.fused(op, a, as_)

    def validate(self, node):
        self.state.qlinear_params(node, [(0, 1, 2), (3, 4, 5), (-1, 6, 7)])
        self.state.scalar_params(node, [1, 2, 4, 5, 6, 7])

    def replace(self, t, node, a, as_):
        az, b, bs, bz, ys, yz = (input_at(node, i) for i in range(2, 8))
        float_op = "Add" if node.op_type == "QLinearAdd" else "Mul"
        y = t.float_op(float_op, [t.dq(a, as_, az, tag="a"), t.dq(b, bs, bz, tag="b")])
        return t.requantize(y, ys, yz)


class QLinearUnaryRule(FusedOpRule):
    """QLinearSigmoid / LeakyRelu / GlobalAveragePool / AveragePool(x) -> Q(op(DQ(x)))."""

    def __init__(self, state: DequantizeState, domain: str, op_type: str) -> None:
        self.op_type = op_type
        super().__init__(state, domain)

    def pattern(self, op, x, xs):
        return self.fused(op, x, xs)

    def validate(self, node):
        self.state.qlinear_params(node, [(0, 1, 2), (-1, 3, 4)])
        self.state.scalar_params(node, [1, 2, 3, 4])

    def replace(self, t, node, x, xs):
        xf = t.dq(x, xs, input_at(node, 2), tag="x")
        float_op = node.op_type.removeprefix("QLinear")
        attrs: dict[str, Any] = {}
        if float_op == "LeakyRelu":
            attrs["alpha"] = attr_float(node, "alpha", 0.01)
        elif float_op == "AveragePool":
            attrs = {k: a.value for k, a in node.attributes.items() if k in POOL_ATTRS}
        y = t.float_op(float_op, [xf], attrs)
        return t.requantize(y, input_at(node, 3), input_at(node, 4))


class QLinearSoftmaxRule(FusedOpRule):
    """QLinearSoftmax(x) -> Q(Softmax(DQ(x))); opset-12 semantics become Flatten/Reshape."""

    op_type = "QLinearSoftmax"

    def pattern(self, op, x, xs):
        return self.fused(op, x, xs)

    def _opset(self) -> int:
        container = self._container
        if isinstance(container, ir.Function) and "" in container.opset_imports:
            return container.opset_imports[""]
        return self.state.model.opset_imports.get("", 1)

    def validate(self, node):
        self.state.qlinear_params(node, [(0, 1, 2), (-1, 3, 4)])
        self.state.scalar_params(node, [1, 2, 3, 4])
        if "opset" not in node.attributes:
            raise Refused(node, "attribute 'opset' is missing")
        semantics, model_opset = attr_int(node, "opset", 13), self._opset()
        if semantics >= 13 and model_opset < 13:
            raise Refused(
                node, f"opset={semantics} softmax semantics in an opset {model_opset} model"
            )

    def replace(self, t, node, x, xs):
        semantics = attr_int(node, "opset", 13)
        axis = attr_int(node, "axis", -1 if semantics >= 13 else 1)
        xf = t.dq(x, xs, input_at(node, 2), tag="x")
        if (semantics >= 13) == (self._opset() >= 13):
            y = t.float_op("Softmax", [xf], {"axis": axis})
        else:  # old semantics (coerced to 2-D at `axis`) in a model whose Softmax is per-axis
            name = base_name(node)
            flat = t.step("Flatten", [xf], {"axis": axis}, name=f"{name}/2d")
            soft = t.step("Softmax", [flat], {"axis": -1}, name=name)
            shape = t.step("Shape", [xf], name=f"{name}/shape")
            y = t.float_op("Reshape", [soft, shape])
        return t.requantize(y, input_at(node, 3), input_at(node, 4))


class QLinearConcatRule(FusedOpRule):
    """QLinearConcat(y_scale, y_zp, (x, scale, zp)...) -> Q(Concat(DQ(x)...))."""

    op_type = "QLinearConcat"

    def pattern(self, op, ys, yz):
        return self.fused(op, ys, yz)

    @staticmethod
    def _triples(node: ir.Node) -> list[tuple[int, int, int]]:
        return [(i, i + 1, i + 2) for i in range(2, len(node.inputs), 3)]

    def validate(self, node):
        n_in = len(node.inputs)
        if n_in < 5 or (n_in - 2) % 3:
            raise Refused(node, f"expected Y_scale, Y_zero_point and triples, got {n_in} inputs")
        triples = self._triples(node)
        self.state.qlinear_params(node, [*triples, (-1, 0, 1)])
        if "axis" not in node.attributes:
            raise Refused(node, "attribute 'axis' is missing")
        self.state.scalar_params(node, [0, 1, *(i for t in triples for i in t[1:])])

    def replace(self, t, node, ys, yz):
        parts = [
            t.dq(node.inputs[d], node.inputs[s], node.inputs[z], tag=str(k))
            for k, (d, s, z) in enumerate(self._triples(node))
        ]
        y = t.float_op("Concat", parts, {"axis": attr_int(node, "axis", 0)})
        return t.requantize(y, ys, yz)


class QGemmRule(FusedOpRule):
    """QGemm(a, b, C) -> [Q](Gemm(DQ(a), DQ(b), C * alpha * a_scale * bscale))."""

    op_type = "QGemm"

    def pattern(self, op, a, as_):
        return self.fused(op, a, as_)

    def validate(self, node):
        self.state.qlinear_params(node, [(0, 1, 2), (3, 4, 5), (-1, 7, 8)])
        if input_at(node, 6) is not None:
            self.state.const_input(node, 6, "input C")

    def replace(self, t, node, a, as_):
        az, b, bs, bz = (input_at(node, i) for i in range(2, 6))
        trans_b, alpha = attr_int(node, "transB", 0), attr_float(node, "alpha", 1.0)
        inputs = [
            t.dq(a, as_, az, tag="a"),
            t.dq(b, bs, bz, axis=axis_for(bs, 0 if trans_b else 1), tag="b"),
        ]
        c = input_at(node, 6)
        if c is not None:
            # C is int32 with scale alpha * a_scale * bscale (onnxruntime's QGemm kernel).
            scale = (np.float32(alpha) * const(as_) * const(bs)).astype(np.float32)
            inputs.append(t.int32_constant(c, scale))
        attrs = {"alpha": alpha, "beta": 1.0, "transA": attr_int(node, "transA", 0)}
        y = t.float_op("Gemm", inputs, {**attrs, "transB": trans_b})
        return t.requantize(y, input_at(node, 7), input_at(node, 8))


class MatMulIntegerToFloatRule(FusedOpRule):
    """MatMulIntegerToFloat(a, b, scales, zps, bias) -> MatMul(DQ(a), DQ(b)) [+ bias]."""

    op_type = "MatMulIntegerToFloat"

    def pattern(self, op, a, b, as_, bs):
        return self.fused(op, a, b, as_, bs)

    def validate(self, node):
        super().validate(node)
        self.state.param(node, 2, "a_scale", dynamic_ok=True)
        self.state.param(node, 3, "bscale")
        self.state.param(node, 4, "a_zero_point", dynamic_ok=True)
        self.state.param(node, 5, "bzero_point")
        self.state.scalar_params(node, [2])

    def replace(self, t, node, a, b, as_, bs):
        af = t.dq(a, as_, input_at(node, 4), tag="a")
        bf = t.dq(b, bs, input_at(node, 5), axis=axis_for(bs, -1), tag="b")
        return t.matmul_bias(af, bf, input_at(node, 6))


class DynamicQuantizeMatMulRule(FusedOpRule):
    """DynamicQuantizeMatMul(a, b, bscale, bzp, bias) -> MatMul(a, DQ(b)) [+ bias]."""

    op_type = "DynamicQuantizeMatMul"

    def pattern(self, op, a, b, bs):
        return self.fused(op, a, b, bs)

    def validate(self, node):
        super().validate(node)
        self.state.param(node, 2, "bscale")
        self.state.param(node, 3, "bzero_point")

    def replace(self, t, node, a, b, bs):
        bf = t.dq(b, bs, input_at(node, 3), axis=axis_for(bs, -1), tag="b")
        return t.matmul_bias(a, bf, input_at(node, 4))


class MatMulNBitsRule(FusedOpRule):
    """MatMulNBits(a, packed B, scales, zps, bias) -> MatMul(a, float W) [+ bias]."""

    op_type = "MatMulNBits"

    def pattern(self, op, a, b, scales):
        return self.fused(op, a, b, scales)

    def validate(self, node):
        super().validate(node)
        if attr_int(node, "weight_prepacked", 0):
            raise Refused(node, "attribute weight_prepacked is not supported")
        if input_at(node, 4) is not None:
            raise Refused(node, "input g_idx is not supported")
        bits = attr_int(node, "bits", 4)
        if bits not in (2, 4, 8):
            raise Refused(node, f"bits={bits} is not supported")
        self.state.const_input(node, 1, "B")
        self.state.const_input(node, 2, "scales")
        if input_at(node, 3) is not None:
            self.state.const_input(node, 3, "zero_points")

    def replace(self, t, node, a, b, scales):
        bits = attr_int(node, "bits", 4)
        k, n, block = (attr_int(node, name, 0) for name in ("K", "N", "block_size"))
        k_blocks = -(-k // block)
        q = unpack_bits(const(b).reshape(n, k_blocks, -1), bits).reshape(n, -1)[:, :k]
        s = const(scales)
        zps = const(input_at(node, 3))
        if zps is None:
            zp = np.full((n, k_blocks), 1 << (bits - 1), dtype=np.float32)
        elif zps.dtype == np.uint8:
            zp = unpack_bits(zps.reshape(n, -1), bits)[:, :k_blocks].astype(np.float32)
        else:
            zp = zps.reshape(n, k_blocks).astype(np.float32)
        s_full = np.repeat(s.reshape(n, k_blocks).astype(np.float32), block, axis=1)[:, :k]
        zp_full = np.repeat(zp, block, axis=1)[:, :k]
        weight = ((q.astype(np.float32) - zp_full) * s_full).T.astype(s.dtype)
        w = t.constant(np.ascontiguousarray(weight), b)
        return t.matmul_bias(a, w, input_at(node, 5))


class GatherBlockQuantizedRule(FusedOpRule):
    """GatherBlockQuantized(table, ids, scales, zps) -> Gather(float table, ids).

    One difference remains: the contrib op gives zeros for an out-of-range index where
    Gather fails.
    """

    op_type = "GatherBlockQuantized"

    def pattern(self, op, data, ids, scales):
        return self.fused(op, data, ids, scales)

    def validate(self, node):
        super().validate(node)
        dtype = dtype_of(node.inputs[0])
        if dtype not in (DT.INT4, DT.UINT4, DT.UINT8):
            raise Refused(node, f"dtype {dtype.name.lower() if dtype else '?'} is not supported")
        bits = attr_int(node, "bits", 4)
        if bits not in (2, 4, 8):
            raise Refused(node, f"bits={bits} is not supported")
        self.state.const_input(node, 0, "data")
        self.state.const_input(node, 2, "scales")
        if input_at(node, 3) is not None:
            self.state.const_input(node, 3, "zero_points")

    def replace(self, t, node, data, ids, scales):
        dtype, bits = dtype_of(data), attr_int(node, "bits", 4)
        table, s, zps = const(data), const(scales), const(input_at(node, 3))
        if dtype == DT.UINT8 and bits < 8:
            table = unpack_bits(table, bits)
            zps = None if zps is None else unpack_bits(zps, bits)
        rank = table.ndim
        qaxis = attr_int(node, "quantize_axis", 1) % rank
        if zps is None:
            default = (1 << (bits - 1)) if dtype == DT.UINT8 else 0
            zps = np.full(s.shape, default, dtype=np.int64)
        index = [slice(None)] * rank
        index[qaxis] = slice(0, s.shape[qaxis])
        zps = zps[tuple(index)]  # packed zero points may carry padding
        block = attr_int(node, "block_size", 128)
        floats = dequantize_array(table, s, zps, axis=qaxis, block_size=block, out_dtype=s.dtype)
        gaxis = attr_int(node, "gather_axis", 0) % rank
        return t.float_op("Gather", [t.constant(floats, data), ids], {"axis": gaxis})


QLINEAR_BINARY = ("QLinearAdd", "QLinearMul")
QLINEAR_UNARY = (
    "QLinearSigmoid",
    "QLinearLeakyRelu",
    "QLinearGlobalAveragePool",
    "QLinearAveragePool",
)
RULE_CLASSES = (
    QLinearConvRule,
    QLinearMatMulRule,
    QLinearSoftmaxRule,
    QLinearConcatRule,
    QGemmRule,
    MatMulIntegerToFloatRule,
    DynamicQuantizeMatMulRule,
    MatMulNBitsRule,
    GatherBlockQuantizedRule,
)
# (op type, rule class, extra constructor arguments)
_RULES: list[tuple[str, type[FusedOpRule], tuple[str, ...]]] = [
    *((cls.op_type, cls, ()) for cls in RULE_CLASSES),
    *((op, QLinearBinaryRule, (op,)) for op in QLINEAR_BINARY),
    *((op, QLinearUnaryRule, (op,)) for op in QLINEAR_UNARY),
]


def fused_op_rules(
    state: DequantizeState, present: set[tuple[str, str]] | None = None
) -> list[pattern.RewriteRule]:
    """The fused-op rules, in each domain a quantized op is read from.

    With `present` ((domain, op_type) pairs), only the rules for those ops: onnxscript tries
    every rule on every node, which costs more than the rewrite on a graph without them.
    """
    return [
        cls.rule(state, domain, *args)
        for domain in DOMAINS
        for op_type, cls, args in _RULES
        if present is None or (domain, op_type) in present
    ]
