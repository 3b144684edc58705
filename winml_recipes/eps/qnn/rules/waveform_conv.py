"""A strided Conv1d over a raw waveform as a stride-1 Conv over its polyphase channels.

On HTP (onnxruntime-qnn 2.7.0), a w8a16 Conv1d with one input channel and stride 5 (wav2vec2's
first feature-encoder layer, kernel 10) is wrong at some widths: 0 dB against the CPU EP's
simulation of the same QDQ graph over 20,000 and 32,000 samples, 54-69 dB over 16,000 or
24,000. The same convolution written with stride 1 over the waveform's `s` phases is right
at every width measured (57-66 dB, 3,200 to 12,800 frames):

    y[o, t] = sum_k w[o, 0, k] x[s t + k] = sum_{p, m} w[o, 0, s m + p] x'[p, t + m],
    x'[p, j] = x[s j + p]

x' is a Reshape [B, 1, W, s] -> Transpose [B, 1, s, W] -> Reshape [B, s, W] of the waveform
(cropped to, or zero-padded at the end to, s W samples; the padded samples meet only the zero
weights that pad the kernel to a multiple of s). Exact in float; the Reshape/Transpose keep
one encoding in the QDQ graph. Only single-channel inputs are rewritten (a waveform; a
multi-channel Conv1d such as Whisper's stride-2 layer is unchanged).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from winml_recipes.graph.log import RewriteLog

RULE = "waveform_conv_to_polyphase"


def _ints(node: ir.Node, name: str, default: list[int]) -> list[int]:
    attr = node.attributes.get(name)
    return list(attr.as_ints()) if attr is not None else default


def _why_not(node: ir.Node) -> str | tuple[np.ndarray, int, int, int]:
    """(weight, batch, samples, stride) of a rewritable Conv, else why it is kept."""
    x, w = node.inputs[0], node.inputs[1]
    shape = list(x.shape) if x is not None and x.shape is not None else []
    if len(shape) != 3 or not all(isinstance(d, int) for d in shape):
        return "not a Conv1d with a static input shape"
    if shape[1] != 1:
        return "more than one input channel"
    weight = w.const_value.numpy() if w is not None and w.const_value is not None else None
    if weight is None:
        return "the weight is not a constant"
    stride = _ints(node, "strides", [1])[0]
    if stride < 2:
        return "stride 1"
    if _ints(node, "dilations", [1]) != [1] or _ints(node, "pads", [0, 0]) != [0, 0]:
        return "dilated or padded"
    group = node.attributes.get("group")
    if (group.as_int() if group is not None else 1) != 1:
        return "grouped"
    auto_pad = node.attributes.get("auto_pad")
    if auto_pad is not None and auto_pad.as_string() not in ("NOTSET", "VALID"):
        return "auto_pad"
    if shape[2] < weight.shape[2]:
        return "shorter than its kernel"
    return weight, shape[0], shape[2], stride


class WaveformConvPass(ir.passes.InPlacePass):
    """Every single-channel strided Conv1d as a polyphase stride-1 Conv (module docstring)."""

    rule_name = RULE

    def __init__(self, log: RewriteLog) -> None:
        super().__init__()
        self.log = log

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        changed = 0
        for graph in (model.graph, *model.graph.subgraphs()):
            for node in [n for n in graph if n.op_type == "Conv" and n.domain == ""]:
                found = _why_not(node)
                if isinstance(found, str):
                    continue  # not a waveform front end: nothing to say about it
                _rewrite(graph, node, *found)
                self.log.add(RULE, node.name)
                changed += 1
        return ir.passes.PassResult(model, bool(changed))


def _const(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    value = ir.Value(name=name, const_value=ir.tensor(array, name=name))
    value.shape, value.dtype = ir.Shape(list(array.shape)), ir.DataType.from_numpy(array.dtype)
    graph.register_initializer(value)
    return value


def _rewrite(
    graph: ir.Graph, conv: ir.Node, weight: np.ndarray, batch: int, samples: int, s: int
) -> None:
    base = conv.name or conv.outputs[0].name or "conv"
    out_ch, _, kernel = weight.shape
    taps = -(-kernel // s)  # kernel positions per phase
    frames = (samples - kernel) // s + 1
    width = frames - 1 + taps  # polyphase frames the stride-1 conv reads
    padded = np.zeros((out_ch, 1, taps * s), weight.dtype)
    padded[:, :, :kernel] = weight
    # W'[o, p, m] = w[o, 0, s m + p]
    poly = padded.reshape(out_ch, taps, s).transpose(0, 2, 1).copy()
    new: list[ir.Node] = []
    x = conv.inputs[0]
    need = width * s
    if need != samples:
        if need < samples:
            starts = _const(graph, f"{base}_poly_start", np.array([0], np.int64))
            ends = _const(graph, f"{base}_poly_end", np.array([need], np.int64))
            axes = _const(graph, f"{base}_poly_axis", np.array([2], np.int64))
            node = ir.node("Slice", [x, starts, ends, axes], name=f"{base}_poly_crop")
        else:
            pads = _const(graph, f"{base}_poly_pads",
                          np.array([0, 0, 0, 0, 0, need - samples], np.int64))  # fmt: skip
            node = ir.node("Pad", [x, pads], name=f"{base}_poly_pad")
        node.outputs[0].dtype, node.outputs[0].shape = x.dtype, ir.Shape([batch, 1, need])
        node.outputs[0].name = f"{base}_poly_samples"
        new.append(node)
        x = node.outputs[0]
    shape1 = _const(graph, f"{base}_poly_shape1", np.array([batch, 1, width, s], np.int64))
    shape2 = _const(graph, f"{base}_poly_shape2", np.array([batch, s, width], np.int64))
    r1 = ir.node("Reshape", [x, shape1], name=f"{base}_poly_frames")
    r1.outputs[0].dtype, r1.outputs[0].shape = x.dtype, ir.Shape([batch, 1, width, s])
    r1.outputs[0].name = f"{base}_poly_frames"
    tr = ir.node("Transpose", [r1.outputs[0]], attributes={"perm": [0, 1, 3, 2]},
                 name=f"{base}_poly_phases")  # fmt: skip
    tr.outputs[0].dtype, tr.outputs[0].shape = x.dtype, ir.Shape([batch, 1, s, width])
    tr.outputs[0].name = f"{base}_poly_phases"
    r2 = ir.node("Reshape", [tr.outputs[0], shape2], name=f"{base}_poly_channels")
    r2.outputs[0].dtype, r2.outputs[0].shape = x.dtype, ir.Shape([batch, s, width])
    r2.outputs[0].name = f"{base}_poly_channels"
    w = _const(graph, f"{base}_poly_weight", poly)
    inputs = [r2.outputs[0], w, *conv.inputs[2:]]
    attrs = {"kernel_shape": [taps], "strides": [1]}
    conv2 = ir.node("Conv", inputs, attributes=attrs, name=f"{base}_polyphase")
    old = conv.outputs[0]
    conv2.outputs[0].dtype, conv2.outputs[0].shape = old.dtype, old.shape
    new += [r1, tr, r2, conv2]
    graph.insert_before(conv, new)
    ir.convenience.replace_all_uses_with(old, conv2.outputs[0], replace_graph_outputs=True)
    name, old.name = old.name, None
    conv2.outputs[0].name = name
    graph.remove(conv, safe=True)
