"""A precision choice for LayerNormalization inputs whose rows differ in spread.

LayerNormalization divides each row (its normalized axes) by that row's own standard
deviation, so a row's quantization error comes out scaled by 1/std of that row. One 8-bit
encoding per tensor spends its 256 steps on the widest rows; a row much narrower than the
tensor's range is left with a few steps, and after the division its error is as large as
its signal. Measured on the tiny DINOv2 (random weights, cpu/int8): the CLS row of every
LayerNormalization input has std 0.027 against 0.44 for the patch rows, in a range of 1.9
(3.6 steps of the 8-bit encoding), so the pooled CLS embedding came out at cosine 0.897;
the same happens to wav2vec2's silent frames. The input tensors whose narrowest row spans
fewer than MIN_STEPS steps get 16-bit activations (an override, recorded in the quantize
record as `layernorm_rows_16bit`); a model whose rows are all wide enough is left as it
was. Applied on the CPU EP (quantize calls it for cpu targets only: measured there; the
NPU EPs' departures are repaired by quant/repair.py). The row spreads are measured on a few
calibration samples of the float model (quant/calibration_taps.py, one run shared with
selection_keys.py).

A row is lost where its values are first written at 8 bit, so the promotion follows the
input back through ops that only move values (Reshape, Transpose, ...) to the op that
computes them, recorded as `carried_from`. Measured on the tiny GLPN (cpu/int8): a patch
embedding's Conv -> Reshape -> Transpose -> LayerNormalization, dark patches as narrow rows;
with only the Transpose at 16 bit the Conv's 8-bit output had already lost them (depth
AbsRel worst 0.63), with the Conv and Reshape too 0.057.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import onnx

# A row spanning k steps (std / step) keeps about 20*log10(k) + 10.8 dB after the
# LayerNormalization's division; 8 steps is 28.8 dB, the level the w8a16 presets gate at.
MIN_STEPS = 8.0
# ops whose output holds their first input's values, moved: a row's precision is set where
# the values were computed, before these
MOVES = frozenset({"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Identity"})


def _ln_inputs(model: onnx.ModelProto, activations: Iterable[str]) -> dict[str, int]:
    """Quantized LayerNormalization inputs -> their normalization axis."""
    acts = set(activations)
    out: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type != "LayerNormalization" or node.input[0] not in acts:
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), -1)
        out[node.input[0]] = int(axis)
    return out


def carried_from(model: onnx.ModelProto, tensor: str, activations: Iterable[str]) -> list[str]:
    """The quantized tensors `tensor`'s values pass through unchanged, nearest first: back
    through MOVES ops to the output of the op that computed them."""
    acts = set(activations)
    producer = {o: n for n in model.graph.node for o in n.output}
    chain: list[str] = []
    node = producer.get(tensor)
    while node is not None and node.op_type in MOVES and node.input[0] in acts:
        if node.input[0] in chain:
            break
        chain.append(node.input[0])
        node = producer.get(node.input[0])
    return chain


def promoted(chosen: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Every tensor a `narrow_rows` result sets to 16 bit: the inputs and what they carry."""
    out = [t for name, row in chosen.items() for t in (name, *row.get("carried_from", ()))]
    return list(dict.fromkeys(out))


def candidates(
    model: onnx.ModelProto, ranges: Mapping[str, tuple[float, float]], activation_type: str
) -> dict[str, int]:
    """The quantized LayerNormalization inputs to measure -> their normalization axis;
    nothing for 16-bit activations."""
    if activation_type.endswith("16"):
        return {}
    return {t: a for t, a in _ln_inputs(model, ranges).items() if t in ranges}


def narrow_rows(
    model: onnx.ModelProto,
    ranges: Mapping[str, tuple[float, float]],
    inputs: Mapping[str, int],
    values: Iterable[Mapping[str, np.ndarray]],
) -> dict[str, dict[str, Any]]:
    """The LayerNormalization inputs (`candidates`) to keep at 16 bit, judged on their float
    `values` per sample: tensor -> {narrowest row std, steps it spans at 8 bit, the median
    row's steps, and `carried_from` where the values come unchanged from earlier tensors}."""
    seen: dict[str, list[np.ndarray]] = {t: [] for t in inputs}
    for outputs in values:
        for name in inputs:
            value = np.asarray(outputs[name], np.float64)
            axis = inputs[name] % value.ndim
            rows = value.reshape(int(np.prod(value.shape[:axis])), -1)
            seen[name].append(rows.std(axis=1))
    out: dict[str, dict[str, Any]] = {}
    for name, stds in seen.items():
        if not stds:
            continue
        lo, hi = ranges[name]
        step = (max(hi, 0.0) - min(lo, 0.0)) / 255.0
        if step <= 0:
            continue
        spreads = np.concatenate(stds)
        narrowest = float(spreads.min())
        if narrowest / step < MIN_STEPS:
            out[name] = {
                "narrowest_row_std": round(narrowest, 6),
                "steps_at_8_bit": round(narrowest / step, 2),
                "median_row_steps": round(float(np.median(spreads)) / step, 2),
            }
            chain = carried_from(model, name, ranges)
            if chain:
                out[name]["carried_from"] = chain
    return out
