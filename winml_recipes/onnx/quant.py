"""Quantization detection: the one place that says whether and how a model is quantized.

A pure walk over the proto (main graph, If/Loop/Scan subgraphs and model-local function
bodies, each body counted once). It never reads tensor bytes, so it works on a model
loaded with `load_external_data=False`, and it never creates an onnxruntime session.

Formats:
- qdq: QuantizeLinear/DequantizeLinear (ai.onnx or com.microsoft) used as QDQ, that is a
  DequantizeLinear of a constant (stored quantized weights) or fed by a QuantizeLinear.
  The lone Q at the input and DQ at the output of a QOperator graph do not make it QDQ.
- qoperator: QLinear* ops, QGemm, ConvInteger, MatMulInteger, MatMulIntegerToFloat.
- dynamic: DynamicQuantizeLinear, DynamicQuantizeMatMul.
- weight_only: MatMulNBits, GatherBlockQuantized.

Dtypes come from zero points and quantized initializers. A quantized tensor that is a
constant is a weight (an int32 one read by DequantizeLinear is a bias); anything else is an
activation. Granularity is that of the weights: per_tensor, per_channel or block.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

import onnx
from onnx import AttributeProto, TensorProto

FORMATS = ("qdq", "qoperator", "dynamic", "weight_only")
FORMAT_LABELS = {
    "qdq": "QDQ",
    "qoperator": "QOperator",
    "dynamic": "dynamic",
    "weight_only": "weight-only",
}
QUANT_DOMAINS = frozenset({"", "ai.onnx", "com.microsoft"})

QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
QOPERATOR_OPS = frozenset(
    {
        "QLinearConv",
        "QLinearMatMul",
        "QLinearAdd",
        "QLinearMul",
        "QLinearConcat",
        "QLinearSigmoid",
        "QLinearLeakyRelu",
        "QLinearGlobalAveragePool",
        "QLinearAveragePool",
        "QLinearSoftmax",
        "QGemm",
        "ConvInteger",
        "MatMulInteger",
        "MatMulIntegerToFloat",
    }
)
DYNAMIC_OPS = frozenset({"DynamicQuantizeLinear", "DynamicQuantizeMatMul"})
WEIGHT_ONLY_OPS = frozenset({"MatMulNBits", "GatherBlockQuantized"})

_FORMAT_OF = {
    **dict.fromkeys(QDQ_OPS, "qdq"),
    **dict.fromkeys(QOPERATOR_OPS, "qoperator"),
    **dict.fromkeys(DYNAMIC_OPS, "dynamic"),
    **dict.fromkeys(WEIGHT_ONLY_OPS, "weight_only"),
}

# Quantized input slots per op: (data, scale, zero_point) input indices, None if absent.
Slot = tuple[int | None, int | None, int | None]
_AB: tuple[Slot, ...] = ((0, 1, 2), (3, 4, 5))
_X: tuple[Slot, ...] = ((0, 1, 2),)
_INPUT_SLOTS: dict[str, tuple[Slot, ...]] = {
    "DequantizeLinear": _X,
    "QLinearConv": _AB,
    "QLinearMatMul": _AB,
    "QLinearAdd": _AB,
    "QLinearMul": _AB,
    "QGemm": _AB,
    "QLinearSigmoid": _X,
    "QLinearLeakyRelu": _X,
    "QLinearGlobalAveragePool": _X,
    "QLinearAveragePool": _X,
    "QLinearSoftmax": _X,
    "ConvInteger": ((0, None, 2), (1, None, 3)),
    "MatMulInteger": ((0, None, 2), (1, None, 3)),
    "MatMulIntegerToFloat": ((0, 2, 4), (1, 3, 5)),
    "DynamicQuantizeMatMul": ((1, 2, 3),),
}
# Quantized (int32) bias input of QOperator ops.
_BIAS_INPUT: dict[str, int] = {"QLinearConv": 8, "QGemm": 6}
# Zero-point input index that gives the dtype of output 0.
_OUTPUT_ZP: dict[str, int] = {
    "QuantizeLinear": 2,
    "QLinearConv": 7,
    "QLinearMatMul": 7,
    "QLinearAdd": 7,
    "QLinearMul": 7,
    "QGemm": 8,
    "QLinearConcat": 1,
    "QLinearSigmoid": 4,
    "QLinearLeakyRelu": 4,
    "QLinearGlobalAveragePool": 4,
    "QLinearAveragePool": 4,
    "QLinearSoftmax": 4,
}


@dataclass(frozen=True)
class QuantSummary:
    """What `detect_quantization` found; `op_counts` lists every quantization op seen."""

    formats: tuple[str, ...] = ()
    op_counts: tuple[tuple[str, int], ...] = ()
    activation_dtypes: tuple[str, ...] = ()
    weight_dtypes: tuple[str, ...] = ()
    bias_dtypes: tuple[str, ...] = ()
    weight_granularity: tuple[str, ...] = ()

    @property
    def quantized(self) -> bool:
        """True when some format matched (a lone DQ of a uint8 graph input does not count)."""
        return bool(self.formats)

    @property
    def counts(self) -> dict[str, int]:
        return dict(self.op_counts)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON/YAML data with a stable key order."""
        return {
            "quantized": self.quantized,
            "formats": list(self.formats),
            "op_counts": dict(self.op_counts),
            "activation_dtypes": list(self.activation_dtypes),
            "weight_dtypes": list(self.weight_dtypes),
            "bias_dtypes": list(self.bias_dtypes),
            "weight_granularity": list(self.weight_granularity),
        }

    def describe(self) -> str:
        """One line, e.g. "QOperator: ConvInteger x9, MatMulInteger x12 (weights int8 ...)"."""
        if not self.quantized:
            return "not quantized"
        kinds = "+".join(FORMAT_LABELS[f] for f in self.formats)
        ops = ", ".join(f"{op} x{n}" for op, n in self.op_counts)
        details = []
        if self.weight_dtypes:
            gran = "/".join(self.weight_granularity)
            details.append(f"weights {'/'.join(self.weight_dtypes)} {gran}".rstrip())
        if self.activation_dtypes:
            details.append("activations " + "/".join(self.activation_dtypes))
        tail = f" ({', '.join(details)})" if details else ""
        return f"{kinds}: {ops}{tail}"


@dataclass(frozen=True)
class _Info:
    """Static facts about one tensor name: dtype name, and dims when it is a constant."""

    dtype: str | None
    dims: tuple[int, ...] | None = None

    @property
    def is_const(self) -> bool:
        return self.dims is not None


class _Collector:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.formats: set[str] = set()
        self.activations: set[str] = set()
        self.weights: set[str] = set()
        self.biases: set[str] = set()
        self.granularity: set[str] = set()
        self.q_outputs: set[str] = set()
        self.dq_inputs: set[str] = set()
        self.dq_of_const = False

    def summary(self) -> QuantSummary:
        formats = set(self.formats)
        if "qdq" in formats and not (self.dq_of_const or self.q_outputs & self.dq_inputs):
            formats.discard("qdq")
        return QuantSummary(
            formats=tuple(f for f in FORMATS if f in formats),
            op_counts=tuple(sorted(self.counts.items())),
            activation_dtypes=tuple(sorted(self.activations)),
            weight_dtypes=tuple(sorted(self.weights)),
            bias_dtypes=tuple(sorted(self.biases)),
            weight_granularity=tuple(
                g for g in ("per_tensor", "per_channel", "block") if g in self.granularity
            ),
        )


def detect_quantization(model: onnx.ModelProto) -> QuantSummary:
    """Summarize the quantization of `model` (pure proto walk, no tensor data needed)."""
    out = _Collector()
    _walk_graph(model.graph, ChainMap(), out)
    for fn in model.functions:
        _walk_nodes(fn.node, ChainMap(), out)
    return out.summary()


def _dtype(elem_type: int) -> str | None:
    try:
        return onnx.helper.tensor_dtype_to_np_dtype(elem_type).name
    except (KeyError, ValueError, TypeError):
        return None


def _tensor_info(t: TensorProto) -> _Info:
    return _Info(_dtype(t.data_type), tuple(t.dims))


def _walk_graph(graph: onnx.GraphProto, outer: ChainMap, out: _Collector) -> None:
    scope = outer.new_child()
    for vi in [*graph.input, *graph.output, *graph.value_info]:
        tt = vi.type.tensor_type
        if tt.elem_type:
            scope[vi.name] = _Info(_dtype(tt.elem_type))
    for t in graph.initializer:
        scope[t.name] = _tensor_info(t)
    for st in graph.sparse_initializer:
        scope[st.values.name] = _Info(_dtype(st.values.data_type), tuple(st.dims))
    _walk_nodes(graph.node, scope, out)


def _walk_nodes(nodes, scope: ChainMap, out: _Collector) -> None:
    scope = scope.new_child()
    for node in nodes:  # constants first: a graph may list nodes in any valid order
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for attr in node.attribute:
                if attr.name == "value" and attr.type == AttributeProto.TENSOR:
                    scope[node.output[0]] = _tensor_info(attr.t)
    for node in nodes:
        if node.domain in QUANT_DOMAINS and node.op_type in _FORMAT_OF:
            _visit(node, scope, out)
        for g in _subgraphs(node):
            _walk_graph(g, scope, out)


def _subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    for attr in node.attribute:
        if attr.type == AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == AttributeProto.GRAPHS:
            yield from attr.graphs


def _input(node: onnx.NodeProto, index: int | None) -> str | None:
    if index is None or index >= len(node.input) or not node.input[index]:
        return None
    return node.input[index]


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    for a in node.attribute:
        if a.name == name:
            return int(a.i)
    return default


def _visit(node: onnx.NodeProto, scope: MutableMapping[str, _Info], out: _Collector) -> None:
    op = node.op_type
    out.counts[op] = out.counts.get(op, 0) + 1
    out.formats.add(_FORMAT_OF[op])

    def info(index: int | None) -> _Info | None:
        name = _input(node, index)
        return scope.get(name) if name else None

    if op in WEIGHT_ONLY_OPS:
        _visit_weight_only(node, info, out)
        return
    if op in ("DynamicQuantizeLinear", "DynamicQuantizeMatMul"):
        out.activations.add("uint8")  # both quantize their float input to uint8
        if op == "DynamicQuantizeLinear":
            for name in node.output[0:3:2]:  # y and y_zero_point
                scope[name] = _Info("uint8")
    slots = _INPUT_SLOTS.get(op, ())
    if op == "QLinearConcat":
        slots = tuple((i, i + 1, i + 2) for i in range(2, len(node.input), 3))
    for data, scale, zp in slots:
        _record_slot(node, info(data), info(scale), info(zp), out)
    bias = info(_BIAS_INPUT.get(op))
    if bias is not None and bias.dtype:
        out.biases.add(bias.dtype)
    if op == "DequantizeLinear" and node.input:
        out.dq_inputs.add(node.input[0])
    if op in _OUTPUT_ZP and node.output and node.output[0]:
        _record_output(node, info, scope, out)


def _record_slot(
    node: onnx.NodeProto,
    data: _Info | None,
    scale: _Info | None,
    zp: _Info | None,
    out: _Collector,
) -> None:
    is_weight = data is not None and data.is_const
    dtype = (data.dtype if is_weight and data else None) or (zp.dtype if zp else None)
    if dtype is None and data is not None:
        dtype = data.dtype
    if not is_weight:
        if dtype:
            out.activations.add(dtype)
        return
    if node.op_type == "DequantizeLinear":
        out.dq_of_const = True
        if dtype == "int32":
            out.biases.add(dtype)
            return
    if dtype:
        out.weights.add(dtype)
    gran = _granularity(node, scale if scale is not None else zp)
    if gran:
        out.granularity.add(gran)


def _record_output(node, info, scope: MutableMapping[str, _Info], out: _Collector) -> None:
    zp = info(_OUTPUT_ZP[node.op_type])
    dtype = zp.dtype if zp else None
    if node.op_type == "QuantizeLinear":
        out.q_outputs.add(node.output[0])
        if dtype is None:
            dtype = _dtype(_attr(node, "output_dtype", TensorProto.UINT8))
        source = info(0)
        if source is not None and source.is_const:  # a float weight quantized in-graph
            if dtype:
                out.weights.add(dtype)
            gran = _granularity(node, info(1))
            if gran:
                out.granularity.add(gran)
            scope[node.output[0]] = _Info(dtype)
            return
    if dtype:
        out.activations.add(dtype)
        scope[node.output[0]] = _Info(dtype)


def _granularity(node: onnx.NodeProto, scale: _Info | None) -> str | None:
    """per_tensor / per_channel / block from a constant scale (or zero point) shape."""
    if _attr(node, "block_size", 0) > 0:
        return "block"
    if scale is None or scale.dims is None:
        return None
    if len(scale.dims) > 1 and sum(d > 1 for d in scale.dims) > 1:
        return "block"
    numel = 1
    for d in scale.dims:
        numel *= d
    return "per_channel" if numel > 1 else "per_tensor"


def _visit_weight_only(node: onnx.NodeProto, info, out: _Collector) -> None:
    bits = _attr(node, "bits", 4)
    data = info(1 if node.op_type == "MatMulNBits" else 0)
    dtype = data.dtype if data else None
    if dtype in (None, "uint8"):
        dtype = f"uint{bits}"  # bits packed into uint8 storage, unsigned with a zero point
    out.weights.add(dtype)
    out.granularity.add("block")
