"""SmoothQuant (Xiao et al., 2023) as onnx_ir rewrites: an activation X read only by
MatMul/Gemm layers, with outlier channels, is divided per channel by
s_j = max|X_j|^alpha / max|W_j|^(1-alpha) and the layers' input rows multiplied by s_j.
The division is folded into what made X (a LayerNormalization's scale and bias, a Mul by
a constant, a previous linear layer's output channels, through Adds of constants), or, when
nothing can take it, becomes one Mul node. Exact in float."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial

import numpy as np
import onnx_ir as ir

from winml_recipes.quant.algorithms.graphs import (
    HOMOGENEOUS,
    Linear,
    const,
    linear,
    only_user,
    scale_in,
    scale_out,
    set_const,
)

ALPHA = 0.5
# An activation is smoothed when its largest channel range is this many times its median.
OUTLIER_RATIO = 6.0
S_BOUNDS = (1e-5, 1e5)


def sites(model: ir.Model) -> dict[str, list[Linear]]:
    """Activation name -> the MatMul/Gemm layers reading it (all its readers are such)."""
    found: dict[str, list[Linear]] = {}
    for value in _values(model.graph):
        if value.is_graph_output() or value.is_graph_input() or value.const_value is not None:
            continue
        uses = value.uses()
        if not uses or any(u.idx != 0 for u in uses):
            continue
        layers = [linear(u.node) for u in uses]
        if all(la is not None and la.node.op_type != "Conv" and la.in_axis == (
                1 if la.node.attributes.get_int("transB", 0) else 0) for la in layers):  # fmt: skip
            found[value.name] = layers  # type: ignore[assignment]
    return found


def _rows(layer: Linear) -> np.ndarray:
    """max |W| per input channel."""
    w = np.abs(np.moveaxis(const(layer.weight), layer.in_axis, 0))
    return w.reshape(w.shape[0], -1).max(1)


def _values(graph: ir.Graph):
    seen = set()
    for node in graph:
        for v in node.outputs:
            if v.name not in seen:
                seen.add(v.name)
                yield v


def _channels(layer: Linear) -> int:
    return const(layer.weight).shape[layer.in_axis]


def _fold(value: ir.Value, s: np.ndarray) -> str | None:
    """Divide `value` by s (last axis) upstream: how, or None (then nothing changed)."""
    adds: list[ir.Value] = []  # constants of Adds on the way (divided too)
    through: list[str] = []  # positively homogeneous ops passed through
    v = value
    while True:
        node = v.producer()
        if node is None or (v is not value and len(v.uses()) != 1):
            return None
        k = next((i for i, x in enumerate(node.inputs) if const(x) is not None), None)
        if node.op_type == "Add" and k is not None and _per_channel(node.inputs[k], len(s)):
            other = node.inputs[1 - k]
            prev = other.producer()
            lin = linear(prev) if prev is not None else None
            if lin is not None and lin.out is v:  # a MatMul and its bias
                return _done(adds, s, partial(scale_out, lin, s), f"{lin.node.name} output",
                             through)  # fmt: skip
            adds.append(node.inputs[k])
            v = other
            continue
        if node.op_type == "Mul" and k is not None and _per_channel(node.inputs[k], len(s)):
            c = node.inputs[k]
            return _done(adds, s, partial(_divide, c, s), f"{node.name} constant")
        if node.op_type == "LayerNormalization" and node.attributes.get_int("axis", -1) == -1:
            ln = [x for x in node.inputs[1:] if x is not None]
            if all(_per_channel(x, len(s)) for x in ln):
                return _done(adds, s, partial(_divide_all, ln, s), f"{node.name} scale and bias")
            return None
        if node.op_type in HOMOGENEOUS and node.inputs[0] is not None:  # f(x/s) = f(x)/s
            through.append(node.name)
            v = node.inputs[0]
            continue
        lin = linear(node)
        if lin is not None and lin.out is v and node.op_type == "Gemm":
            return _done(adds, s, partial(scale_out, lin, s), f"{node.name} output", through)
        return None


def _done(
    adds: list[ir.Value], s: np.ndarray, fold, where: str, through: list[str] | None = None
) -> str:
    for c in adds:
        _divide(c, s)
    fold()
    return " via ".join([where, *(c.name for c in adds), *(through or [])])


def _divide_all(values: list[ir.Value], s: np.ndarray) -> None:
    for v in values:
        _divide(v, s)


def _per_channel(value: ir.Value | None, n: int) -> bool:
    c = const(value)
    if c is None or not only_user(value):
        return False
    return c.size == 1 or (c.shape[-1] == n and c.size == n)


def _divide(value: ir.Value, s: np.ndarray) -> None:
    c = const(value)
    if c.size == 1:
        set_const(value, np.full(len(s), c.reshape(()), c.dtype) / s)
    else:
        set_const(value, (c.reshape(-1) / s).reshape(c.shape))


def _insert_mul(graph: ir.Graph, value: ir.Value, s: np.ndarray) -> None:
    users = list(value.uses())  # before the Mul reads it too
    scale = ir.tensor((1.0 / s).astype(value.dtype.numpy() if value.dtype else np.float32))
    inv = ir.Value(
        name=f"{value.name}_smooth_scale",
        shape=ir.Shape(scale.shape),
        type=ir.TensorType(scale.dtype),
        const_value=scale,
    )
    graph.register_initializer(inv)
    mul = ir.Node("", "Mul", [value, inv], name=f"{value.name}_smooth")
    mul.outputs[0].name = f"{value.name}_smoothed"
    if value.dtype is not None:
        mul.outputs[0].dtype = value.dtype
        mul.outputs[0].shape = value.shape
    graph.insert_after(value.producer(), mul)
    for use in users:
        use.node.replace_input_with(use.idx, mul.outputs[0])


def smooth(
    model: ir.Model,
    amax: Mapping[str, np.ndarray],
    alpha: float = ALPHA,
    outlier_ratio: float = OUTLIER_RATIO,
) -> list[dict]:
    """Smooth every site with outlier channels (max|X| per channel in `amax`); the record."""
    record = []
    found = sites(model)
    for name, layers in found.items():
        a = amax.get(name)
        if a is None or a.shape != (_channels(layers[0]),):
            continue
        positive = a[a > 0]
        if positive.size == 0:
            continue
        ratio = float(a.max() / np.median(positive))
        if ratio < outlier_ratio:
            continue
        wmax = np.max([_rows(la) for la in layers], 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            s = a**alpha / wmax ** (1 - alpha)
        s = np.where(np.isfinite(s) & (a > 0) & (wmax > 0), s, 1.0)
        s = np.clip(s, *S_BOUNDS).astype(np.float32)
        value = next(v for v in _values(model.graph) if v.name == name)
        how = _fold(value, s)
        if how is None:
            _insert_mul(model.graph, value, s)
            how = "inserted Mul"
        for la in layers:
            scale_in(la, s)
        after = a / s
        record.append({
            "activation": name,
            "readers": [la.node.name for la in layers],
            "outlier_ratio_before": round(ratio, 2),
            "outlier_ratio_after": round(float(after.max() / np.median(after[after > 0])), 2),
            "folded_into": how,
        })  # fmt: skip
    return record
