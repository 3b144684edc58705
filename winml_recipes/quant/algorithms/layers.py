"""Weight layers (Conv, Gemm, MatMul reading a constant weight), their calibration inputs
streamed a few layers at a time, a one-node runner, and the weights onnxruntime's quantizer
wrote (read back from its QDQ model, so what is corrected is what it did)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

WEIGHT_OPS = ("Conv", "Gemm", "MatMul")
# Bytes of calibration activations one collection pass may hold (a layer larger than this
# is collected alone).
GROUP_BYTES = 256 << 20


@dataclass(frozen=True)
class Layer:
    node: str  # node name
    op: str
    input: str  # the activation it reads
    weight: str  # initializer
    channel_axis: int  # the weight's output-channel axis
    bias: str | None  # initializer holding the bias (Conv B, Gemm C, the Add after a MatMul)
    bias_add: str | None  # the Add node holding a MatMul's bias

    @property
    def output_axis(self) -> int:
        """The output-channel axis of the layer's output (-1: last)."""
        return 1 if self.op == "Conv" else -1


def weight_layers(model: onnx.ModelProto) -> list[Layer]:
    """The named Conv/Gemm/MatMul nodes whose weight is an initializer (2-D for Gemm/MatMul)."""
    inits = {t.name: t for t in model.graph.initializer}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    layers = []
    for n in model.graph.node:
        if n.op_type not in WEIGHT_OPS or not n.name or len(n.input) < 2:
            continue
        w = inits.get(n.input[1])
        if w is None or n.input[0] in inits:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        bias = bias_add = None
        if n.op_type == "Conv":
            axis = 0
            bias = n.input[2] if len(n.input) > 2 and n.input[2] in inits else None
        elif len(w.dims) != 2 or attrs.get("transA", 0):
            continue
        elif n.op_type == "Gemm":
            axis = 0 if attrs.get("transB", 0) else 1
            if len(n.input) > 2 and n.input[2]:
                c = inits.get(n.input[2])
                if c is None or len(c.dims) != 1:
                    continue
                bias = c.name
        else:
            axis = 1
            after = readers.get(n.output[0], [])
            if len(after) == 1 and after[0].op_type == "Add":
                other = [i for i in after[0].input if i != n.output[0]]
                c = inits.get(other[0]) if len(other) == 1 else None
                if c is not None and list(c.dims) == [w.dims[1]]:
                    bias, bias_add = c.name, after[0].name
        layers.append(Layer(n.name, n.op_type, n.input[0], w.name, axis, bias, bias_add))
    return layers


def initializer(model: onnx.ModelProto, name: str) -> np.ndarray:
    (t,) = [t for t in model.graph.initializer if t.name == name]
    return numpy_helper.to_array(t)


def set_initializer(model: onnx.ModelProto, name: str, value: np.ndarray) -> None:
    (t,) = [t for t in model.graph.initializer if t.name == name]
    t.CopyFrom(numpy_helper.from_array(value.astype(numpy_helper.to_array(t).dtype), name))


# --------------------------------------------------------------------------- one node


class LayerRunner:
    """The layer's op alone (weight as an input, no bias) in a CPU session: y = op(x, w)."""

    def __init__(self, model: onnx.ModelProto, layer: Layer) -> None:
        import onnxruntime as ort

        (node,) = [n for n in model.graph.node if n.name == layer.node]
        attrs = [a for a in node.attribute if a.name not in ("beta",)]
        one = helper.make_node(node.op_type, ["x", "w"], ["y"], name="layer")
        one.attribute.extend(attrs)
        vi = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, None)  # noqa: E731
        opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
        graph = helper.make_graph([one], "layer", [vi("x"), vi("w")], [vi("y")])
        proto = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8
        )
        so = ort.SessionOptions()
        so.log_severity_level = 3
        self.session = ort.InferenceSession(
            proto.SerializeToString(), so, providers=["CPUExecutionProvider"]
        )

    def __call__(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return self.session.run(None, {"x": x, "w": w.astype(np.float32)})[0]


# Rows of a layer input folded into its second moment per block (bounds the f32 product).
_MOMENT_ROWS = 8192
# The second moment is used only where it scores over at most this fraction of the rows: a
# [K, K] float64 Gram matrix and its Cholesky factor cost 16 K^2 bytes (fc2 of a ViT-L,
# K = 4096: 268 MB) against 4 K bytes per row, so near K rows it costs more memory than it
# saves time (sam3-mid's encoder at 504 px, 4 samples: 5,184 rows for K = 4,096 put
# seqmse's peak at 2.23x plain calibration's).
_MOMENT_MAX_ROW_FRACTION = 0.25


def second_moment_rows(layer: Layer, inputs: list[np.ndarray]) -> list[np.ndarray] | None:
    """For a MatMul/Gemm, one input R [K, K] with R^T R = the sum of X^T X over every row of
    every sample (X: an input reshaped to [rows, K]): the layer's summed squared output error
    for any weight change D is then sum((R @ D) ** 2) per channel, as over the real inputs,
    at K rows instead of all of them. None when that would not be fewer rows (or a Conv)."""
    if layer.op not in ("MatMul", "Gemm") or any(x.ndim < 2 for x in inputs):
        return None
    k = inputs[0].shape[-1]
    if k > _MOMENT_MAX_ROW_FRACTION * sum(x.size // k for x in inputs):
        return None
    gram = np.zeros((k, k), np.float64)
    for x in inputs:
        rows = x.reshape(-1, k)
        for start in range(0, rows.shape[0], _MOMENT_ROWS):
            block = rows[start : start + _MOMENT_ROWS].astype(np.float32)
            gram += block.T @ block
    # Cholesky of the (possibly rank-deficient) Gram matrix, with a jitter of its scale on
    # the diagonal (in place: no second K x K matrix); an eigendecomposition when even that
    # fails.
    jitter = 1e-10 * max(float(np.trace(gram)) / k, 1e-30)
    gram[np.diag_indices(k)] += jitter
    try:
        root = np.linalg.cholesky(gram).T.astype(np.float32)
    except np.linalg.LinAlgError:
        vals, vecs = np.linalg.eigh(gram)
        del gram
        root = (np.sqrt(np.clip(vals, 0, None))[:, None] * vecs.T).astype(np.float32)
    return [root]


def per_channel(y: np.ndarray, axis: int, reduce: str = "sum") -> np.ndarray:
    """Sum (or mean) of `y` over every axis but `axis`."""
    moved = np.moveaxis(y, axis, -1).reshape(-1, y.shape[axis])
    return moved.sum(0) if reduce == "sum" else moved.mean(0)


# --------------------------------------------------------------------------- streaming


def _nbytes(info: onnx.ValueInfoProto | None, samples: int) -> int:
    dims = [] if info is None else info.type.tensor_type.shape.dim
    if not dims or any(not d.HasField("dim_value") for d in dims):
        return GROUP_BYTES  # unknown: collected alone
    return 4 * samples * int(np.prod([d.dim_value for d in dims]))


def collect_inputs(
    src: Path,
    model: onnx.ModelProto,
    tensors: Sequence[str],
    feeds,
    samples: int,
    work_dir: Path,
) -> Iterator[tuple[str, list[np.ndarray]]]:
    """(tensor, its value for each calibration sample), a group of tensors per forward pass,
    so what is held at once stays under GROUP_BYTES (or one tensor, when it is larger)."""
    from winml_recipes.quant.calibrate import _outputs_model, _session, _stream, _value_infos

    wanted = list(dict.fromkeys(tensors))
    if not wanted:
        return
    infos = _value_infos(model)
    work_dir.mkdir(parents=True, exist_ok=True)
    session = _session(
        _outputs_model(model, wanted, infos), work_dir / "layer-inputs.onnx", src.parent
    )
    group: list[str] = []
    held = 0
    groups = []
    for t in wanted:
        size = _nbytes(infos.get(t), samples)
        if group and held + size > GROUP_BYTES:
            groups.append(group)
            group, held = [], 0
        group.append(t)
        held += size
    groups.append(group)
    for group in groups:
        values: dict[str, list[np.ndarray]] = {t: [] for t in group}
        for _, outs in _stream(session, group, feeds, "quantize.algorithms"):
            for t, v in zip(group, outs, strict=True):
                values[t].append(v)
        for t in group:
            yield t, values.pop(t)


# --------------------------------------------------------------------------- quantized


@dataclass(frozen=True)
class WeightQuant:
    """How onnxruntime quantized one weight: its values and granularity. Every layer's is
    held while the layers are tuned, so the integers are kept (a quarter of the float
    bytes at 8 bits) and dequantized when asked."""

    quantized: np.ndarray  # the integers, or already dequantized floats (scale 1, zp 0)
    axis: int | None  # per-channel axis, None: per tensor
    qmin: int
    qmax: int
    symmetric: bool
    scale: np.ndarray | float = 1.0  # broadcastable to `quantized`
    zero_point: np.ndarray | int = 0

    @property
    def dequantized(self) -> np.ndarray:
        if self.quantized.dtype == np.float32:
            return self.quantized
        return ((self.quantized.astype(np.int64) - self.zero_point) * self.scale).astype(np.float32)


def quantized_weights(qmodel: onnx.ModelProto, layers: Sequence[Layer]) -> dict[str, WeightQuant]:
    """Each layer's weight as the QDQ model holds it (DequantizeLinear of an initializer)."""
    from onnxruntime.quantization.quant_utils import get_qmin_qmax_for_qType

    inits = {t.name: t for t in qmodel.graph.initializer}
    producer = {o: n for n in qmodel.graph.node for o in n.output}
    nodes = {n.name: n for n in qmodel.graph.node}
    found = {}
    for layer in layers:
        node = nodes.get(layer.node)
        dq = producer.get(node.input[1]) if node is not None else None
        if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in inits:
            continue
        stored = numpy_helper.to_array(inits[dq.input[0]])  # its own integer type
        scale = numpy_helper.to_array(inits[dq.input[1]]).astype(np.float32)
        zp = (
            numpy_helper.to_array(inits[dq.input[2]]).astype(np.int64)
            if len(dq.input) > 2 and dq.input[2]
            else np.zeros_like(scale, np.int64)
        )
        axis = None
        if scale.size > 1:
            named = (helper.get_attribute_value(a) for a in dq.attribute if a.name == "axis")
            axis = next(named, 1)
            shape = [1] * stored.ndim
            shape[axis] = -1
            scale, zp = scale.reshape(shape), zp.reshape(shape)
        elem = inits[dq.input[0]].data_type
        # symmetric iff every zero point is the type's midpoint and the range is symmetric
        sym_min, sym_max = get_qmin_qmax_for_qType(elem, symmetric=True)
        mid = round((int(sym_min) + int(sym_max)) / 2)
        symmetric = bool(np.all(zp == mid))
        qmin, qmax = get_qmin_qmax_for_qType(elem, symmetric=symmetric)
        found[layer.weight] = WeightQuant(
            stored, axis, int(qmin), int(qmax), symmetric, scale, zp.astype(np.int32)
        )
    return found


def fake_quant(w: np.ndarray, spec: WeightQuant, ratio: np.ndarray | float = 1.0) -> np.ndarray:
    """`w` quantized and dequantized as onnxruntime does (its compute_scale_zp), with its
    range shrunk by `ratio` (per channel along spec.axis, or one number)."""
    axes = tuple(i for i in range(w.ndim) if i != spec.axis) if spec.axis is not None else None
    lo = np.minimum(w.min(axis=axes, keepdims=True), 0).astype(np.float64)
    hi = np.maximum(w.max(axis=axes, keepdims=True), 0).astype(np.float64)
    r = np.asarray(ratio, np.float64)
    if spec.axis is not None and r.ndim == 1:
        shape = [1] * w.ndim
        shape[spec.axis] = -1
        r = r.reshape(shape)
    lo, hi = lo * r, hi * r
    if spec.symmetric:
        hi = np.maximum(-lo, hi)
        lo = -hi
    scale = ((hi - lo) / (spec.qmax - spec.qmin)).astype(np.float32)
    tiny = scale < np.finfo(np.float32).tiny
    scale = np.where(tiny, np.float32(1.0), scale)
    if spec.symmetric:
        zp = np.full_like(scale, round((spec.qmin + spec.qmax) / 2))
    else:
        zp = np.round(spec.qmin - lo / scale)
    zp = np.where(tiny, 0, zp)
    q = np.clip(np.round(w / scale) + zp, spec.qmin, spec.qmax)
    return ((q - zp) * scale).astype(np.float32)


def clip_to_ratio(w: np.ndarray, spec: WeightQuant, ratio: np.ndarray | float) -> np.ndarray:
    """`w` clipped so that onnxruntime's min/max of it is the range shrunk by `ratio`."""
    axes = tuple(i for i in range(w.ndim) if i != spec.axis) if spec.axis is not None else None
    lo = np.minimum(w.min(axis=axes, keepdims=True), 0)
    hi = np.maximum(w.max(axis=axes, keepdims=True), 0)
    r = np.asarray(ratio, np.float32)
    if spec.axis is not None and r.ndim == 1:
        shape = [1] * w.ndim
        shape[spec.axis] = -1
        r = r.reshape(shape)
    if spec.symmetric:
        hi = np.maximum(-lo, hi)
        lo = -hi
    return np.clip(w, lo * r, hi * r).astype(w.dtype)
