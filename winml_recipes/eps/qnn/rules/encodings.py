"""Shared-encoding and range rules the QNN HTP backend needs beyond onnxruntime's
`get_qnn_qdq_config`. They read the float graph and return calibration ranges (they rewrite
no graph, so they are functions of the graph rather than rewrite rules).

Measured on the HTP backend (onnxruntime-qnn 2.7, QNN SDK 2.51), not documented by it:
`ScatterElements` writes the update's *integer* values into the data
tensor, reinterpreted with the data's encoding. onnxruntime's quantizer gives data,
updates and output their own scale/zero point, which is right on the CPU EP (it simulates
Q/DQ in float) and wrong on the NPU: in SAM 3's prompt encoder (`coords[..., 0] = ...`)
the scattered coordinates came out as 87.8 where 0.81 was right, and the masks as noise
(-5 dB). Giving those tensors one shared range, hence one scale/zero point, makes the
same graph right on HTP. (`ScatterND` quantized the same way does not even finalize on
HTP in a five-node graph, so no rule for it is claimed here.)

onnxruntime's QDQ quantizer gives the output of a data-movement op (Reshape, Unsqueeze,
Gather, ...) the encoding of its input, so the unified set follows those links upstream:
the updates of a scatter are often an Unsqueeze of the tensor whose range sets their
scale. The ranges are unified before onnxruntime's quantizer sees them (through the
calibration cache), so its own QDQ insertion produces the shared encoding; nothing is edited
after.

At 8 bits, a `Concat` reads an input that is another Concat's output reshaped (through
Reshape, Transpose, ...) in its own *output's* encoding, without requantizing: in ddddocr's
YOLOX detector each of the three heads concatenates its box, objectness and class maps,
the three are reshaped and joined, and the stride-32 head's background objectness came out
as (61 - 90) * 0.016 = -0.465 (box F1 0.06 at npu/uint8; the CPU simulation 0.97). In
three-branch graphs (producer -> shape op -> Concat, branch ranges 1:8:64) only a Concat
producer is wrong: Conv, Add or Mul outputs through a Reshape or Transpose, and a Concat
read directly, are right at 8 bits, and every case is right at 16 bits. Such an input
shares the outer Concat's encoding, back through the shape-only ops to the inner Concat's
output (which HTP requantizes its own inputs into). Giving *every* Concat input the output's
range (Slice- or MaxPool-fed ones too), or a requantize before each input, fails to finalize
on HTP (QNN_COMMON_ERROR_MEM_ALLOC).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import onnx

# unify_ranges: here too, where eps/qnn/quant.py and tests/htp_replay.py look it up
from winml_recipes.sdk.ranges import TiedTensors, unify_ranges  # noqa: F401

# op type -> input positions that must share the output's encoding on HTP.
SHARED_ENCODING_INPUTS: dict[str, tuple[int, ...]] = {
    "ScatterElements": (0, 2),
    # onnxruntime's quantizer leaves Identity out of its registry, so its input and output
    # may get different encodings; HTP passes the integers through without requantizing
    # (SAM 3's decoder broke where an Identity joined a widened scatter group to the rest).
    "Identity": (0,),
}


# Ops whose output onnxruntime's QDQ quantizer encodes like input 0
# (quantize_output_same_as_input in onnxruntime.quantization.operators).
SAME_AS_INPUT = frozenset(
    {
        "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Slice", "TopK",
        "AveragePool", "MaxPool", "Resize", "Pad", "Gather", "GatherElements", "Split",
    }
)  # fmt: skip


# Ops that change a tensor's shape only (onnxruntime's quantizer encodes their output like
# their input).
SHAPE_ONLY = frozenset({"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze"})
# Producers whose output, reaching a Concat through SHAPE_ONLY ops, HTP reads in that
# Concat's output encoding (measured: Concat; not Conv, Add, Mul). Each sets its output's
# encoding from the output's own range and requantizes into it, so that range can be set.
READ_AS_CONCAT_OUTPUT = frozenset({"Concat"})


def concat_inputs_through_shapes(
    node: onnx.NodeProto, producer: Mapping[str, onnx.NodeProto]
) -> list[str]:
    """The inputs of a Concat that reach it through at least one shape-only op from an op
    in READ_AS_CONCAT_OUTPUT (those must share the Concat output's encoding on HTP)."""
    found = []
    for name in node.input:
        up, hops = producer.get(name), 0
        while up is not None and up.op_type in SHAPE_ONLY and up.input:
            up, hops = producer.get(up.input[0]), hops + 1
        if hops and up is not None and up.op_type in READ_AS_CONCAT_OUTPUT:
            found.append(name)
    return found


def shared_encoding_groups(model: onnx.ModelProto, activations: Iterable[str]) -> list[list[str]]:
    """Sets of activations that must end up with one encoding (transitively merged)."""
    acts = set(activations)
    tied = TiedTensors()

    def union(members: list[str]) -> None:
        tied.tie([t for t in members if t in acts])

    needs: set[str] = set()
    producer = {o: n for n in model.graph.node for o in n.output}
    for node in model.graph.node:
        positions = SHARED_ENCODING_INPUTS.get(node.op_type)
        if positions is not None:
            members = [node.input[i] for i in positions if i < len(node.input)]
            union([*members, node.output[0]])
            needs.add(node.output[0])
        elif node.op_type == "Concat":
            # the shape-only ops between input and producer join through SAME_AS_INPUT
            members = concat_inputs_through_shapes(node, producer)
            if members:
                union([*members, node.output[0]])
                needs.add(node.output[0])
        elif node.op_type in SAME_AS_INPUT and node.input:
            for out in node.output:
                union([node.input[0], out])
    return [g for g in tied.groups() if needs.intersection(g)]


# HTP's 16-bit Softmax is wrong when its input's quantization step is below 2^-18 / log2(e)
# (the step seen in base 2): the output keeps summing to 1 but is off by up to 0.05, as if
# the step rounded to zero (measured with Q -> Softmax -> Q on uniform inputs of span
# 0.172: 16 dB against the CPU EP; span 0.174: 73 dB). Nearly uniform attention (a model
# with small logits, as SAM 3's two-way transformer) has such spans. Widening the input's
# range to a span of at least 65535 steps of that size is exact enough (a step of 2.6e-6
# in the logits) and keeps HTP right; 8-bit inputs then lose nothing that their 8-bit
# output could show.
SOFTMAX_MIN_INPUT_SPAN = 65535 * 2.0**-18 / math.log2(math.e) * 1.01


def widen_softmax_inputs(
    model: onnx.ModelProto, ranges: Mapping[str, tuple[float, float]]
) -> tuple[dict[str, tuple[float, float]], list[str]]:
    """Ranges with every Softmax input spanning at least SOFTMAX_MIN_INPUT_SPAN (and the
    tensors that share its encoding upstream), and the names widened."""
    producer = {o: n for n in model.graph.node for o in n.output}
    out = dict(ranges)
    widened: list[str] = []
    for node in model.graph.node:
        if node.op_type != "Softmax" or not node.input:
            continue
        tensor = node.input[0]
        chain = [tensor]
        while (up := producer.get(chain[-1])) is not None and up.op_type in SAME_AS_INPUT:
            chain.append(up.input[0])  # onnxruntime encodes these outputs like input 0
        for name in chain:
            if name not in out:
                continue
            low, high = min(out[name][0], 0.0), max(out[name][1], 0.0)
            grow = SOFTMAX_MIN_INPUT_SPAN - (high - low)
            if grow > 0:
                out[name] = (low - grow / 2, high + grow / 2)
                widened.append(name)
    return out, list(dict.fromkeys(widened))


# HTP cannot finalize (QNN_COMMON_ERROR_MEM_ALLOC) a 16-bit Add whose input's scale is more
# than 2^13 times its output's: measured by changing only the output's scale of one Add,
# ratio 8191 finalizes and 8193 does not. An Add whose inputs cancel on every calibration
# sample has such an output range (an attention mask `cond * 32 + -32` calibrated on
# unpadded inputs only: 0 every time, so onnxruntime's minimum range of 1e-4). Its range
# is widened to 1/8192 of its widest input's; the values seen are kept exactly as well.
ADD_MAX_SCALE_RATIO = 8192.0


def widen_add_outputs(
    model: onnx.ModelProto, ranges: Mapping[str, tuple[float, float]]
) -> tuple[dict[str, tuple[float, float]], list[str]]:
    """Ranges with every Add/Sub output spanning at least 1/ADD_MAX_SCALE_RATIO of its
    widest input (calibrated, or a constant's values), and the names widened."""
    import numpy as np

    out = dict(ranges)
    widened: list[str] = []

    def span(name: str) -> float | None:
        if name in out:
            low, high = out[name]
            return max(high, 0.0) - min(low, 0.0)
        value = _constant(model, name)
        if value is None or value.dtype.kind != "f" or not value.size:
            return None
        return float(max(value.max(), 0.0) - min(value.min(), 0.0))

    for node in model.graph.node:
        if node.op_type not in ("Add", "Sub") or node.output[0] not in out:
            continue
        spans = [v for v in map(span, node.input) if v is not None and np.isfinite(v)]
        if not spans:
            continue
        need = max(spans) / ADD_MAX_SCALE_RATIO * 1.01
        name = node.output[0]
        low, high = min(out[name][0], 0.0), max(out[name][1], 0.0)
        if high - low < need:
            grow = need - (high - low)
            out[name] = (low - grow / 2, high + grow / 2)
            widened.append(name)
    return out, widened


def _constant(model: onnx.ModelProto, name: str):
    """The value of an initializer or Constant node output, or None."""
    from onnx import numpy_helper

    for t in model.graph.initializer:
        if t.name == name:
            return numpy_helper.to_array(t)
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output[0] == name:
            for a in node.attribute:
                if a.name == "value":
                    return numpy_helper.to_array(a.t)
    return None
