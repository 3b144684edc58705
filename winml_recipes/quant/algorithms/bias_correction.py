"""Bias correction: each quantized weight layer shifts its output's mean by
E[op(x, W_q)] - E[op(x, W)] per output channel (W_q as onnxruntime wrote it); the bias
takes the opposite shift. The expectation is over the calibration inputs and every output
position, so a Conv's padding is accounted for (it is the op itself that runs)."""

from __future__ import annotations

import numpy as np

from winml_recipes.quant.algorithms.layers import Layer, LayerRunner, per_channel


def output_shift(
    layer: Layer, w: np.ndarray, w_q: np.ndarray, inputs: list[np.ndarray], run: LayerRunner
) -> np.ndarray:
    """E[op(x, W_q - W)] per output channel over the samples and positions."""
    delta = (w_q - w).astype(np.float32)
    total, count = None, 0
    for x in inputs:
        y = run(x, delta)
        s = per_channel(y, layer.output_axis)
        total = s if total is None else total + s
        count += y.size // y.shape[layer.output_axis]
    assert total is not None
    return (total / max(count, 1)).astype(np.float32)
