"""SeqMSE-style weight ranges: per layer, the weight range (a fraction of min/max, per
channel where the weight is quantized per channel) that minimises the layer's output error
on the calibration inputs. The chosen range reaches onnxruntime's quantizer as a clipped
weight (its min/max of the clipped weight is that range), so its own quantizer still
writes every scale and zero point."""

from __future__ import annotations

import numpy as np

from winml_recipes.quant.algorithms.layers import (
    Layer,
    LayerRunner,
    WeightQuant,
    clip_to_ratio,
    fake_quant,
    per_channel,
)

# The candidate fractions of the min/max range.
GRID = tuple(float(r) for r in np.round(np.linspace(0.4, 1.0, 25), 4))


def choose_ratio(
    layer: Layer,
    w: np.ndarray,
    spec: WeightQuant,
    inputs: list[np.ndarray],
    run: LayerRunner,
) -> tuple[np.ndarray, float, float]:
    """(ratio per channel, or one, the output error before and after: sum of squares)."""
    errors = []
    for r in GRID:
        delta = fake_quant(w, spec, r) - w
        err = sum(per_channel(run(x, delta) ** 2, layer.output_axis) for x in inputs)
        errors.append(err)
    table = np.stack(errors)  # [grid, channels]
    if spec.axis is None:
        best = int(np.argmin(table.sum(1)))
        ratio = np.asarray(GRID[best])
        after = float(table[best].sum())
    else:
        picks = np.argmin(table, axis=0)
        ratio = np.asarray(GRID, np.float64)[picks]
        after = float(table[picks, np.arange(table.shape[1])].sum())
    return ratio, float(table[-1].sum()), after


def apply(w: np.ndarray, spec: WeightQuant, ratio: np.ndarray) -> np.ndarray:
    return clip_to_ratio(w, spec, ratio)
