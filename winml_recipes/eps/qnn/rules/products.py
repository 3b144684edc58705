"""Power-of-two rescale of tiny operands of an activation x activation MatMul, chosen from
calibrated ranges (run on the float model after calibration, before QDQ insertion).

Measured on the HTP backend (onnxruntime-qnn 2.7, emulated on x86_64), not documented by
it: a MatMul of two 16-bit activations loses an operand's values far below 1e-3, whatever
its encoding, as if the product were formed in half precision. `Softmax(a) @ (v * d)` in
w8a16 against float (CPU simulation 34.3 dB for every d): HTP 33.8 dB at d = 1e-4, 33.5 at
1e-5, 18.8 at 1e-6, 0.9 at 1e-7, -10.2 at 1e-9 (experiments/htp_tiny_products.py, with
onnxruntime's quantizer directly).
Multiplying the operand by a constant, and an elementwise Mul of two activations
(`x * sigmoid(x)` at 1e-11), HTP computes right (46.0 dB, as simulated).

So a MatMul operand whose calibrated peak is below `TINY_PEAK` is multiplied by 2^k (its
peak then lands in [0.5, 1)) and the product by 2^-k after, both by constant Muls: exact in
float (powers of two), and each new tensor's range is the old one times the same power, so
its 16-bit grid is the same one scaled. With it the same graph gives 33.8 dB on HTP at
d = 1e-6, 1e-7 and 1e-9. A trained model's attention runs at O(1) and is left alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

# An operand peak below this is rescaled (HTP's loss starts near 4e-5, the peak at d = 1e-5;
# the margin costs two exact Muls where it is not needed).
TINY_PEAK = 2.0**-6
PRODUCT_OPS = frozenset({"MatMul"})
# 2^k stays a normal float32 with room for the product's range (ranges are floored at 1e-12).
MAX_EXPONENT = 64


def _exponent(peak: float) -> int:
    """k with peak * 2^k in [0.5, 1)."""
    return min(-math.frexp(peak)[1], MAX_EXPONENT)


def rescale_tiny_products(
    model: onnx.ModelProto, ranges: Mapping[str, tuple[float, float]]
) -> tuple[dict[str, tuple[float, float]], dict[str, int]]:
    """Rewrite `model`'s main graph in place: every MatMul of two calibrated activations
    whose operand peak is below TINY_PEAK reads that operand times 2^k and writes its product
    times 2^-k. Returns the ranges with the new tensors' and {node name: total exponent}."""
    graph = model.graph
    constants = {i.name for i in graph.initializer}
    constants |= {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    out = dict(ranges)
    done: dict[str, int] = {}
    nodes: list[onnx.NodeProto] = []
    for index, node in enumerate(graph.node):
        if node.op_type not in PRODUCT_OPS or node.domain not in ("", "ai.onnx"):
            nodes.append(node)
            continue
        operands = list(node.input[:2])
        if any(t in constants or t not in ranges for t in operands) or node.output[0] not in ranges:
            nodes.append(node)
            continue
        name = node.name or f"{node.op_type}_{index}"
        total, before = 0, []
        for position, tensor in enumerate(operands):
            lo, hi = ranges[tensor]
            peak = max(abs(lo), abs(hi))
            if not 0.0 < peak < TINY_PEAK:
                continue
            k = _exponent(peak)
            scaled = f"{tensor}_times_2_{k}_{name}"
            factor = f"{name}_rescale_in{position}"
            graph.initializer.append(numpy_helper.from_array(np.float32(2.0**k), factor))
            before.append(helper.make_node("Mul", [tensor, factor], [scaled], name=factor))
            out[scaled] = (lo * 2.0**k, hi * 2.0**k)
            node.input[position] = scaled
            total += k
        nodes.extend(before)
        nodes.append(node)
        if total:
            product = node.output[0]
            lo, hi = ranges[product]
            wide = f"{product}_times_2_{total}"
            factor = f"{name}_rescale_out"
            graph.initializer.append(numpy_helper.from_array(np.float32(2.0**-total), factor))
            node.output[0] = wide
            out[wide] = (lo * 2.0**total, hi * 2.0**total)
            nodes.append(helper.make_node("Mul", [wide, factor], [product], name=factor))
            done[name] = total
    if done:
        del graph.node[:]
        graph.node.extend(nodes)
    return out, done
