"""Per-channel weight scales of dead channels, evened out (exact).

A weight channel that is all zeros (or so small that it quantizes to its zero point: PP-OCR
recognizers carry channels of 1e-39) gets the quantizer's floor scale, e.g. 7.8e-7 beside
live channels at 6e-3. The CPU EP is right with it (it simulates Q/DQ in float); the
Hexagon NPU's EP is not: PP-OCRv4's recognizer `p2o.Conv.12` (1x1, 240 output channels,
two of them zero), quantized w8a16 alone with its trained weights, came out at -7.2 dB
against the CPU EP, the two dead channels at -zero_point x scale (2.96 off) where 0 is
right. (In the whole recognizer the next layer scales those channels by about zero, so its
outputs hid it; `compare` showed the layer at -0.9 dB on the target vs 28.8 simulated.)
Giving those channels the median of the live channels' scales made the same layer right
(39.6 dB in a build, 48.3 dB on the recognizer's own unit).

The rewrite is exact: every quantized value of a dead channel is its zero point, so it
dequantizes to 0 at any scale. A bias quantized against that scale (int32, scale =
input scale x weight scale) is re-expressed at the new one: its value is re-rounded at the
resolution the live channels' biases have.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

# Ops whose per-channel weight (input 1) has a per-channel int32 bias (input 2).
_WITH_BIAS = {"Conv", "ConvTranspose", "Gemm"}


def even_out_dead_channels(model: onnx.ModelProto) -> list[dict[str, Any]]:
    """Rewrite `model` in place; one record per weight changed ({weight, channels})."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    changed: list[dict[str, Any]] = []
    for node in graph.node:
        if node.op_type not in _WITH_BIAS and node.op_type != "MatMul":
            continue
        if len(node.input) < 2:
            continue
        dq = producer.get(node.input[1])
        found = _per_channel_weight(dq, inits)
        if found is None:
            continue
        q, scale, zp, axis = found
        moved = np.moveaxis(q, axis, 0).reshape(q.shape[axis], -1).astype(np.int64)
        dead = np.all(moved == zp.astype(np.int64)[:, None], axis=1)
        if not dead.any() or dead.all():
            continue
        new_scale = scale.copy()
        new_scale[dead] = np.median(scale[~dead])
        if np.array_equal(new_scale, scale):
            continue
        inits[dq.input[1]].CopyFrom(numpy_helper.from_array(new_scale, dq.input[1]))
        if node.op_type in _WITH_BIAS and len(node.input) > 2:
            _rescale_bias(producer.get(node.input[2]), inits, new_scale / scale)
        changed.append({"weight": dq.input[0], "channels": np.flatnonzero(dead).tolist()})
    return changed


def _per_channel_weight(dq: onnx.NodeProto | None, inits: dict[str, onnx.TensorProto]):
    """(quantized weight, scale, zero point, axis) of a per-channel constant DQ, else None."""
    if dq is None or dq.op_type != "DequantizeLinear" or len(dq.input) < 3:
        return None
    if any(name not in inits for name in dq.input[:3]):
        return None
    scale = numpy_helper.to_array(inits[dq.input[1]])
    if scale.ndim != 1 or scale.size < 2:
        return None
    q = numpy_helper.to_array(inits[dq.input[0]])
    zp = numpy_helper.to_array(inits[dq.input[2]])
    axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
    axis = axis % q.ndim
    if q.shape[axis] != scale.size or zp.shape != scale.shape:
        return None
    return q, scale, zp, axis


def _rescale_bias(
    dq: onnx.NodeProto | None, inits: dict[str, onnx.TensorProto], ratio: np.ndarray
) -> None:
    """A per-channel int32 bias DQ whose scale followed the weight's: scale x ratio, its
    integers re-rounded to keep the value."""
    if dq is None or dq.op_type != "DequantizeLinear" or any(n not in inits for n in dq.input[:2]):
        return
    q = numpy_helper.to_array(inits[dq.input[0]])
    scale = numpy_helper.to_array(inits[dq.input[1]])
    if q.dtype != np.int32 or scale.shape != ratio.shape or q.shape != ratio.shape:
        return
    new_scale = (scale.astype(np.float64) * ratio).astype(np.float32)
    value = q.astype(np.float64) * scale.astype(np.float64)
    limit = np.iinfo(np.int32)
    new_q = np.clip(np.round(value / new_scale), limit.min, limit.max).astype(np.int32)
    inits[dq.input[0]].CopyFrom(numpy_helper.from_array(new_q, dq.input[0]))
    inits[dq.input[1]].CopyFrom(numpy_helper.from_array(new_scale, dq.input[1]))
