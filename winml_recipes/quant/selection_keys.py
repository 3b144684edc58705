"""A precision choice for the keys a TopK selects by (the scores a detector ranks anchors on).

TopK keeps the k largest keys: its result changes when two keys swap order, whatever their
size. An 8-bit encoding spends its 255 steps on the keys' range widened to hold 0, so keys
that sit together far from 0 (a score head whose bias dominates) fall within a few steps of
each other, and rounding decides the selection. Measured on the tiny RT-DETR of stop 39
(random weights, cpu/int8): its 84 anchor scores lay within 0.0018 of -0.693, 0.7 of one
step; the QDQ model's top-10 anchors agreed with float's 51% of the time (box F1 0.41), and
86% with the score chain kept float (box F1 0.70). The calibrated ranges are widened to
hold 0, so the keys' own spread is measured: the float model runs a few calibration samples
with the chain's quantized tensors tapped (quant/calibration_taps.py, one run shared with
narrow_rows.py). A TopK whose keys span fewer than
MIN_STEPS steps of their 8-bit encoding (on the sample where they span least) has the
nodes that compute them from the last quantized producer (order-keeping or elementwise ops:
a bias Add, a ReduceMax over classes, reshapes) kept float, recorded in the quantize record
as `topk_keys_float`. Keys spread over their encoding (a trained scorer's) are left as they
were. Applied on CPU targets, as narrow_rows.py is (an NPU EP would have to run such nodes
on the CPU).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import onnx

MIN_STEPS = 64.0
# ops a key chain may run through: each output is an elementwise or order-keeping function
# of one computed input (the other inputs constants or broadcast operands)
_CHAIN = frozenset({
    "Add", "Sub", "Mul", "Div", "Neg", "Sigmoid", "ReduceMax", "ReduceMin", "Reshape",
    "Squeeze", "Unsqueeze", "Flatten", "Transpose", "Identity",
})  # fmt: skip


def _chains(model: onnx.ModelProto) -> dict[str, list[tuple[str, str]]]:
    """TopK node -> [(node, its output on the key path)], from the TopK up."""
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    constant = {i.name for i in graph.initializer} | {
        o for n in graph.node if n.op_type == "Constant" for o in n.output
    }
    out: dict[str, list[tuple[str, str]]] = {}
    for topk in (n for n in graph.node if n.op_type == "TopK"):
        chain: list[tuple[str, str]] = []
        tensor = topk.input[0]
        while tensor in producer and producer[tensor].op_type in _CHAIN:
            node = producer[tensor]
            chain.append((node.name, tensor))
            computed = [i for i in node.input if i and i not in constant]
            if len(computed) != 1:
                break  # two computed operands: the chain stops at this node
            tensor = computed[0]
        if chain:
            out[topk.name] = chain
    return out


def key_chains(
    model: onnx.ModelProto, ranges: Mapping[str, tuple[float, float]], activation_type: str
) -> dict[str, list[tuple[str, str]]]:
    """TopK node -> its key chain [(node, tensor), ...], for the chains with a quantized
    tensor to measure; nothing for 16-bit activations."""
    if activation_type.endswith("16"):
        return {}
    return {k: c for k, c in _chains(model).items() if any(t in ranges for _, t in c)}


def tapped(chains: Mapping[str, list[tuple[str, str]]], ranges: Mapping[str, Any]) -> set[str]:
    """The tensors of `chains` whose spread is measured (the quantized ones)."""
    return {t for c in chains.values() for _, t in c if t in ranges}


def selection_keys(
    ranges: Mapping[str, tuple[float, float]],
    chains: Mapping[str, list[tuple[str, str]]],
    values: Iterable[Mapping[str, np.ndarray]],
) -> dict[str, dict[str, Any]]:
    """TopK node -> {keys, span_steps, nodes}: the key chains (`key_chains`) to keep float,
    judged on the float `values` of their tensors per sample."""
    spans: dict[str, float] = {}
    for outputs in values:
        for name in tapped(chains, ranges):
            span = float(np.ptp(np.asarray(outputs[name], np.float64)))
            spans[name] = min(spans.get(name, np.inf), span)
    out: dict[str, dict[str, Any]] = {}
    for topk, chain in chains.items():
        steps = {i: spans[t] / _step(ranges[t]) for i, (_, t) in enumerate(chain) if t in spans}
        narrow = [i for i, s in steps.items() if s < MIN_STEPS]
        if narrow:
            last = max(narrow)
            out[topk] = {
                "keys": chain[last][1],
                "span_steps": round(min(steps[i] for i in narrow), 2),
                "nodes": [node for node, _ in chain[: last + 1] if node],
            }
    return out


def _step(bounds: tuple[float, float]) -> float:
    """One step of the 8-bit encoding of a range (widened to hold 0)."""
    lo, hi = bounds
    return max((max(hi, 0.0) - min(lo, 0.0)) / 255.0, 1e-30)
