"""Cross-layer equalization (Nagel et al., 2019) as an onnx_ir pass.

For two linear layers (Conv/Conv, Conv/Gemm, MatMul/MatMul, ...) joined by positively
homogeneous ops (ReLU, LeakyReLU, PReLU, MaxPool), output channel i of the first is divided
by s_i and input channel i of the second multiplied by it, with s_i = sqrt(r1_i / r2_i)
(r: the channel's largest |weight|) rounded to a power of two, so both layers' channel
ranges become sqrt(r1_i r2_i) within a factor sqrt(2).
Exact in float (f(x / s) = f(x) / s for s > 0); per-channel quantization of the first
layer no longer wastes steps on small channels of the second."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from winml_recipes.quant.algorithms.graphs import (
    HOMOGENEOUS,
    Linear,
    const,
    linear,
    scale_in,
    scale_out,
)

SWEEPS = 3  # chains of layers converge in a few passes
S_BOUNDS = (1e-4, 1e4)


def _pairs(graph: ir.Graph) -> list[tuple[Linear, Linear, list[str]]]:
    found = []
    for node in graph:
        first = linear(node)
        if first is None:
            continue
        value, through = first.out, []
        while True:
            uses = value.uses()
            if len(uses) != 1 or value.is_graph_output():
                break
            nxt = uses[0].node
            if nxt.op_type in HOMOGENEOUS and uses[0].idx == 0:
                through.append(nxt.op_type)
                value = nxt.outputs[0]
                continue
            second = linear(nxt) if uses[0].idx == 0 else None
            if second is not None:
                found.append((first, second, through))
            break
    return found


def _ranges(layer: Linear, axis: int) -> np.ndarray:
    w = np.abs(const(layer.weight))
    return np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1).max(1)


class EqualizeLayers(ir.passes.InPlacePass):
    """Equalize every matching pair; `self.record` says which and by how much."""

    def __init__(self) -> None:
        super().__init__()
        self.record: list[dict] = []

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        done: dict[str, dict] = {}
        for _ in range(SWEEPS):
            for first, second, through in _pairs(model.graph):
                r1 = _ranges(first, first.out_axis)
                r2 = _ranges(second, second.in_axis)
                if r1.shape != r2.shape:
                    continue
                with np.errstate(divide="ignore", invalid="ignore"):
                    s = np.sqrt(r1 / r2)
                s = np.where(np.isfinite(s) & (r1 > 0) & (r2 > 0), s, 1.0)
                s = _power_of_two(np.clip(s, *S_BOUNDS))
                key = f"{first.node.name}->{second.node.name}"
                entry = done.setdefault(key, {
                    "pair": [first.node.name, second.node.name],
                    "through": through,
                    "spread_before": _spread(r1, r2),
                })  # fmt: skip
                scale_out(first, s)
                scale_in(second, s)
                entry["spread_after"] = _spread(
                    _ranges(first, first.out_axis), _ranges(second, second.in_axis)
                )
        self.record = list(done.values())
        return ir.passes.PassResult(model, modified=bool(done))


def _power_of_two(s: np.ndarray) -> np.ndarray:
    """`s` rounded to powers of two (within sqrt(2) of it): dividing and multiplying by
    them is exact in float, so the rewrite is bit-exact. Other scales round each weight,
    and a model with steep outputs (PP-OCR's text detector: a sigmoid map) moved by 0.5-1%
    of its range under every pair, over the exactness check's 0.1%."""
    return np.exp2(np.round(np.log2(s))).astype(np.float32)


def _spread(r1: np.ndarray, r2: np.ndarray) -> list[float]:
    """max/min of the channel ranges of each layer (1 = every channel alike)."""

    def one(r):
        r = r[r > 0]
        return round(float(r.max() / r.min()), 2) if r.size else 1.0

    return [one(r1), one(r2)]


def equalize(model: ir.Model) -> list[dict]:
    """Equalize `model` in place; what changed."""
    p = EqualizeLayers()
    p(model)
    return p.record
