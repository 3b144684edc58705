"""What the dequantize rules and passes share: op tables and read-only helpers on values.

Nothing here edits a graph: constants as numpy, parameter comparisons, the exact
`(q - zp) * scale` arithmetic, and what an op's output can be (non-negative, per-tensor).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from winml_recipes.onnx.quant import (
    DYNAMIC_OPS,
    QDQ_OPS,
    QOPERATOR_OPS,
    QUANT_DOMAINS,
    WEIGHT_ONLY_OPS,
)

DT = ir.DataType

# Quantized ops the detector does not list; they count as quantized (and unsupported).
EXTRA_QUANT_OPS = frozenset(
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
QUANT_OPS = QDQ_OPS | QOPERATOR_OPS | DYNAMIC_OPS | WEIGHT_ONLY_OPS | EXTRA_QUANT_OPS

# Lowest representable value per integer dtype (Q/DQ data types this module handles).
QMIN = {
    DT.INT8: -128,
    DT.UINT8: 0,
    DT.INT16: -32768,
    DT.UINT16: 0,
    DT.INT4: -8,
    DT.UINT4: 0,
    DT.INT32: -(2**31),
}
QLINEAR_DTYPES = frozenset({DT.INT8, DT.UINT8})
FLOAT_DTYPES = frozenset({DT.FLOAT, DT.FLOAT16, DT.BFLOAT16, DT.DOUBLE})

# Ops whose output is non-negative: no Relu needs restoring behind them.
NON_NEGATIVE_OPS = frozenset({"Relu", "Sigmoid", "Softmax", "Abs", "Exp", "Sqrt", "Softplus"})

# Ops whose output is non-negative when their data inputs are (index None: all inputs).
SIGN_PRESERVING_OPS: dict[str, tuple[int, ...] | None] = {
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
PASSTHROUGH: dict[str, tuple[tuple[int, ...] | None, tuple[int, ...] | None]] = {
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
SHAPE_ONLY_OPS = frozenset({"Shape", "Size"})

# Allowed attributes per fused op (anything else is refused, never silently dropped).
CONV_ATTRS = frozenset({"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"})
POOL_ATTRS = frozenset(
    {"auto_pad", "ceil_mode", "count_include_pad", "kernel_shape", "pads", "strides"}
)
ALLOWED_ATTRS: dict[str, frozenset[str]] = {
    "QLinearConv": CONV_ATTRS | {"channels_last"},
    "QLinearMatMul": frozenset(),
    "QLinearAdd": frozenset(),
    "QLinearMul": frozenset(),
    "QLinearConcat": frozenset({"axis"}),
    "QLinearSigmoid": frozenset(),
    "QLinearLeakyRelu": frozenset({"alpha"}),
    "QLinearGlobalAveragePool": frozenset({"channels_last"}),
    "QLinearAveragePool": POOL_ATTRS | {"channels_last"},
    "QLinearSoftmax": frozenset({"axis", "opset"}),
    "QGemm": frozenset({"alpha", "transA", "transB"}),
    "ConvInteger": CONV_ATTRS,
    "MatMulInteger": frozenset(),
    "MatMulIntegerToFloat": frozenset(),
    "DynamicQuantizeMatMul": frozenset(),
    "MatMulNBits": frozenset(
        {"K", "N", "bits", "block_size", "accuracy_level", "weight_prepacked"}
    ),
    "GatherBlockQuantized": frozenset({"bits", "block_size", "quantize_axis", "gather_axis"}),
}

# Ops reported as "replaced N <op>": the detector's QOperator and weight-only families and


def is_quant_op(op_type: str, domain: str) -> bool:
    if domain not in QUANT_DOMAINS:
        return False
    return op_type in QUANT_OPS or op_type.startswith("QLinear")


def strip_quant_suffix(name: str | None) -> str:
    base = name or "dq"
    for tail in ("_output_quantized", "_QuantizeLinear_Output", "_quantized", "_quant"):
        if base.endswith(tail) and len(base) > len(tail):
            return base[: -len(tail)]
    return base


def base_name(node: ir.Node) -> str:
    """A name to derive new node names from: the node's, else its first output's."""
    if node.name:
        return node.name
    outs = [o.name for o in node.outputs if o.name]
    return outs[0] if outs else node.op_type


def label(node: ir.Node) -> str:
    if node.name:
        return node.name
    outs = [o.name for o in node.outputs if o.name]
    return f"<{outs[0]}>" if outs else "<unnamed>"


def input_at(node: ir.Node, index: int) -> ir.Value | None:
    return node.inputs[index] if index < len(node.inputs) else None


def attr_int(node: ir.Node, name: str, default: int) -> int:
    attr = node.attributes.get(name)
    return default if attr is None else int(attr.value)


def attr_float(node: ir.Node, name: str, default: float) -> float:
    attr = node.attributes.get(name)
    return default if attr is None else float(attr.value)


def to_numpy(tensor: ir.TensorProtocol) -> np.ndarray:
    """The tensor as numpy; 4-bit (and 2-bit) types come back unpacked as int8/uint8."""
    arr = tensor.numpy()
    name = tensor.dtype.name
    if name in ("INT4", "INT2"):
        return arr.astype(np.int8)
    if name in ("UINT4", "UINT2"):
        return arr.astype(np.uint8)
    return arr


def const_tensor(value: ir.Value | None) -> ir.TensorProtocol | None:
    if value is None:
        return None
    try:
        return ir.convenience.get_const_tensor(value)
    except ValueError:  # a malformed Constant node: treat as not constant
        return None


def const(value: ir.Value | None) -> np.ndarray | None:
    tensor = const_tensor(value)
    return None if tensor is None else to_numpy(tensor)


def dtype_of(value: ir.Value | None) -> ir.DataType | None:
    if value is None:
        return None
    tensor = const_tensor(value)
    if tensor is not None:
        return tensor.dtype
    return value.dtype


def const_eval(value: ir.Value | None) -> np.ndarray | None:
    """A constant, or Reshape/Unsqueeze/Identity of constants (how bias shapes are made).

    Three numpy lines instead of a constant-folding pass: only the bias of a dynamic
    ConvInteger needs it, and folding the whole graph would change unrelated nodes.
    """
    arr = const(value)
    if arr is not None or value is None:
        return arr
    node = value.producer()
    if node is None or node.domain not in ("", "ai.onnx"):
        return None
    data = const(input_at(node, 0))
    if data is None:
        return None
    if node.op_type == "Identity":
        return data
    if node.op_type == "Reshape":
        shape = const(input_at(node, 1))
        if shape is None:
            return None
        dims = [
            data.shape[i] if d == 0 and not attr_int(node, "allowzero", 0) else int(d)
            for i, d in enumerate(shape.tolist())
        ]
        return data.reshape(dims)
    if node.op_type == "Unsqueeze":
        axes = const(input_at(node, 1))
        if axes is None and "axes" in node.attributes:
            axes = np.array(node.attributes["axes"].value)
        if axes is None:
            return None
        rank = data.ndim + len(axes)
        return np.expand_dims(data, tuple(sorted(int(a) % rank for a in axes.tolist())))
    return None


def non_negative(value: ir.Value, depth: int = 0) -> bool:
    """True when `value` is the output of an op that cannot produce negative numbers."""
    node = value.producer()
    if node is None or depth > 8 or node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type in NON_NEGATIVE_OPS:
        return True
    if node.op_type == "Cast":  # from bool or an unsigned integer
        source = node.inputs[0].dtype if node.inputs and node.inputs[0] is not None else None
        return source in (DT.BOOL, DT.UINT8, DT.UINT16, DT.UINT32, DT.UINT64)
    if node.op_type not in SIGN_PRESERVING_OPS:
        return False
    if node.op_type == "Pad":
        fill = const(input_at(node, 2))
        if input_at(node, 2) is not None and (fill is None or np.any(fill < 0)):
            return False
    indices = SIGN_PRESERVING_OPS[node.op_type]
    inputs = node.inputs if indices is None else [input_at(node, i) for i in indices]
    return all(v is not None and non_negative(v, depth + 1) for v in inputs)


def is_scalar_param(value: ir.Value) -> bool:
    """A per-tensor scale/zero point: a one-element constant or a DynamicQuantizeLinear output."""
    arr = const(value)
    if arr is not None:
        return arr.size == 1
    producer = value.producer()
    return producer is not None and producer.op_type == "DynamicQuantizeLinear"


def effective_zp(zp: ir.Value | None) -> np.ndarray | None:
    """The zero point as an array (zeros when absent), or None when not a constant."""
    arr = const(zp)
    if arr is not None:
        return arr
    if zp is None:
        return np.zeros((), dtype=np.int64)
    return None


def same_param(a: ir.Value | None, b: ir.Value | None, *, zero_default: bool) -> bool:
    """Same scale/zero point: the same value, or equal constants (absent zp == zeros)."""
    if a is b:
        return True
    if zero_default:
        aa, bb = effective_zp(a), effective_zp(b)
    else:
        aa, bb = const(a), const(b)
    if aa is None or bb is None:
        return False
    if aa.size != bb.size:
        return False
    return bool(
        np.array_equal(aa.reshape(-1).astype(np.float64), bb.reshape(-1).astype(np.float64))
    )


def dequantize_array(
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


def unpack_bits(packed: np.ndarray, bits: int) -> np.ndarray:
    """uint8 bytes -> values, low-order bits first, along the last axis."""
    per_byte = 8 // bits
    mask = (1 << bits) - 1
    shifts = np.arange(per_byte, dtype=np.uint8) * bits
    values = (packed[..., None] >> shifts) & mask
    return values.reshape(*packed.shape[:-1], packed.shape[-1] * per_byte).astype(np.uint8)
