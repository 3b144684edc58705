"""onnx_ir helpers shared by the float rewrites (CLE, SmoothQuant): a linear layer's weight
and bias, how to read and replace a constant, and positively homogeneous ops."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

# f(s * x) = s * f(x) for s > 0, per channel: a per-channel positive scale passes through.
HOMOGENEOUS = frozenset({"Relu", "LeakyRelu", "PRelu", "MaxPool", "Identity", "Dropout"})


def const(value: ir.Value | None) -> np.ndarray | None:
    if value is None or value.const_value is None:
        return None
    return value.const_value.numpy()


def only_user(value: ir.Value) -> bool:
    """A constant read by one node input only (rescaling it changes nothing else)."""
    return len(value.uses()) == 1 and not value.is_graph_output()


def set_const(value: ir.Value, array: np.ndarray) -> None:
    old = value.const_value
    assert old is not None
    value.const_value = ir.tensor(array.astype(old.numpy().dtype), name=value.name)


@dataclass
class Linear:
    """A Conv (group 1) / Gemm / MatMul with a constant weight read by it alone."""

    node: ir.Node
    weight: ir.Value
    bias: ir.Value | None  # Conv B / Gemm C, or the constant of the Add after a MatMul
    out: ir.Value  # the output after the bias
    out_axis: int  # output-channel axis of the weight
    in_axis: int  # input-channel axis of the weight


def linear(node: ir.Node) -> Linear | None:
    if node.op_type not in ("Conv", "Gemm", "MatMul") or node.domain not in ("", "ai.onnx"):
        return None
    if len(node.inputs) < 2 or node.inputs[1] is None or const(node.inputs[1]) is None:
        return None
    w = node.inputs[1]
    if not only_user(w) or const(node.inputs[0]) is not None:
        return None
    ndim = len(w.const_value.shape)
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    out = node.outputs[0]
    if node.op_type == "Conv":
        if node.attributes.get_int("group", 1) != 1:
            return None
        out_axis, in_axis = 0, 1
    else:
        if ndim != 2 or node.attributes.get_int("transA", 0):
            return None
        if node.op_type == "Gemm":
            trans = node.attributes.get_int("transB", 0)
            out_axis, in_axis = (0, 1) if trans else (1, 0)
            if node.attributes.get_float("alpha", 1.0) <= 0:
                return None
        else:
            out_axis, in_axis = 1, 0
            users = out.uses()
            if len(users) == 1 and users[0].node.op_type == "Add" and not out.is_graph_output():
                add = users[0].node
                other = add.inputs[1 - users[0].idx]
                c = const(other)
                n = w.const_value.shape[1]
                if c is not None and c.shape in ((n,),) and only_user(other):
                    bias, out = other, add.outputs[0]
    if bias is not None and (const(bias) is None or not only_user(bias) or const(bias).ndim != 1):
        return None
    return Linear(node, w, bias, out, out_axis, in_axis)


def channel_shape(ndim: int, axis: int, n: int) -> list[int]:
    shape = [1] * ndim
    shape[axis] = n
    return shape


def scale_out(layer: Linear, s: np.ndarray) -> None:
    """Output channels divided by s (weight and bias)."""
    w = const(layer.weight)
    set_const(layer.weight, w / s.reshape(channel_shape(w.ndim, layer.out_axis, -1)))
    if layer.bias is not None:
        set_const(layer.bias, const(layer.bias) / s)


def scale_in(layer: Linear, s: np.ndarray) -> None:
    """Input channels multiplied by s."""
    w = const(layer.weight)
    set_const(layer.weight, w * s.reshape(channel_shape(w.ndim, layer.in_axis, -1)))
