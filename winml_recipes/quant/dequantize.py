"""Dequantize: rewrite a post-training-quantized ONNX model back into a plain float model.

Design: "expand, fold, collapse".

1. expand   every fused quantized op becomes DequantizeLinear on its quantized inputs ->
            the float op -> QuantizeLinear on its quantized output (QLinearConv -> DQ, DQ ->
            Conv -> Q). Weight-only ops (MatMulNBits, GatherBlockQuantized) and the
            DynamicQuantizeLinear -> ConvInteger/MatMulInteger -> Cast -> Mul fusions that
            `quantize_dynamic` writes are rewritten to the float op over a float weight.
2. fold     DequantizeLinear of a constant becomes a float constant `(W - zp) * scale`.
3. collapse QuantizeLinear -> DequantizeLinear (and DynamicQuantizeLinear -> DQ) become a
            direct edge; a DQ behind an integer data-movement op (Transpose, Reshape,
            MaxPool, ...) moves above it first, so the pair meets.

Each pattern is one small method; the expansion keeps them independent of each other.
A Q/DQ pair whose quantized range starts exactly at 0 (zero point at the dtype minimum)
clamps negatives: onnxruntime removes a Relu in that case and lets the range do its work,
so the collapse puts a Relu back unless the producer is already non-negative. The upper
end of the range is not restored (it cannot be told apart from the calibration range).

Graph work is done on onnx_ir (values know their uses, so replacing and dead-code removal
are exact) and its RemoveUnusedNodes/RemoveUnusedOpsets passes clean up. onnxscript's
rewriter is not used: most rewrites need numpy on constants (weight folding, bias scales)
and variable-arity matching (QLinearConcat, Mul chains), which hand-written matchers over
onnx_ir express more directly than patterns.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass, RemoveUnusedOpsetsPass

from winml_recipes.onnx.quant import (
    DYNAMIC_OPS,
    QDQ_OPS,
    QOPERATOR_OPS,
    QUANT_DOMAINS,
    WEIGHT_ONLY_OPS,
)
from winml_recipes.sdk.errors import PassError

DT = ir.DataType

# Quantized ops the detector does not list; they count as quantized (and unsupported).
_EXTRA_QUANT_OPS = frozenset(
    {
        "QAttention",
        "QEmbedLayerNormalization",
        "QMoE",
        "QOrderedAttention",
        "QOrderedGelu",
        "QOrderedLayerNormalization",
        "QOrderedLongformerAttention",
        "QOrderedMatMul",
        "QuantizeBFP",
        "DequantizeBFP",
        "QuantizeWithOrder",
        "DequantizeWithOrder",
        "DynamicQuantizeLSTM",
        "MatMulBnb4",
        "MatMulFpQ4",
        "MatMulInteger16",
        "MatMulNBitsMlp",
        "MatMulNBitsQkv",
        "MatMulBlockQuantizedFp4Weight",
        "MatMulBlockQuantizedFp8Weight",
        "MulInteger",
        "ReduceSumInteger",
    }
)
QUANT_OPS = QDQ_OPS | QOPERATOR_OPS | DYNAMIC_OPS | WEIGHT_ONLY_OPS | _EXTRA_QUANT_OPS

# Lowest representable value per integer dtype (Q/DQ data types this module handles).
_QMIN = {
    DT.INT8: -128,
    DT.UINT8: 0,
    DT.INT16: -32768,
    DT.UINT16: 0,
    DT.INT4: -8,
    DT.UINT4: 0,
    DT.INT32: -(2**31),
}
_QLINEAR_DTYPES = frozenset({DT.INT8, DT.UINT8})
_FLOAT_DTYPES = frozenset({DT.FLOAT, DT.FLOAT16, DT.BFLOAT16, DT.DOUBLE})

# Ops whose output is non-negative: no Relu needs restoring behind them.
_NON_NEGATIVE_OPS = frozenset({"Relu", "Sigmoid", "Softmax", "Abs", "Exp", "Sqrt", "Softplus"})

# Ops whose output is non-negative when their data inputs are (index None: all inputs).
_SIGN_PRESERVING_OPS: dict[str, tuple[int, ...] | None] = {
    "Identity": (0,),
    "Flatten": (0,),
    "Reshape": (0,),
    "Transpose": (0,),
    "Squeeze": (0,),
    "Unsqueeze": (0,),
    "Slice": (0,),
    "Gather": (0,),
    "Expand": (0,),
    "Tile": (0,),
    "Resize": (0,),
    "Pad": (0,),
    "MaxPool": (0,),
    "AveragePool": (0,),
    "GlobalAveragePool": (0,),
    "GlobalMaxPool": (0,),
    "ReduceMean": (0,),
    "ReduceMax": (0,),
    "Concat": None,
    "Mul": None,
    "Add": None,
}

# Integer data-movement ops a per-tensor DQ commutes with: op -> data input indices
# (None: all inputs) and data output indices (None: all outputs).
_PASSTHROUGH: dict[str, tuple[tuple[int, ...] | None, tuple[int, ...] | None]] = {
    "Transpose": ((0,), (0,)),
    "Reshape": ((0,), (0,)),
    "Flatten": ((0,), (0,)),
    "Squeeze": ((0,), (0,)),
    "Unsqueeze": ((0,), (0,)),
    "Identity": ((0,), (0,)),
    "Slice": ((0,), (0,)),
    "Gather": ((0,), (0,)),
    "GatherElements": ((0,), (0,)),
    "GatherND": ((0,), (0,)),
    "Expand": ((0,), (0,)),
    "Tile": ((0,), (0,)),
    "MaxPool": ((0,), (0,)),
    "Resize": ((0,), (0,)),
    "DepthToSpace": ((0,), (0,)),
    "SpaceToDepth": ((0,), (0,)),
    "ReduceMax": ((0,), (0,)),
    "ReduceMin": ((0,), (0,)),
    "Concat": (None, (0,)),
    "Split": ((0,), None),
}
# Ops that only read the shape of their input: rewired to the float tensor on collapse.
_SHAPE_ONLY_OPS = frozenset({"Shape", "Size"})

# Allowed attributes per fused op (anything else is refused, never silently dropped).
_CONV_ATTRS = frozenset({"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"})
_POOL_ATTRS = frozenset(
    {"auto_pad", "ceil_mode", "count_include_pad", "kernel_shape", "pads", "strides"}
)
_ALLOWED_ATTRS: dict[str, frozenset[str]] = {
    "QLinearConv": _CONV_ATTRS | {"channels_last"},
    "QLinearMatMul": frozenset(),
    "QLinearAdd": frozenset(),
    "QLinearMul": frozenset(),
    "QLinearConcat": frozenset({"axis"}),
    "QLinearSigmoid": frozenset(),
    "QLinearLeakyRelu": frozenset({"alpha"}),
    "QLinearGlobalAveragePool": frozenset({"channels_last"}),
    "QLinearAveragePool": _POOL_ATTRS | {"channels_last"},
    "QLinearSoftmax": frozenset({"axis", "opset"}),
    "QGemm": frozenset({"alpha", "transA", "transB"}),
    "ConvInteger": _CONV_ATTRS,
    "MatMulInteger": frozenset(),
    "MatMulIntegerToFloat": frozenset(),
    "DynamicQuantizeMatMul": frozenset(),
    "MatMulNBits": frozenset(
        {"K", "N", "bits", "block_size", "accuracy_level", "weight_prepacked"}
    ),
    "GatherBlockQuantized": frozenset({"bits", "block_size", "quantize_axis", "gather_axis"}),
}

# Ops reported as "replaced N <op>": the detector's QOperator and weight-only families and
# DynamicQuantizeMatMul (ConvInteger/MatMulInteger get their own "fusions" wording).
_REPLACED_OPS = sorted(
    (QOPERATOR_OPS - {"ConvInteger", "MatMulInteger"}) | {"DynamicQuantizeMatMul"} | WEIGHT_ONLY_OPS
)


def _snake(op: str) -> str:
    """Report key stem of an op: QLinearConv -> qlinear_conv, MatMulNBits -> matmul_nbits."""
    out = op.replace("QLinear", "Qlinear").replace("MatMul", "Matmul").replace("NBits", "Nbits")
    out = out.replace("QGemm", "Qgemm")
    return "".join("_" + c.lower() if c.isupper() else c for c in out).lstrip("_")


# Report keys in describe() order: (singular, plural) phrase templates.
_PHRASES: dict[str, tuple[str, str]] = {
    "weight_dq_folded": ("folded {n} weight DQ", "folded {n} weight DQ"),
    "qdq_pairs_collapsed": ("collapsed {n} Q/DQ pair", "collapsed {n} Q/DQ pairs"),
    "conv_integer_replaced": (
        "replaced {n} ConvInteger fusion",
        "replaced {n} ConvInteger fusions",
    ),
    "matmul_integer_replaced": (
        "replaced {n} MatMulInteger fusion",
        "replaced {n} MatMulInteger fusions",
    ),
    **{f"{_snake(op)}_replaced": (f"replaced {{n}} {op}",) * 2 for op in _REPLACED_OPS},
    "bias_add_folded": ("folded {n} bias Add into Conv", "folded {n} bias Adds into Conv"),
    "passthrough_converted": (
        "moved {n} integer data-movement op to float",
        "moved {n} integer data-movement ops to float",
    ),
    "relu_restored": ("restored {n} Relu clamp", "restored {n} Relu clamps"),
}


@dataclass
class DequantizeReport:
    """What `dequantize_model` did: counts per pattern and the quantized ops it left."""

    counts: dict[str, int] = field(default_factory=dict)
    changed: bool = False
    remaining: list[tuple[str, str]] = field(default_factory=list)

    def describe(self) -> str:
        """One line, e.g. "folded 12 weight DQ, collapsed 40 Q/DQ pairs"."""
        keys = [k for k in _PHRASES if k in self.counts]
        keys += [k for k in self.counts if k not in _PHRASES]
        parts = []
        for key in keys:
            n = self.counts[key]
            if n:
                one, many = _PHRASES.get(key, (f"{key}: {{n}}",) * 2)
                parts.append((one if n == 1 else many).format(n=n))
        if self.remaining:
            parts.append(f"left {len(self.remaining)} quantized ops")
        return ", ".join(parts) if parts else "already float: nothing to do"

    def to_dict(self) -> dict[str, Any]:
        return {
            "changed": self.changed,
            "counts": dict(self.counts),
            "remaining": [list(r) for r in self.remaining],
            "summary": self.describe(),
        }


def dequantize_model(model: onnx.ModelProto) -> tuple[onnx.ModelProto, DequantizeReport]:
    """A float copy of `model` and what was rewritten; `model` itself is not modified.

    Raises a one-line PassError when quantized ops remain that no pattern covers, when a
    scale or zero point that must be folded is not a constant, or when a fused op uses an
    attribute or dtype this rewrite does not support.
    """
    if not any(_is_quant_op(n.op_type, n.domain) for n in _all_proto_nodes(model)):
        return _copy(model), DequantizeReport()
    # onnx_ir wraps (does not copy) the tensors of the proto it reads, and renaming a value
    # renames its tensor: work on a copy so the caller's model is never touched.
    rewriter = _Rewriter(ir.from_proto(_copy(model)))
    rewriter.run()
    report = rewriter.report()
    if report.remaining:
        raise PassError(_remaining_message(report.remaining))
    if not report.changed:
        return _copy(model), report
    return ir.to_proto(rewriter.model), report


# ----------------------------------------------------------------------------- helpers


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _is_quant_op(op_type: str, domain: str) -> bool:
    if domain not in QUANT_DOMAINS:
        return False
    return op_type in QUANT_OPS or op_type.startswith("QLinear")


def _all_proto_nodes(model: onnx.ModelProto) -> Iterator[onnx.NodeProto]:
    def walk(nodes) -> Iterator[onnx.NodeProto]:
        for node in nodes:
            yield node
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    yield from walk(attr.g.node)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    for g in attr.graphs:
                        yield from walk(g.node)

    yield from walk(model.graph.node)
    for fn in model.functions:
        yield from walk(fn.node)


def _remaining_message(remaining: list[tuple[str, str]]) -> str:
    shown = ", ".join(f"{name} ({op})" for name, op in remaining[:10])
    rest = len(remaining) - 10
    more = f" and {rest} more" if rest > 0 else ""
    noun = "node" if len(remaining) == 1 else "nodes"
    return f"cannot dequantize {len(remaining)} {noun}: {shown}{more}"


def _strip_quant_suffix(name: str | None) -> str:
    base = name or "dq"
    for tail in ("_output_quantized", "_QuantizeLinear_Output", "_quantized", "_quant"):
        if base.endswith(tail) and len(base) > len(tail):
            return base[: -len(tail)]
    return base


def _base_name(node: ir.Node) -> str:
    """A name to derive new node names from: the node's, else its first output's."""
    if node.name:
        return node.name
    outs = [o.name for o in node.outputs if o.name]
    return outs[0] if outs else node.op_type


def _label(node: ir.Node) -> str:
    if node.name:
        return node.name
    outs = [o.name for o in node.outputs if o.name]
    return f"<{outs[0]}>" if outs else "<unnamed>"


def _input(node: ir.Node, index: int) -> ir.Value | None:
    return node.inputs[index] if index < len(node.inputs) else None


def _attr_int(node: ir.Node, name: str, default: int) -> int:
    attr = node.attributes.get(name)
    return default if attr is None else int(attr.value)


def _attr_float(node: ir.Node, name: str, default: float) -> float:
    attr = node.attributes.get(name)
    return default if attr is None else float(attr.value)


def _numpy(tensor: ir.TensorProtocol) -> np.ndarray:
    """The tensor as numpy; 4-bit (and 2-bit) types come back unpacked as int8/uint8."""
    arr = tensor.numpy()
    name = tensor.dtype.name
    if name in ("INT4", "INT2"):
        return arr.astype(np.int8)
    if name in ("UINT4", "UINT2"):
        return arr.astype(np.uint8)
    return arr


def _const_tensor(value: ir.Value | None) -> ir.TensorProtocol | None:
    if value is None:
        return None
    try:
        return ir.convenience.get_const_tensor(value)
    except ValueError:  # a malformed Constant node: treat as not constant
        return None


def _const(value: ir.Value | None) -> np.ndarray | None:
    tensor = _const_tensor(value)
    return None if tensor is None else _numpy(tensor)


def _dtype_of(value: ir.Value | None) -> ir.DataType | None:
    if value is None:
        return None
    tensor = _const_tensor(value)
    if tensor is not None:
        return tensor.dtype
    return value.dtype


def _const_eval(value: ir.Value | None) -> np.ndarray | None:
    """A constant, or Reshape/Unsqueeze/Identity of constants (how bias shapes are made).

    Three numpy lines instead of a constant-folding pass: only the bias of a dynamic
    ConvInteger needs it, and folding the whole graph would change unrelated nodes.
    """
    arr = _const(value)
    if arr is not None or value is None:
        return arr
    node = value.producer()
    if node is None or node.domain not in ("", "ai.onnx"):
        return None
    data = _const(_input(node, 0))
    if data is None:
        return None
    if node.op_type == "Identity":
        return data
    if node.op_type == "Reshape":
        shape = _const(_input(node, 1))
        if shape is None:
            return None
        dims = [
            data.shape[i] if d == 0 and not _attr_int(node, "allowzero", 0) else int(d)
            for i, d in enumerate(shape.tolist())
        ]
        return data.reshape(dims)
    if node.op_type == "Unsqueeze":
        axes = _const(_input(node, 1))
        if axes is None and "axes" in node.attributes:
            axes = np.array(node.attributes["axes"].value)
        if axes is None:
            return None
        rank = data.ndim + len(axes)
        return np.expand_dims(data, tuple(sorted(int(a) % rank for a in axes.tolist())))
    return None


def _non_negative(value: ir.Value, depth: int = 0) -> bool:
    """True when `value` is the output of an op that cannot produce negative numbers."""
    node = value.producer()
    if node is None or depth > 8 or node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type in _NON_NEGATIVE_OPS:
        return True
    if node.op_type == "Cast":  # from bool or an unsigned integer
        source = node.inputs[0].dtype if node.inputs and node.inputs[0] is not None else None
        return source in (DT.BOOL, DT.UINT8, DT.UINT16, DT.UINT32, DT.UINT64)
    if node.op_type not in _SIGN_PRESERVING_OPS:
        return False
    if node.op_type == "Pad":
        fill = _const(_input(node, 2))
        if _input(node, 2) is not None and (fill is None or np.any(fill < 0)):
            return False
    indices = _SIGN_PRESERVING_OPS[node.op_type]
    inputs = node.inputs if indices is None else [_input(node, i) for i in indices]
    return all(v is not None and _non_negative(v, depth + 1) for v in inputs)


def _is_scalar_param(value: ir.Value) -> bool:
    """A per-tensor scale/zero point: a one-element constant or a DynamicQuantizeLinear output."""
    arr = _const(value)
    if arr is not None:
        return arr.size == 1
    producer = value.producer()
    return producer is not None and producer.op_type == "DynamicQuantizeLinear"


def _effective_zp(zp: ir.Value | None) -> np.ndarray | None:
    """The zero point as an array (zeros when absent), or None when not a constant."""
    arr = _const(zp)
    if arr is not None:
        return arr
    if zp is None:
        return np.zeros((), dtype=np.int64)
    return None


def _same_param(a: ir.Value | None, b: ir.Value | None, *, zero_default: bool) -> bool:
    """Same scale/zero point: the same value, or equal constants (absent zp == zeros)."""
    if a is b:
        return True
    if zero_default:
        aa, bb = _effective_zp(a), _effective_zp(b)
    else:
        aa, bb = _const(a), _const(b)
    if aa is None or bb is None:
        return False
    if aa.size != bb.size:
        return False
    return bool(
        np.array_equal(aa.reshape(-1).astype(np.float64), bb.reshape(-1).astype(np.float64))
    )


def _dequantize_array(
    data: np.ndarray,
    scale: np.ndarray,
    zero_point: np.ndarray | None,
    *,
    axis: int,
    block_size: int,
    out_dtype: np.dtype,
) -> np.ndarray:
    """`(data - zero_point) * scale` with per-tensor, per-axis or blocked parameters.

    Integer arithmetic is exact (int64), the product is float32 like onnxruntime's kernel,
    then cast to the output dtype.
    """
    q = data.astype(np.int64)
    zp = np.zeros_like(scale, dtype=np.int64) if zero_point is None else zero_point
    zp = zp.astype(np.int64)
    s = scale.astype(np.float32)
    if s.size > 1 or block_size:
        axis = axis % data.ndim if data.ndim else 0
        if block_size:
            s = np.repeat(s, block_size, axis=axis)
            zp = np.repeat(zp, block_size, axis=axis)
            index = [slice(None)] * data.ndim
            index[axis] = slice(0, data.shape[axis])
            s, zp = s[tuple(index)], zp[tuple(index)]
        else:
            shape = [1] * data.ndim
            shape[axis] = s.size
            s, zp = s.reshape(shape), zp.reshape(shape)
    else:
        s, zp = s.reshape(()), zp.reshape(())
    return ((q - zp).astype(np.float32) * s).astype(out_dtype)


def _unpack_bits(packed: np.ndarray, bits: int) -> np.ndarray:
    """uint8 bytes -> values, low-order bits first, along the last axis."""
    per_byte = 8 // bits
    mask = (1 << bits) - 1
    shifts = np.arange(per_byte, dtype=np.uint8) * bits
    values = (packed[..., None] >> shifts) & mask
    return values.reshape(*packed.shape[:-1], packed.shape[-1] * per_byte).astype(np.uint8)


# ---------------------------------------------------------------------------- rewriter


class _Rewriter:
    """Rewrites one onnx_ir model in place; `report()` says what happened."""

    def __init__(self, model: ir.Model) -> None:
        self.model = model
        self.counts: Counter[str] = Counter()
        self.internal: set[ir.Node] = set()  # nodes this rewrite created
        self.origin: dict[ir.Node, tuple[str, str]] = {}  # created node -> original node
        self.fresh: set[ir.Value] = set()  # values this rewrite created (renamable)
        self.retired: set[ir.Value] = set()  # values whose name was handed over
        self.owner: dict[ir.Graph, ir.Graph | ir.Function] = {}
        self.function_graphs: set[ir.Graph] = set()
        self.names: set[str] = set()
        self.folded: dict[tuple, ir.Value] = {}
        self.relu_of: dict[ir.Value, ir.Value] = {}
        self.remaining: list[tuple[str, str]] = []
        self._index_graphs()

    # -- bookkeeping

    def _index_graphs(self) -> None:
        self.owner = {}
        for graph in self._graph_likes():
            key = graph.graph if isinstance(graph, ir.Function) else graph
            self.owner[key] = graph
            if isinstance(graph, ir.Function):
                self.function_graphs.add(graph.graph)
            for name in ir.convenience.create_value_mapping(graph, include_subgraphs=False):
                self.names.add(name)

    def _graph_likes(self) -> list[ir.Graph | ir.Function]:
        out: list[ir.Graph | ir.Function] = [self.model.graph, *self.model.graph.subgraphs()]
        for fn in self.model.functions.values():
            out.append(fn)
            out.extend(fn.graph.subgraphs())
        return out

    def _nodes(self) -> list[ir.Node]:
        return [node for graph in self._graph_likes() for node in list(graph)]

    def _fresh_name(self, base: str) -> str:
        base = base or "dq"
        name, i = base, 0
        while name in self.names:
            i += 1
            name = f"{base}_{i}"
        self.names.add(name)
        return name

    def _float_name(self, quantized_name: str | None, suffix: str = "") -> str:
        return self._fresh_name(_strip_quant_suffix(quantized_name) + suffix)

    def _origin_of(self, node: ir.Node) -> tuple[str, str]:
        return self.origin.get(node, (_label(node), node.op_type))

    def report(self) -> DequantizeReport:
        counts = {k: self.counts[k] for k in _PHRASES if self.counts.get(k)}
        return DequantizeReport(counts=counts, changed=bool(counts), remaining=list(self.remaining))

    def _error(self, node: ir.Node, message: str) -> PassError:
        name, op = self._origin_of(node)
        return PassError(f"cannot dequantize node {name} ({op}): {message}")

    # -- graph editing

    def _insert(
        self,
        anchor: ir.Node,
        op_type: str,
        inputs,
        attributes=None,
        *,
        name: str,
        out_names: list[str] | None = None,
        num_outputs: int = 1,
        domain: str = "",
    ) -> ir.Node:
        node = ir.node(
            op_type,
            inputs,
            attributes=attributes or {},
            domain=domain,
            num_outputs=num_outputs,
            name=name,
        )
        for i, out in enumerate(node.outputs):
            out.name = (out_names[i] if out_names and i < len(out_names) else None) or (
                self._fresh_name(f"{name}_out{i}" if num_outputs > 1 else f"{name}_out")
            )
            self.fresh.add(out)
        self.owner[anchor.graph].insert_before(anchor, node)
        self.internal.add(node)
        self.origin[node] = self._origin_of(anchor)
        return node

    def _constant(self, anchor: ir.Node, array: np.ndarray, source: str | ir.Value) -> ir.Value:
        """A new constant next to `anchor`: an initializer, or a Constant node in a function.

        It is named after `source` without the quantizer's suffix ("w_quantized" -> "w");
        a source read only by `anchor` (about to go) gives up its name.
        """
        if isinstance(source, ir.Value):
            base = _strip_quant_suffix(source.name)
            if base == source.name:
                self._free_name(source, anchor)
        else:
            base = _strip_quant_suffix(source)
        name = self._fresh_name(base)
        tensor = ir.tensor(array, name=name)
        graph = anchor.graph
        if graph in self.function_graphs:
            node = ir.node("Constant", [], attributes={"value": tensor}, name=f"{name}_const")
            node.outputs[0].name = name
            self.owner[graph].insert_before(anchor, node)
            value = node.outputs[0]
        else:
            value = ir.Value(name=name, const_value=tensor)
            graph.register_initializer(value)
        value.type = ir.TensorType(tensor.dtype)
        value.shape = ir.Shape(array.shape)
        self.fresh.add(value)
        return value

    def _free_name(self, value: ir.Value, user: ir.Node) -> None:
        """Rename `value` out of the way when `user` is its only reader."""
        if not value.name or value.is_graph_input() or value.is_graph_output():
            return
        if any(usage.node is not user for usage in value.uses()):
            return
        old = value.name
        new = self._fresh_name(f"{old}__quantized")
        self.retired.add(value)
        if value.is_initializer():
            ir.convenience.rename_values(value, new)
        else:
            value.name = new
        self.names.discard(old)

    def _replace(self, old: ir.Value, new: ir.Value) -> None:
        """Point every use of `old` (graph outputs too, keeping their names) at `new`."""
        if new.type is None and old.type is not None and old.dtype in _FLOAT_DTYPES:
            new.type = old.type
        if new.shape is None and old.shape is not None:
            new.shape = old.shape
        graph = old.graph
        name = old.name
        if not old.is_graph_output():
            takes_name = new in self.fresh and not new.is_initializer()
            if takes_name and name and old not in self.fresh and old not in self.retired:
                self._retire(old)
                new.name = name
            old.replace_all_uses_with(new)
            return
        renamable = (
            new.producer() is not None
            and new.graph is graph
            and not new.is_graph_output()
            and not new.is_graph_input()
            and not new.is_initializer()
        )
        if not renamable:
            anchor = old.producer()
            assert anchor is not None
            ident = self._insert(anchor, "Identity", [new], name=f"{name}_identity")
            new = ident.outputs[0]
            new.type, new.shape = old.type, old.shape
        self._retire(old)
        new.name = name
        old.replace_all_uses_with(new, replace_graph_outputs=True)

    def _retire(self, value: ir.Value) -> None:
        """Move `value` (about to be dropped) off its name so a replacement can take it."""
        value.name = self._fresh_name(f"{value.name}__replaced")
        self.retired.add(value)

    def _remove(self, node: ir.Node) -> None:
        self.owner[node.graph].remove(node, safe=True)

    def _finish(self, node: ir.Node, new_outputs: list[ir.Value]) -> None:
        for old, new in zip(node.outputs, new_outputs, strict=False):
            self._replace(old, new)
        self._remove(node)
        self.counts[f"{_snake(node.op_type)}_replaced"] += 1

    # -- parameters

    def _param(self, node: ir.Node, index: int, what: str, *, dynamic_ok: bool = False):
        """The scale/zero-point input `index`: must be a constant (or DQL output if allowed)."""
        value = _input(node, index)
        if value is None or _const_tensor(value) is not None:
            return value
        producer = value.producer()
        if (
            dynamic_ok
            and producer is not None
            and producer.op_type == "DynamicQuantizeLinear"
            and producer.domain in QUANT_DOMAINS
        ):
            return value
        raise self._error(
            node, f"{what} '{value.name}' is not a constant (fold it to an initializer first)"
        )

    def _check_attrs(self, node: ir.Node) -> None:
        allowed = _ALLOWED_ATTRS.get(node.op_type, frozenset())
        for name, attr in node.attributes.items():
            if name not in allowed:
                raise self._error(node, f"attribute '{name}' is not supported")
            if name == "channels_last" and int(attr.value) != 0:
                raise self._error(node, "attribute channels_last=1 is not supported")

    def _check_dtype(self, node: ir.Node, value: ir.Value | None, allowed) -> None:
        dtype = _dtype_of(value)
        if dtype is not None and dtype not in allowed:
            raise self._error(node, f"dtype {dtype.name.lower()} is not supported")

    def _qlinear_params(self, node: ir.Node, slots: list[tuple[int, int, int]]) -> None:
        """Validate constant scales/zero points and int8/uint8 dtypes of a QLinear op."""
        self._check_attrs(node)
        for data, scale, zp in slots:
            self._param(node, scale, "scale")
            self._param(node, zp, "zero point")
            self._check_dtype(node, _input(node, zp), _QLINEAR_DTYPES)
            if data >= 0:
                self._check_dtype(node, _input(node, data), _QLINEAR_DTYPES)

    # -- building blocks for expansions

    def _dq(self, anchor, data, scale, zp, *, axis: int | None = None, tag: str) -> ir.Value:
        attrs = {} if axis is None else {"axis": axis}
        inputs = [data, scale] + ([zp] if zp is not None else [])
        node = self._insert(
            anchor,
            "DequantizeLinear",
            inputs,
            attrs,
            name=f"{_base_name(anchor)}/dq_{tag}",
            out_names=[self._float_name(data.name, "_dq")],
        )
        return node.outputs[0]

    def _q(self, anchor, x, scale, zp, *, out: ir.Value) -> ir.Value:
        inputs = [x, scale] + ([zp] if zp is not None else [])
        node = self._insert(
            anchor,
            "QuantizeLinear",
            inputs,
            name=f"{_base_name(anchor)}/q",
            out_names=[self._fresh_name(f"{out.name}_q")],
        )
        result = node.outputs[0]
        result.type, result.shape = out.type, out.shape
        return result

    def _float_op(
        self, anchor, op_type, inputs, attrs=None, *, out: ir.Value, name: str | None = None
    ) -> ir.Value:
        node = self._insert(
            anchor,
            op_type,
            inputs,
            attrs,
            name=name or _strip_quant_suffix(_base_name(anchor)),
            out_names=[self._float_name(out.name)],
        )
        return node.outputs[0]

    def _requantize(self, node, y, scale_index: int, zp_index: int) -> ir.Value:
        """Q on the float result when the fused op had a quantized output."""
        scale = _input(node, scale_index)
        if scale is None:
            return y
        return self._q(node, y, scale, _input(node, zp_index), out=node.outputs[0])

    @staticmethod
    def _axis_for(scale: ir.Value | None, axis: int) -> int | None:
        arr = _const(scale)
        return axis if arr is not None and arr.size > 1 else None

    # -- 1. expansions of fused ops

    def expand(self) -> None:
        handlers: dict[str, Callable[[ir.Node], None]] = {
            "QLinearConv": self._qlinear_conv,
            "QLinearMatMul": self._qlinear_matmul,
            "QLinearAdd": self._qlinear_binary,
            "QLinearMul": self._qlinear_binary,
            "QLinearConcat": self._qlinear_concat,
            "QLinearSigmoid": self._qlinear_unary,
            "QLinearLeakyRelu": self._qlinear_unary,
            "QLinearGlobalAveragePool": self._qlinear_unary,
            "QLinearAveragePool": self._qlinear_unary,
            "QLinearSoftmax": self._qlinear_softmax,
            "QGemm": self._qgemm,
            "ConvInteger": self._integer_fusion,
            "MatMulInteger": self._integer_fusion,
            "MatMulIntegerToFloat": self._matmul_integer_to_float,
            "DynamicQuantizeMatMul": self._dynamic_quantize_matmul,
            "MatMulNBits": self._matmul_nbits,
            "GatherBlockQuantized": self._gather_block_quantized,
        }
        for node in self._nodes():
            handler = handlers.get(node.op_type)
            if handler is not None and node.domain in QUANT_DOMAINS and node.graph is not None:
                handler(node)

    def _int32_constant(self, node: ir.Node, value: ir.Value, scale: np.ndarray, what: str):
        """A constant int32 accumulator input (bias, C) as float: value * scale."""
        arr = _const(value)
        if arr is None:
            raise self._error(node, f"{what} '{value.name}' is not a constant")
        return self._constant(node, arr.astype(np.float32) * scale, value)

    def _qlinear_conv(self, node: ir.Node) -> None:
        # x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, B
        self._qlinear_params(node, [(0, 1, 2), (3, 4, 5), (-1, 6, 7)])
        x, xs, xzp, w, ws, wzp = node.inputs[:6]
        xf = self._dq(node, x, xs, xzp, tag="x")
        wf = self._dq(node, w, ws, wzp, axis=self._axis_for(ws, 0), tag="w")
        inputs = [xf, wf]
        bias = _input(node, 8)
        if bias is not None:
            scale = (_const(xs) * _const(ws)).astype(np.float32).reshape(-1)
            inputs.append(self._int32_constant(node, bias, scale, "bias"))
        attrs = {k: a for k, a in node.attributes.items() if k in _CONV_ATTRS}
        y = self._float_op(node, "Conv", inputs, attrs, out=node.outputs[0])
        self._finish(node, [self._requantize(node, y, 6, 7)])

    def _qlinear_matmul(self, node: ir.Node) -> None:
        self._qlinear_params(node, [(0, 1, 2), (3, 4, 5), (-1, 6, 7)])
        a, as_, azp, b, bs, bzp = node.inputs[:6]
        af = self._dq(node, a, as_, azp, axis=self._axis_for(as_, -2), tag="a")
        bf = self._dq(node, b, bs, bzp, axis=self._axis_for(bs, -1), tag="b")
        y = self._float_op(node, "MatMul", [af, bf], out=node.outputs[0])
        self._finish(node, [self._requantize(node, y, 6, 7)])

    def _scalar_params(self, node: ir.Node, indices: list[int]) -> None:
        for i in indices:
            arr = _const(_input(node, i))
            if arr is not None and arr.size != 1:
                raise self._error(node, "per-axis scales or zero points are not supported")

    def _qlinear_binary(self, node: ir.Node) -> None:
        self._qlinear_params(node, [(0, 1, 2), (3, 4, 5), (-1, 6, 7)])
        self._scalar_params(node, [1, 2, 4, 5, 6, 7])
        a, as_, azp, b, bs, bzp = node.inputs[:6]
        af = self._dq(node, a, as_, azp, tag="a")
        bf = self._dq(node, b, bs, bzp, tag="b")
        op = "Add" if node.op_type == "QLinearAdd" else "Mul"
        y = self._float_op(node, op, [af, bf], out=node.outputs[0])
        self._finish(node, [self._requantize(node, y, 6, 7)])

    def _qlinear_concat(self, node: ir.Node) -> None:
        n_in = len(node.inputs)
        if n_in < 5 or (n_in - 2) % 3:
            raise self._error(
                node, f"expected Y_scale, Y_zero_point and triples, got {n_in} inputs"
            )
        triples = [(i, i + 1, i + 2) for i in range(2, n_in, 3)]
        self._qlinear_params(node, [*triples, (-1, 0, 1)])
        if "axis" not in node.attributes:
            raise self._error(node, "attribute 'axis' is missing")
        self._scalar_params(node, [0, 1, *(i for t in triples for i in t[1:])])
        parts = [
            self._dq(node, node.inputs[d], node.inputs[s], node.inputs[z], tag=str(k))
            for k, (d, s, z) in enumerate(triples)
        ]
        attrs = {"axis": _attr_int(node, "axis", 0)}
        y = self._float_op(node, "Concat", parts, attrs, out=node.outputs[0])
        self._finish(node, [self._requantize(node, y, 0, 1)])

    def _qlinear_unary(self, node: ir.Node) -> None:
        # X, X_scale, X_zp, Y_scale, Y_zp
        self._qlinear_params(node, [(0, 1, 2), (-1, 3, 4)])
        self._scalar_params(node, [1, 2, 3, 4])
        xf = self._dq(node, node.inputs[0], node.inputs[1], _input(node, 2), tag="x")
        op = node.op_type.removeprefix("QLinear")
        attrs: dict[str, Any] = {}
        if op == "LeakyRelu":
            attrs["alpha"] = _attr_float(node, "alpha", 0.01)
        elif op == "AveragePool":
            attrs = {k: a for k, a in node.attributes.items() if k in _POOL_ATTRS}
        y = self._float_op(node, op, [xf], attrs, out=node.outputs[0])
        self._finish(node, [self._requantize(node, y, 3, 4)])

    def _qlinear_softmax(self, node: ir.Node) -> None:
        self._qlinear_params(node, [(0, 1, 2), (-1, 3, 4)])
        self._scalar_params(node, [1, 2, 3, 4])
        if "opset" not in node.attributes:
            raise self._error(node, "attribute 'opset' is missing")
        semantics = _attr_int(node, "opset", 13)
        model_opset = self._opset(node)
        axis = _attr_int(node, "axis", -1 if semantics >= 13 else 1)
        xf = self._dq(node, node.inputs[0], node.inputs[1], _input(node, 2), tag="x")
        out = node.outputs[0]
        if (semantics >= 13) == (model_opset >= 13):
            y = self._float_op(node, "Softmax", [xf], {"axis": axis}, out=out)
        elif semantics < 13:
            # old semantics (coerced to 2-D at `axis`) in a model whose Softmax is per-axis
            flat = self._insert(
                node, "Flatten", [xf], {"axis": axis}, name=f"{_base_name(node)}/2d"
            )
            soft = self._insert(
                node, "Softmax", [flat.outputs[0]], {"axis": -1}, name=_base_name(node)
            )
            shape = self._insert(node, "Shape", [xf], name=f"{_base_name(node)}/shape")
            y = self._float_op(node, "Reshape", [soft.outputs[0], shape.outputs[0]], out=out)
        else:
            raise self._error(
                node, f"opset={semantics} softmax semantics in an opset {model_opset} model"
            )
        self._finish(node, [self._requantize(node, y, 3, 4)])

    def _qgemm(self, node: ir.Node) -> None:
        # A, a_scale, a_zp, B, b_scale, b_zp, C, y_scale, y_zp
        self._qlinear_params(node, [(0, 1, 2), (3, 4, 5), (-1, 7, 8)])
        a, as_, azp, b, bs, bzp = node.inputs[:6]
        trans_b = _attr_int(node, "transB", 0)
        alpha = _attr_float(node, "alpha", 1.0)
        af = self._dq(node, a, as_, azp, tag="a")
        bf = self._dq(node, b, bs, bzp, axis=self._axis_for(bs, 0 if trans_b else 1), tag="b")
        inputs = [af, bf]
        c = _input(node, 6)
        if c is not None:
            # C is int32 with scale alpha * a_scale * b_scale (onnxruntime's QGemm kernel).
            scale = (np.float32(alpha) * _const(as_) * _const(bs)).astype(np.float32)
            inputs.append(self._int32_constant(node, c, scale, "input C"))
        attrs = {
            "alpha": alpha,
            "beta": 1.0,
            "transA": _attr_int(node, "transA", 0),
            "transB": trans_b,
        }
        y = self._float_op(node, "Gemm", inputs, attrs, out=node.outputs[0])
        self._finish(node, [self._requantize(node, y, 7, 8)])

    def _matmul_integer_to_float(self, node: ir.Node) -> None:
        # A, B, a_scale, b_scale, a_zp, b_zp, bias
        self._check_attrs(node)
        a, b = node.inputs[0], node.inputs[1]
        as_ = self._param(node, 2, "a_scale", dynamic_ok=True)
        bs = self._param(node, 3, "b_scale")
        azp = self._param(node, 4, "a_zero_point", dynamic_ok=True)
        bzp = self._param(node, 5, "b_zero_point")
        self._scalar_params(node, [2])
        af = self._dq(node, a, as_, azp, tag="a")
        bf = self._dq(node, b, bs, bzp, axis=self._axis_for(bs, -1), tag="b")
        y = self._matmul_bias(node, af, bf, _input(node, 6))
        self._finish(node, [y])

    def _dynamic_quantize_matmul(self, node: ir.Node) -> None:
        # A (float), B, b_scale, b_zp, bias
        self._check_attrs(node)
        bs = self._param(node, 2, "b_scale")
        bzp = self._param(node, 3, "b_zero_point")
        bf = self._dq(node, node.inputs[1], bs, bzp, axis=self._axis_for(bs, -1), tag="b")
        y = self._matmul_bias(node, node.inputs[0], bf, _input(node, 4))
        self._finish(node, [y])

    def _matmul_bias(self, node, a, b, bias) -> ir.Value:
        if bias is None:
            return self._float_op(node, "MatMul", [a, b], out=node.outputs[0])
        mm = self._insert(
            node,
            "MatMul",
            [a, b],
            name=_base_name(node),
            out_names=[self._float_name(node.outputs[0].name, "_matmul")],
        )
        return self._float_op(node, "Add", [mm.outputs[0], bias], out=node.outputs[0])

    def _opset(self, node: ir.Node) -> int:
        owner = self.owner.get(node.graph)
        if isinstance(owner, ir.Function) and "" in owner.opset_imports:
            return owner.opset_imports[""]
        return self.model.opset_imports.get("", 1)

    # ConvInteger / MatMulInteger: the quantize_dynamic fusion

    def _integer_fusion(self, node: ir.Node) -> None:
        """DQL -> ConvInteger/MatMulInteger -> Cast -> Mul(scales) [-> Add bias] to float.

        Each integer input is either dynamic (a DynamicQuantizeLinear output with its zero
        point) or a constant. The Mul chain after the Cast must multiply by the dynamic
        scales and by constants; the constants (the weight scale) fold into the constant
        input. Anything else is left alone for the remaining-ops report.
        """
        self._check_attrs(node)
        sides = [self._integer_side(node, 0, 2), self._integer_side(node, 1, 3)]
        if None in sides:
            return
        chain = self._scale_chain(node, sides)
        if chain is None:
            return
        last_mul, factor, dtype = chain
        is_conv = node.op_type == "ConvInteger"
        const_sides = [i for i, side in enumerate(sides) if side[0] == "const"]
        weight_side = const_sides[-1] if const_sides else None
        arrays: dict[int, np.ndarray] = {}
        for i in const_sides:
            _, value, _, zp = sides[i]
            q = _const(value).astype(np.int64)
            zarr = _const(zp)
            if zarr is not None:
                q = q - self._broadcast_zp(zarr, q, axis=0 if (is_conv or i == 0) else -1)
            mult = np.float32(1.0)
            if factor is not None and i == weight_side:
                mult = self._weight_factor(factor, q, is_conv=is_conv, is_weight=i == 1)
                if mult is None:
                    return
            arrays[i] = (q.astype(np.float32) * mult).astype(dtype)
        operands: list[ir.Value] = []
        for i, (kind, value, scale, zp) in enumerate(sides):
            if kind == "dynamic":
                operands.append(self._dq(node, value, scale, zp, tag="ab"[i]))
            else:
                operands.append(self._constant(node, arrays[i], value))
        out = last_mul.outputs[0]
        attrs = dict(node.attributes) if is_conv else {}
        y = self._float_op(
            last_mul,
            "Conv" if is_conv else "MatMul",
            operands,
            attrs,
            out=out,
            name=_strip_quant_suffix(_base_name(node)),
        )
        self.origin[y.producer()] = (_label(node), node.op_type)
        if factor is not None and weight_side is None:  # both inputs dynamic
            scale_value = self._constant(last_mul, factor.astype(dtype), "dq_scale")
            mul = self._insert(
                last_mul,
                "Mul",
                [y, scale_value],
                name=f"{_base_name(node)}/scale",
                out_names=[self._float_name(out.name, "_scaled")],
            )
            y = mul.outputs[0]
        elif is_conv:
            out = self._fold_conv_bias(y, out, dtype)
        self._replace(out, y)
        self.counts["conv_integer_replaced" if is_conv else "matmul_integer_replaced"] += 1

    def _integer_side(self, node: ir.Node, data_index: int, zp_index: int):
        """(kind, data, scale, zp) for one input of an integer op, or None if unrecognised."""
        data, zp = _input(node, data_index), _input(node, zp_index)
        if data is None:
            return None
        if _const_tensor(data) is not None:
            if zp is not None and _const_tensor(zp) is None:
                raise self._error(node, f"zero point '{zp.name}' is not a constant")
            self._check_dtype(node, data, _QLINEAR_DTYPES)
            return ("const", data, None, zp)
        producer = data.producer()
        if (
            producer is not None
            and producer.op_type == "DynamicQuantizeLinear"
            and producer.domain in QUANT_DOMAINS
            and data is producer.outputs[0]
            and zp is producer.outputs[2]
        ):
            return ("dynamic", data, producer.outputs[1], zp)
        return None

    def _scale_chain(self, node: ir.Node, sides):
        """The Cast -> Mul... after an integer op: (last Mul, constant product, float dtype)."""
        out = node.outputs[0]
        uses = out.uses()
        if len(uses) != 1 or out.is_graph_output():
            return None
        cast = uses[0].node
        if cast.op_type != "Cast" or cast.domain not in ("", "ai.onnx"):
            return None
        to = DT(_attr_int(cast, "to", 0))
        if to != DT.FLOAT:  # DynamicQuantizeLinear reads float32: the float op stays float32
            return None
        need_dynamic = [s[2] for s in sides if s[0] == "dynamic"]  # may hold one scale twice
        need_const = any(s[0] == "const" for s in sides)
        consts: list[np.ndarray] = []
        cur, last = cast.outputs[0], None
        while need_dynamic or (need_const and not consts):
            uses = cur.uses()
            if len(uses) != 1 or cur.is_graph_output():
                return None
            mul, idx = uses[0].node, uses[0].idx
            if mul.op_type != "Mul" or mul.domain not in ("", "ai.onnx") or len(mul.inputs) != 2:
                return None
            leaves = self._factor_leaves(mul.inputs[1 - idx])
            if leaves is None:
                return None
            for leaf in leaves:
                if leaf in need_dynamic:
                    need_dynamic.remove(leaf)
                    continue
                arr = _const(leaf)
                if arr is None:
                    return None
                consts.append(arr.astype(np.float32))
            cur, last = mul.outputs[0], mul
        if last is None:
            return None
        product = None
        for arr in consts:
            product = arr if product is None else product * arr
        return last, product, to.numpy()

    def _factor_leaves(self, value: ir.Value | None, depth: int = 0) -> list[ir.Value] | None:
        """Leaves of a Mul tree of scales (constants and DynamicQuantizeLinear scales)."""
        if value is None or depth > 4:
            return None
        if _const(value) is not None:
            return [value]
        producer = value.producer()
        if producer is None:
            return None
        if producer.op_type == "DynamicQuantizeLinear" and value is producer.outputs[1]:
            return [value]
        if producer.op_type == "Mul" and producer.domain in ("", "ai.onnx"):
            left = self._factor_leaves(producer.inputs[0], depth + 1)
            right = self._factor_leaves(producer.inputs[1], depth + 1)
            if left is None or right is None:
                return None
            return left + right
        return None

    @staticmethod
    def _broadcast_zp(zp: np.ndarray, q: np.ndarray, axis: int) -> np.ndarray:
        zp = zp.astype(np.int64)
        if zp.size == 1:
            return zp.reshape(())
        shape = [1] * q.ndim
        shape[axis % q.ndim] = zp.size
        return zp.reshape(shape)

    @staticmethod
    def _weight_factor(
        factor: np.ndarray, q: np.ndarray, *, is_conv: bool, is_weight: bool
    ) -> np.ndarray | None:
        """The scale product (which multiplies the op output) reshaped onto the input q."""
        if factor.size == 1:
            return factor.reshape(())
        if not is_weight:
            return None
        if is_conv:
            # output [N, M, ...]: the factor must be per output channel M (dim 0 of W)
            padded = (1,) * (q.ndim - factor.ndim) + factor.shape
            if len(padded) != q.ndim or factor.size != q.shape[0] or padded[1] != q.shape[0]:
                return None
            return factor.reshape((q.shape[0],) + (1,) * (q.ndim - 1))
        # MatMul output [..., N]: the factor must vary along N only
        if factor.shape[-1] != q.shape[-1] or factor.size != q.shape[-1]:
            return None
        return factor.reshape(-1)

    def _fold_conv_bias(self, y: ir.Value, out: ir.Value, dtype) -> ir.Value:
        """Conv output + per-channel constant (the trailing bias Add) -> Conv bias input."""
        uses = out.uses()
        if len(uses) != 1 or out.is_graph_output():
            return out
        add, idx = uses[0].node, uses[0].idx
        if add.op_type != "Add" or add.domain not in ("", "ai.onnx") or len(add.inputs) != 2:
            return out
        bias = _const_eval(add.inputs[1 - idx])
        conv = y.producer()
        weight = _const(conv.inputs[1])
        if bias is None or weight is None or len(conv.inputs) > 2:
            return out
        channels, rank = weight.shape[0], weight.ndim
        padded = (1,) * (rank - bias.ndim) + bias.shape
        if len(padded) != rank or padded[1] != channels or bias.size != channels:
            return out
        value = self._bias_value(conv, add.inputs[1 - idx], bias.reshape(-1).astype(dtype))
        conv.resize_inputs(3)
        conv.replace_input_with(2, value)
        self.counts["bias_add_folded"] += 1
        return add.outputs[0]

    def _bias_value(self, conv: ir.Node, operand: ir.Value, bias: np.ndarray) -> ir.Value:
        """The 1-D bias: the original tensor when the Add used Reshape(b) of a 1-D `b`."""
        source = operand.producer()
        if source is not None and source.op_type == "Reshape":
            original = source.inputs[0]
            arr = _const(original)
            if arr is not None and arr.shape == bias.shape and arr.dtype == bias.dtype:
                return original
            return self._constant(conv, bias, original)
        return self._constant(conv, bias, operand)

    # weight-only ops

    def _matmul_nbits(self, node: ir.Node) -> None:
        # A, B [N, k_blocks, blob], scales, zero_points, g_idx, bias
        self._check_attrs(node)
        if _attr_int(node, "weight_prepacked", 0):
            raise self._error(node, "attribute weight_prepacked is not supported")
        if _input(node, 4) is not None:
            raise self._error(node, "input g_idx is not supported")
        bits = _attr_int(node, "bits", 4)
        if bits not in (2, 4, 8):
            raise self._error(node, f"bits={bits} is not supported")
        k, n, block = (_attr_int(node, a, 0) for a in ("K", "N", "block_size"))
        packed = self._const_input(node, 1, "B")
        scales = self._const_input(node, 2, "scales")
        zp_value = _input(node, 3)
        zps = None if zp_value is None else self._const_input(node, 3, "zero_points")
        k_blocks = -(-k // block)
        q = _unpack_bits(packed.reshape(n, k_blocks, -1), bits).reshape(n, -1)[:, :k]
        s = scales.reshape(n, k_blocks)
        out_dtype = scales.dtype
        if zps is None:
            zp = np.full((n, k_blocks), 1 << (bits - 1), dtype=np.float32)
        elif zps.dtype == np.uint8:
            zp = _unpack_bits(zps.reshape(n, -1), bits)[:, :k_blocks].astype(np.float32)
        else:
            zp = zps.reshape(n, k_blocks).astype(np.float32)
        s_full = np.repeat(s.astype(np.float32), block, axis=1)[:, :k]
        zp_full = np.repeat(zp, block, axis=1)[:, :k]
        weight = ((q.astype(np.float32) - zp_full) * s_full).T.astype(out_dtype)
        w = self._constant(node, np.ascontiguousarray(weight), node.inputs[1])
        y = self._matmul_bias(node, node.inputs[0], w, _input(node, 5))
        self._finish(node, [y])

    def _gather_block_quantized(self, node: ir.Node) -> None:
        # data, indices, scales, zero_points. One difference remains: the contrib op gives
        # zeros for an out-of-range index where Gather fails.
        self._check_attrs(node)
        data_value = node.inputs[0]
        dtype = _dtype_of(data_value)
        if dtype not in (DT.INT4, DT.UINT4, DT.UINT8):
            raise self._error(
                node, f"dtype {dtype.name.lower() if dtype else '?'} is not supported"
            )
        bits = _attr_int(node, "bits", 4)
        if bits not in (2, 4, 8):
            raise self._error(node, f"bits={bits} is not supported")
        block = _attr_int(node, "block_size", 128)
        data = self._const_input(node, 0, "data")
        scales = self._const_input(node, 2, "scales")
        zps = None if _input(node, 3) is None else self._const_input(node, 3, "zero_points")
        if dtype == DT.UINT8 and bits < 8:
            data = _unpack_bits(data, bits)
            if zps is not None:
                zps = _unpack_bits(zps, bits)
        rank = data.ndim
        qaxis = _attr_int(node, "quantize_axis", 1) % rank
        gaxis = _attr_int(node, "gather_axis", 0) % rank
        if zps is None:
            default = (1 << (bits - 1)) if dtype == DT.UINT8 else 0
            zps = np.full(scales.shape, default, dtype=np.int64)
        index = [slice(None)] * rank
        index[qaxis] = slice(0, scales.shape[qaxis])
        zps = zps[tuple(index)]  # packed zero points may carry padding
        table = _dequantize_array(
            data, scales, zps, axis=qaxis, block_size=block, out_dtype=scales.dtype
        )
        t = self._constant(node, table, data_value)
        y = self._float_op(
            node, "Gather", [t, node.inputs[1]], {"axis": gaxis}, out=node.outputs[0]
        )
        self._finish(node, [y])

    def _const_input(self, node: ir.Node, index: int, what: str) -> np.ndarray:
        arr = _const(_input(node, index))
        if arr is None:
            name = _input(node, index).name if _input(node, index) is not None else "?"
            raise self._error(node, f"{what} '{name}' is not a constant")
        return arr

    # -- 2. weight folding

    def fold(self) -> None:
        for node in self._nodes():
            is_dq = node.op_type == "DequantizeLinear" and node.domain in QUANT_DOMAINS
            if is_dq and _const_tensor(node.inputs[0]) is not None:
                self._fold_dq(node)

    def _fold_dq(self, node: ir.Node) -> None:
        data_value = node.inputs[0]
        dtype = _dtype_of(data_value)
        if dtype not in _QMIN:
            raise self._error(node, f"dtype {dtype.name.lower()} is not supported")
        scale_value = self._param(node, 1, "scale")
        zp_value = self._param(node, 2, "zero point")
        axis = _attr_int(node, "axis", 1)
        block = _attr_int(node, "block_size", 0)
        out_dtype_attr = _attr_int(node, "output_dtype", 0)
        key = (data_value, scale_value, zp_value, axis, block, out_dtype_attr, node.graph)
        value = self.folded.get(key)
        if value is None:
            scale = _const(scale_value)
            out_dtype = DT(out_dtype_attr).numpy() if out_dtype_attr else scale.dtype
            arr = _dequantize_array(
                _const(data_value),
                scale,
                _const(zp_value),
                axis=axis,
                block_size=block,
                out_dtype=out_dtype,
            )
            out = node.outputs[0]
            if out.name and not out.is_graph_output():  # its name is free for the constant
                free = out.name
                self._retire(out)
                self.names.discard(free)
            value = self._constant(node, arr, data_value)
            self.folded[key] = value
        self._replace(node.outputs[0], value)
        self._remove(node)
        if node not in self.internal:
            self.counts["weight_dq_folded"] += 1

    # -- 3. collapse

    def collapse(self) -> None:
        changed = True
        while changed:
            changed = False
            for node in self._nodes():
                if node.graph is None:
                    continue  # removed earlier in this sweep
                if node.op_type == "DequantizeLinear" and node.domain in QUANT_DOMAINS:
                    changed |= self._collapse_dq(node)

    def _collapse_dq(self, dq: ir.Node) -> bool:
        source = dq.inputs[0]
        producer = source.producer() if source is not None else None
        if producer is None:
            return False
        if producer.domain in QUANT_DOMAINS and producer.op_type == "QuantizeLinear":
            return self._collapse_pair(producer, dq)
        if producer.domain in QUANT_DOMAINS and producer.op_type == "DynamicQuantizeLinear":
            if (
                source is producer.outputs[0]
                and _input(dq, 1) is producer.outputs[1]
                and _input(dq, 2) is producer.outputs[2]
            ):
                self._replace(dq.outputs[0], producer.inputs[0])
                self._remove(dq)
                return True
            return False
        if producer.domain in ("", "ai.onnx") and producer.op_type in _PASSTHROUGH:
            return self._hoist(producer, dq)
        return False

    def _qdq_dtype(self, node: ir.Node, zp: ir.Value | None) -> ir.DataType:
        if zp is not None:
            return _dtype_of(zp)
        if node.op_type == "QuantizeLinear":
            out = _attr_int(node, "output_dtype", 0)
            return DT(out) if out else DT.UINT8
        return _dtype_of(node.inputs[0]) or DT.UINT8

    def _collapse_pair(self, q: ir.Node, dq: ir.Node) -> bool:
        for node in (q, dq):
            self._param(node, 1, "scale", dynamic_ok=True)
            self._param(node, 2, "zero point", dynamic_ok=True)
        qtype = self._qdq_dtype(q, _input(q, 2))
        if qtype not in _QMIN or qtype == DT.INT32:
            raise self._error(q, f"dtype {qtype.name.lower()} is not supported")
        same = (
            _same_param(_input(q, 1), _input(dq, 1), zero_default=False)
            and _same_param(_input(q, 2), _input(dq, 2), zero_default=True)
            and _attr_int(q, "block_size", 0) == _attr_int(dq, "block_size", 0)
        )
        scale = _const(_input(q, 1))
        if same and scale is not None and scale.size > 1:
            same = _attr_int(q, "axis", 1) == _attr_int(dq, "axis", 1)
        if not same:
            return False
        x = q.inputs[0]
        zp = _effective_zp(_input(q, 2))
        clamps = (
            zp is not None
            and scale is not None
            and bool(np.all(zp.astype(np.int64) == _QMIN[qtype]))
            and bool(np.all(scale > 0))
        )
        new = self._clamped(x, q) if clamps else x
        out_dtype = _attr_int(dq, "output_dtype", 0)
        if out_dtype and x.dtype is not None and DT(out_dtype) != x.dtype:
            name = self._float_name(dq.outputs[0].name, "_cast")
            new = self._insert(dq, "Cast", [new], {"to": out_dtype}, name=name).outputs[0]
        self._replace(dq.outputs[0], new)
        self._remove(dq)
        if q not in self.internal and dq not in self.internal:
            self.counts["qdq_pairs_collapsed"] += 1
        for usage in list(q.outputs[0].uses()):
            if usage.node.op_type in _SHAPE_ONLY_OPS:
                usage.node.replace_input_with(usage.idx, x)
        return True

    def _clamped(self, x: ir.Value, q: ir.Node) -> ir.Value:
        """`x`, behind a Relu when the quantized range [0, max] clamped negatives away."""
        if _const_tensor(x) is not None or _non_negative(x):
            return x
        if x in self.relu_of:
            return self.relu_of[x]
        name = self._fresh_name(f"{x.name}_relu")
        relu = self._insert(q, "Relu", [x], name=name, out_names=[name])
        out = relu.outputs[0]
        out.type, out.shape = x.type, x.shape
        self.relu_of[x] = out
        self.counts["relu_restored"] += 1
        return out

    def _hoist(self, op: ir.Node, dq: ir.Node) -> bool:
        """DQ(Transpose(q)) -> Transpose(DQ(q)) for per-tensor DQs (all users must agree)."""
        for i in (1, 2):
            value = _input(dq, i)
            if value is not None and not _is_scalar_param(value):
                return False
        data_in, data_out = _PASSTHROUGH[op.op_type]
        in_idx = range(len(op.inputs)) if data_in is None else data_in
        out_idx = range(len(op.outputs)) if data_out is None else data_out
        consumers: list[tuple[int, ir.Node]] = []
        for j in out_idx:
            value = op.outputs[j]
            if value.is_graph_output():
                return False
            for usage in value.uses():
                user = usage.node
                if not (
                    user.op_type == "DequantizeLinear"
                    and user.domain in QUANT_DOMAINS
                    and usage.idx == 0
                    and _same_param(_input(user, 1), _input(dq, 1), zero_default=False)
                    and _same_param(_input(user, 2), _input(dq, 2), zero_default=True)
                ):
                    return False
                consumers.append((j, user))
        inputs = list(op.inputs)
        for i in in_idx:
            if inputs[i] is not None:
                inputs[i] = self._dq(op, inputs[i], dq.inputs[1], _input(dq, 2), tag=f"in{i}")
        clone = self._insert(
            op,
            op.op_type,
            inputs,
            dict(op.attributes),
            name=op.name or _base_name(op),
            out_names=[self._float_name(o.name) for o in op.outputs],
            num_outputs=len(op.outputs),
        )
        self.origin.pop(clone, None)
        for j, user in consumers:
            self._replace(user.outputs[0], clone.outputs[j])
            self._remove(user)
        for j, out in enumerate(op.outputs):
            if j not in out_idx and out.uses():
                self._replace(out, clone.outputs[j])
        if not any(o.uses() or o.is_graph_output() for o in op.outputs):
            self._remove(op)
        self.counts["passthrough_converted"] += 1
        return True

    # -- 4. cleanup and the remaining-ops check

    def cleanup(self) -> None:
        RemoveUnusedNodesPass()(self.model)
        for graph in self.model.graph.subgraphs():
            for name, value in list(graph.initializers.items()):
                if not value.uses() and not value.is_graph_output():
                    del graph.initializers[name]
        RemoveUnusedOpsetsPass()(self.model)

    def unique_node_names(self) -> None:
        """onnxruntime refuses duplicate node names: suffix the ones this rewrite created.

        (onnx_ir's NameFixPass would also name every unnamed original node; this touches
        only the nodes created here.)
        """
        for graph in self._graph_likes():
            taken = {n.name for n in graph if n.name and n not in self.internal}
            for node in graph:
                if node in self.internal and node.name:
                    base, i = node.name, 0
                    while node.name in taken:
                        i += 1
                        node.name = f"{base}_{i}"
                    taken.add(node.name)

    def find_remaining(self) -> None:
        self.remaining = []
        main = self.model.graph
        for node in self._nodes():
            if not _is_quant_op(node.op_type, node.domain):
                continue
            if node.graph is main and self._is_interface(node):
                continue
            origin = self._origin_of(node)
            if origin not in self.remaining:
                self.remaining.append(origin)

    @staticmethod
    def _is_interface(node: ir.Node) -> bool:
        """A lone DQ of a graph input or a Q feeding only graph outputs: the model's I/O."""
        if node.op_type == "DequantizeLinear":
            return node.inputs[0] is not None and node.inputs[0].is_graph_input()
        if node.op_type == "QuantizeLinear":
            out = node.outputs[0]
            return out.is_graph_output() and not out.uses()
        return False

    def run(self) -> None:
        self.expand()
        self.fold()
        self.collapse()
        self.fold()  # DQs that hoisting moved onto constants
        self.cleanup()
        self.unique_node_names()
        self.find_remaining()
