"""Quantization rules the QNN HTP backend needs beyond onnxruntime's `get_qnn_qdq_config`.

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
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import onnx

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


def shared_encoding_groups(model: onnx.ModelProto, activations: Iterable[str]) -> list[list[str]]:
    """Sets of activations that must end up with one encoding (transitively merged)."""
    acts = set(activations)
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(members: list[str]) -> None:
        members = [t for t in members if t in acts]
        for other in members[1:]:
            parent[find(other)] = find(members[0])

    needs: set[str] = set()
    for node in model.graph.node:
        positions = SHARED_ENCODING_INPUTS.get(node.op_type)
        if positions is not None:
            members = [node.input[i] for i in positions if i < len(node.input)]
            union([*members, node.output[0]])
            needs.add(node.output[0])
        elif node.op_type in SAME_AS_INPUT and node.input:
            for out in node.output:
                union([node.input[0], out])
    groups: dict[str, list[str]] = {}
    for t in parent:
        groups.setdefault(find(t), []).append(t)
    return [sorted(g) for g in groups.values() if len(g) > 1 and needs.intersection(g)]


def unify_ranges(
    ranges: Mapping[str, tuple[float, float]], groups: Iterable[list[str]]
) -> dict[str, tuple[float, float]]:
    """Every member of a group gets the union of the group's ranges."""
    out = dict(ranges)
    for group in groups:
        known = [out[t] for t in group if t in out]
        if not known:
            continue
        low = min(lo for lo, _ in known)
        high = max(hi for _, hi in known)
        for t in group:
            out[t] = (low, high)
    return out


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


def fold_nan_guards(model: onnx.ModelProto) -> int:
    """In a QDQ graph, `Where(IsNaN(t), v, t)` with t a DequantizeLinear output -> t.

    A dequantized value is never NaN, so the guard (what exporters write for SDPA's
    `softmax.masked_fill(isnan, 0)`) selects t everywhere: exact in the quantized graph.
    HTP cannot finalize a graph where a boolean made from quantized values (IsNaN of a
    DQ output, then Where) feeds quantized ops: QNN_COMMON_ERROR_MEM_ALLOC in a five-node
    graph, and in every dynamo-exported BERT (measured, onnxruntime-qnn 2.7). Returns the
    guards removed.
    """
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    consumers = _consumers(graph)
    outputs = {o.name for o in graph.output}
    folded = 0
    for check in [n for n in graph.node if n.op_type in ("IsNaN", "IsInf")]:
        tensor = check.input[0]
        source = producer.get(tensor)
        if source is None or source.op_type != "DequantizeLinear":
            continue
        for where in consumers.get(check.output[0], []):
            if where.op_type != "Where" or list(where.input[::2]) != [check.output[0], tensor]:
                continue
            if where.output[0] in outputs:
                continue
            _rewire(graph, where.output[0], tensor)  # its Q now requantizes t
            graph.node.remove(where)
            folded += 1
    if folded:
        _drop_dead(model)
    return folded


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


# Add/Sub of an all-zero constant followed by a Relu that the quantizer folds into the Q/DQ
# pair is wrong on HTP (3 dB SQNR against 95 dB on the CPU EP, in a two-node graph); the
# same Add with a constant of 1e-6, or without the Relu, is right. SAM 3's mask decoder has
# such zero biases (proj_in of its MLPs in a random-weight model). They compute nothing, so
# they are bypassed in the float graph before calibration.
NO_OP_CONSTANT = {"Add": 0.0, "Sub": 0.0}


def drop_zero_constant_adds(model: onnx.ModelProto) -> list[str]:
    """Bypass `x + 0` / `x - 0` (constant all-zero operand, no broadcasting growth).

    Returns the names of the nodes removed. A node whose output is a graph output becomes an
    Identity instead, so output names never change.
    """
    from onnx import numpy_helper

    graph = model.graph
    constants = {t.name: t for t in graph.initializer}
    shapes = _shapes(model)
    graph_outputs = {o.name for o in graph.output}
    rename: dict[str, str] = {}
    removed: list[str] = []
    keep = []
    for node in graph.node:
        for k, name in enumerate(node.input):
            node.input[k] = rename.get(name, name)
        zero_at = _zero_operand(node, constants, numpy_helper)
        if zero_at is None:
            keep.append(node)
            continue
        other = node.input[1 - zero_at]
        if node.op_type == "Sub" and zero_at == 0:
            keep.append(node)  # 0 - x is not x
            continue
        const_shape = list(constants[node.input[zero_at]].dims)
        if not _keeps_shape(shapes.get(other), const_shape):
            keep.append(node)
            continue
        removed.append(node.name or node.output[0])
        if node.output[0] in graph_outputs:
            keep.append(
                onnx.helper.make_node("Identity", [other], [node.output[0]], name=node.name)
            )
        else:
            rename[node.output[0]] = other
    for out in graph.output:
        out.name = rename.get(out.name, out.name)
    del graph.node[:]
    graph.node.extend(keep)
    return removed


def _shapes(model: onnx.ModelProto) -> dict[str, list[int | None]]:
    """Inferred shapes of the graph's values (None for a dim that is not static)."""
    from winml_recipes.onnx.lightview import light_view

    inferred = onnx.shape_inference.infer_shapes(light_view(model), strict_mode=False)
    return {
        vi.name: [d.dim_value if d.HasField("dim_value") else None for d in dims]
        for vi in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]
        if vi.type.tensor_type.HasField("shape")
        for dims in [vi.type.tensor_type.shape.dim]
    }


def _zero_operand(node: onnx.NodeProto, constants, numpy_helper) -> int | None:
    if node.op_type not in NO_OP_CONSTANT or len(node.input) != 2:
        return None
    for k in (1, 0):
        tensor = constants.get(node.input[k])
        if tensor is not None:
            values = numpy_helper.to_array(tensor)
            if values.dtype.kind == "f" and values.size and not values.any():
                return k
    return None


def _keeps_shape(shape: list[int | None] | None, const_shape: list[int]) -> bool:
    """Broadcasting `const_shape` onto `shape` leaves `shape` unchanged."""
    if shape is None or len(const_shape) > len(shape):
        return False
    for got, c in zip(reversed(shape), reversed(const_shape), strict=False):
        if c != 1 and got != c:
            return False
    return True


# --------------------------------------------------------------------------- exact rewrites
#
# Exporters write `x[..., k] = f(x[..., k])` as Gather -> f -> Unsqueeze -> ScatterElements
# (torch's select_scatter). Quantized, one tensor then holds both the old and the new
# channel values (SAM 3: pixels in [0, 112] and fractions in [0, 1]); 8 bits cannot carry
# both (pred_masks 3 dB on HTP and in the CPU simulation alike), and HTP cannot finalize
# the u8/u16 mixes that would widen just that tensor. Written as one elementwise op with a
# per-channel constant (identity elsewhere), every tensor keeps a single meaning. The
# rewrites below are exact in float; they run before calibration.

_ELEMENTWISE = {"Add": 0.0, "Sub": 0.0, "Mul": 1.0, "Div": 1.0}


def simplify_for_htp(model: onnx.ModelProto) -> dict[str, int]:
    """Identity removal, Transpose pairs that cancel, channel scatters as elementwise ops,
    inference BatchNormalization as Mul + Add, a Where choosing between two float scalar
    constants as arithmetic, erf GELUs as one Gelu, and chains of elementwise ops by constants
    merged, scatters of constants at constant positions as a Mul and an Add, and GatherND at
    constant indices as a Reshape (and Gather). Returns counts per rewrite."""
    counts = {
        "identities": 0, "transpose_pairs": 0, "channel_scatters": 0, "merged": 0,
        "batchnorms": 0, "constant_wheres": 0, "gelus": 0, "constant_scatters": 0,
        "constant_gathernds": 0, "folded_shape_ops": 0,
    }  # fmt: skip
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
           for n in model.graph.node for a in n.attribute):  # fmt: skip
        return counts  # subgraphs read outer names: left as they are
    counts["folded_shape_ops"] += _fold_shape_computations(model)
    counts["identities"] += _drop_identities(model)
    counts["batchnorms"] += _batchnorms_to_elementwise(model)
    counts["constant_wheres"] += _constant_wheres_to_arithmetic(model)
    counts["gelus"] += _fuse_erf_gelus(model)
    counts["transpose_pairs"] += _cancel_transposes(model)
    counts["channel_scatters"] += _scatters_to_elementwise(model)
    counts["constant_scatters"] += _constant_scatters_to_arithmetic(model)
    counts["constant_gathernds"] += _constant_gathernds_to_gather(model)
    _drop_dead(model)  # the Gathers that fed the scatters: merging needs single readers
    counts["identities"] += _drop_identities(model)
    counts["merged"] += _merge_constant_chains(model)
    _drop_dead(model)
    return counts


# Ops that compute from shapes: once every input dim is static, what they feed is a constant.
SHAPE_OPS = frozenset({"Shape", "Size", "Range", "ConstantOfShape"})


def _fold_shape_computations(model: onnx.ModelProto) -> int:
    """Constant-fold the graph (onnxscript's optimizer, its size limits) when it still
    computes from shapes; returns the nodes removed.

    HTP refuses Range and GatherND, and the rewrites here need constant operands: a
    Hugging Face BERT exported by torch's dynamo builds its attention mask's GatherND
    indices from Shape -> Range -> Expand, constants once `fix_shapes` ran. (The target
    preparation step is meant to do this before quantize; then this finds nothing.)
    """
    if not any(n.op_type in SHAPE_OPS for n in model.graph.node):
        return 0
    import onnx_ir as ir
    import onnxscript.optimizer

    before = len(model.graph.node)
    folded = ir.from_proto(model)
    onnxscript.optimizer.optimize(folded)
    model.CopyFrom(ir.to_proto(folded))
    return before - len(model.graph.node)


def _consumers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    out: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            out.setdefault(name, []).append(node)
    return out


def _rewire(graph: onnx.GraphProto, old: str, new: str) -> None:
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = new


def _drop_identities(model: onnx.ModelProto) -> int:
    graph = model.graph
    outputs = {o.name for o in graph.output}
    dropped = 0
    for node in list(graph.node):
        if node.op_type == "Identity" and node.output[0] not in outputs:
            _rewire(graph, node.output[0], node.input[0])
            graph.node.remove(node)
            dropped += 1
    return dropped


def _cancel_transposes(model: onnx.ModelProto) -> int:
    graph = model.graph
    outputs = {o.name for o in graph.output}
    producer = {o: n for n in graph.node for o in n.output}
    consumers = _consumers(graph)
    cancelled = 0
    for second in list(graph.node):
        if second.op_type != "Transpose":
            continue
        first = producer.get(second.input[0])
        if first is None or first.op_type != "Transpose" or first.output[0] in outputs:
            continue
        if len(consumers.get(first.output[0], [])) != 1:
            continue
        p = _perm(first)
        q = _perm(second)
        if p is None or q is None or len(p) != len(q):
            continue
        if [p[i] for i in q] != list(range(len(p))):
            continue
        if second.output[0] in outputs:
            continue
        _rewire(graph, second.output[0], first.input[0])
        graph.node.remove(second)
        graph.node.remove(first)
        cancelled += 1
        producer = {o: n for n in graph.node for o in n.output}
        consumers = _consumers(graph)
    return cancelled


def _perm(node: onnx.NodeProto) -> list[int] | None:
    return next((list(a.ints) for a in node.attribute if a.name == "perm"), None)


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


def _scatters_to_elementwise(model: onnx.ModelProto) -> int:
    import numpy as np
    from onnx import numpy_helper

    graph = model.graph
    shapes = _shapes(model)
    producer = {o: n for n in graph.node for o in n.output}
    rewritten = 0
    for node in list(graph.node):
        if node.op_type != "ScatterElements":
            continue
        if any(a.name == "reduction" and a.s not in (b"", b"none") for a in node.attribute):
            continue
        data, indices, updates = node.input
        shape = shapes.get(data)
        if not shape or any(d is None for d in shape):
            continue
        rank = len(shape)
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0) % rank
        k = _scalar_index(model, producer, indices)
        unsq = producer.get(updates)
        if k is None or unsq is None or unsq.op_type != "Unsqueeze":
            continue
        f = producer.get(unsq.input[0])
        if f is None:
            continue
        if f.op_type == "Gather" and _is_channel(model, f, data, k, axis, rank):
            op, c = "Mul", np.float32(1.0)  # x[..., k] = x[..., k]: nothing changes
        elif f.op_type in _ELEMENTWISE:
            g = producer.get(f.input[0])
            c = _constant(model, f.input[1])
            if g is None or c is None or not _is_channel(model, g, data, k, axis, rank):
                continue
            op = f.op_type
        else:
            continue
        trailing = rank - 1 - axis
        c = np.asarray(c, dtype=np.float32)
        if c.ndim > trailing:
            continue
        table_shape = [shape[axis]] + [1] * (trailing - c.ndim) + list(c.shape)
        table = np.full(table_shape, _ELEMENTWISE.get(op, 1.0), dtype=np.float32)
        table[k] = np.broadcast_to(c, table_shape[1:])
        name = f"{node.output[0]}_channel_{op.lower()}"
        graph.initializer.append(numpy_helper.from_array(table, name))
        index = list(graph.node).index(node)
        graph.node.remove(node)
        graph.node.insert(
            index, onnx.helper.make_node(op, [data, name], [node.output[0]], name=node.name)
        )
        rewritten += 1
    return rewritten


def _constant_scatters_to_arithmetic(model: onnx.ModelProto) -> int:
    """ScatterElements / ScatterND writing constant updates at constant indices into a
    tensor of static shape -> x * keep + table (keep 0 where written, 1 elsewhere; table the
    updates where written, 0 elsewhere): exact for finite x.

    HTP writes a scatter's update integers into the data with the data's encoding (see the
    module docstring); a constant update is quantized as a weight with its own scale, so
    the written values come out wrong (SAM 3's box corners from another exporter:
    `corner[:, :, 2] = not_a_point_embed`, 5.5 dB against the CPU EP on that tensor). As
    a Mul and an Add by constants, every tensor keeps its own encoding and HTP requantizes.
    """
    import numpy as np
    from onnx import numpy_helper

    graph = model.graph
    shapes = _shapes(model)
    producer = {o: n for n in graph.node for o in n.output}
    rewritten = 0
    for node in list(graph.node):
        if node.op_type not in ("ScatterElements", "ScatterND") or len(node.input) != 3:
            continue
        if any(a.name == "reduction" and a.s not in (b"", b"none") for a in node.attribute):
            continue
        data, indices, updates = node.input
        shape = shapes.get(data)
        index = _constant_or_expanded(model, producer, indices, shapes)
        values = _constant(model, updates)
        if not shape or any(d is None for d in shape) or index is None or values is None:
            continue
        if values.dtype.kind != "f" or index.dtype.kind not in "iu":
            continue
        keep = np.ones(shape, dtype=values.dtype)
        table = np.zeros(shape, dtype=values.dtype)
        try:
            if node.op_type == "ScatterElements":
                axis = next((a.i for a in node.attribute if a.name == "axis"), 0) % len(shape)
                where = index % shape[axis]
                values = np.broadcast_to(values, where.shape)
                np.put_along_axis(keep, where, 0, axis)
                np.put_along_axis(table, where, values, axis)
            else:
                where = tuple(np.moveaxis(index, -1, 0) % np.array(shape[: index.shape[-1]])
                              .reshape(-1, *[1] * (index.ndim - 1)))  # fmt: skip
                keep[where] = 0
                table[where] = values
        except (ValueError, IndexError):
            continue  # shapes the op would refuse: left as it is
        base = node.output[0]
        k_name, t_name, mid = f"{base}_scatter_keep", f"{base}_scatter_table", f"{base}_kept"
        graph.initializer.extend(
            [numpy_helper.from_array(keep, k_name), numpy_helper.from_array(table, t_name)]
        )
        at = list(graph.node).index(node)
        graph.node.remove(node)
        graph.node.insert(at, onnx.helper.make_node(
            "Add", [mid, t_name], [base], name=f"{node.name or base}_table"))  # fmt: skip
        graph.node.insert(at, onnx.helper.make_node(
            "Mul", [data, k_name], [mid], name=f"{node.name or base}_keep"))  # fmt: skip
        rewritten += 1
    return rewritten


def _constant_gathernds_to_gather(model: onnx.ModelProto) -> int:
    """GatherND(x, constant indices) -> Reshape(x, [n, *rest]) -> Gather(axis 0, flat
    indices), or a single Reshape when the flat indices are 0..n-1 in order; exact.

    HTP refuses GatherND; dynamo's BERT export reads its attention mask that way
    (`mask[None, None, :, :]` as GatherND with indices [[0, 0], [0, 1], ...]).
    """
    import numpy as np
    from onnx import numpy_helper

    graph = model.graph
    shapes = _shapes(model)
    rewritten = 0
    for node in list(graph.node):
        if node.op_type != "GatherND":
            continue
        if any(a.name == "batch_dims" and a.i for a in node.attribute):
            continue
        index = _constant(model, node.input[1])
        shape = shapes.get(node.input[0])
        if index is None or index.ndim < 1 or not shape or None in shape:
            continue
        k = index.shape[-1]
        if k > len(shape) or index.dtype.kind not in "iu":
            continue
        lead, rest = np.array(shape[:k]), shape[k:]
        if not ((-lead <= index) & (index < lead)).all():
            continue  # out of range: the op would fail, left as it is
        flat = np.ravel_multi_index(tuple(np.moveaxis(index % lead, -1, 0)), lead)
        count = int(np.prod(lead))
        out_shape = [*index.shape[:-1], *rest]
        base = node.output[0]
        at = list(graph.node).index(node)
        graph.node.remove(node)
        new: list[onnx.NodeProto] = []
        if flat.size == count and (flat.ravel() == np.arange(count)).all():
            source = node.input[0]
        else:
            flat_name, rows = f"{base}_flat_shape", f"{base}_rows"
            graph.initializer.extend([
                numpy_helper.from_array(np.array([count, *rest], np.int64), flat_name),
                numpy_helper.from_array(flat.astype(np.int64), f"{base}_flat_indices"),
            ])  # fmt: skip
            new += [
                onnx.helper.make_node("Reshape", [node.input[0], flat_name], [rows]),
                onnx.helper.make_node("Gather", [rows, f"{base}_flat_indices"], [f"{base}_picked"]),
            ]
            source = f"{base}_picked"
        graph.initializer.append(
            numpy_helper.from_array(np.array(out_shape, np.int64), f"{base}_shape")
        )
        new.append(onnx.helper.make_node("Reshape", [source, f"{base}_shape"], [base]))
        for j, n in enumerate(new):
            n.name = f"{node.name or base}_{j}"
            graph.node.insert(at + j, n)
        rewritten += 1
    return rewritten


def _constant_or_expanded(model: onnx.ModelProto, producer, name: str, shapes):
    """A constant, or an Expand of a constant to a static shape, as an array (else None)."""
    import numpy as np

    value = _constant(model, name)
    if value is not None:
        return value
    node = producer.get(name)
    shape = shapes.get(name)
    if node is None or node.op_type != "Expand" or not shape or None in shape:
        return None
    value = _constant(model, node.input[0])
    return None if value is None else np.broadcast_to(value, shape)


def _batchnorms_to_elementwise(model: onnx.ModelProto) -> int:
    """BatchNormalization (inference) -> x * s + b with per-channel constants, exactly.

    A BatchNormalization that no Conv absorbs (one on a sequence, after a Transpose, as
    in text recognizers) is wrong on HTP in a 16-bit QDQ graph: 6.9 dB against 32 dB in
    the CPU EP's simulation of the same model, and everything after it follows. As a Mul
    and an Add by constants it is right (measured, onnxruntime-qnn 2.7, QNN SDK 2.51).
    """
    import numpy as np
    from onnx import numpy_helper

    graph = model.graph
    shapes = _shapes(model)
    rewritten = 0
    for node in list(graph.node):
        if node.op_type != "BatchNormalization" or len(node.output) != 1:
            continue
        if any(a.name == "training_mode" and a.i for a in node.attribute):
            continue
        values = [_constant(model, name) for name in node.input[1:5]]
        rank = len(shapes.get(node.input[0]) or [])
        if rank < 2 or any(v is None for v in values):
            continue
        gamma, beta, mean, var = (np.asarray(v, np.float64) for v in values)
        eps = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-5)
        scale = gamma / np.sqrt(var + eps)
        shift = beta - mean * scale
        per_channel = [-1] + [1] * (rank - 2)
        base = node.output[0]
        s_name, b_name, mid = f"{base}_bn_scale", f"{base}_bn_shift", f"{base}_bn_scaled"
        graph.initializer.extend([
            numpy_helper.from_array(scale.reshape(per_channel).astype(np.float32), s_name),
            numpy_helper.from_array(shift.reshape(per_channel).astype(np.float32), b_name),
        ])  # fmt: skip
        index = list(graph.node).index(node)
        graph.node.remove(node)
        graph.node.insert(index, onnx.helper.make_node(
            "Add", [mid, b_name], [base], name=f"{node.name or base}_shift"))  # fmt: skip
        graph.node.insert(index, onnx.helper.make_node(
            "Mul", [node.input[0], s_name], [mid], name=f"{node.name or base}_scale"))  # fmt: skip
        rewritten += 1
    return rewritten


def _constant_wheres_to_arithmetic(model: onnx.ModelProto) -> int:
    """Where(c, a, b) with float scalar constants a, b -> Cast(c) * (a - b) + b, exactly.

    onnxruntime's quantizer leaves such a Where's constants in float; HTP then fails to
    finalize the graph (QNN_COMMON_ERROR_MEM_ALLOC), as on the attention mask BERT builds
    with `Where(mask, 0, finfo.min)`. As a Mul and an Add their constants are quantized
    like any weight (measured, onnxruntime-qnn 2.7, QNN SDK 2.51).
    """
    import numpy as np
    from onnx import numpy_helper

    graph = model.graph
    rewritten = 0
    for node in list(graph.node):
        if node.op_type != "Where":
            continue
        a, b = (_constant(model, name) for name in node.input[1:3])
        if a is None or b is None or a.size != 1 or b.size != 1 or a.dtype.kind != "f":
            continue
        if not (np.isfinite(a).all() and np.isfinite(b).all()):
            continue  # 0 * inf is NaN: an infinite mask stays a Where (and in float)
        base = node.output[0]
        names = [f"{base}_{k}" for k in ("cond", "delta", "scaled", "base")]
        cond, delta, scaled, offset = names
        # in float64: 0 - finfo.min is finfo.max, exactly representable
        step = np.asarray(a, np.float64) - np.asarray(b, np.float64)
        step = np.clip(step, -np.finfo(a.dtype).max, np.finfo(a.dtype).max).astype(a.dtype)
        graph.initializer.extend([
            numpy_helper.from_array(step.reshape(a.shape), delta),
            numpy_helper.from_array(np.asarray(b, a.dtype), offset),
        ])  # fmt: skip
        index = list(graph.node).index(node)
        graph.node.remove(node)
        new = [
            onnx.helper.make_node(
                "Cast", [node.input[0]], [cond], to=onnx.helper.np_dtype_to_tensor_dtype(a.dtype)
            ),
            onnx.helper.make_node("Mul", [cond, delta], [scaled]),
            onnx.helper.make_node("Add", [scaled, offset], [base]),
        ]
        for k, new_node in enumerate(new):
            new_node.name = f"{node.name or base}_{new_node.op_type.lower()}"
            graph.node.insert(index + k, new_node)
        rewritten += 1
    return rewritten


def _fuse_erf_gelus(model: onnx.ModelProto) -> int:
    """x * 0.5 * (1 + erf(x / sqrt(2))) (as exporters write GELU) -> com.microsoft Gelu.

    The QNN EP takes no Erf (HTP refuses the node), and has a Gelu.
    """
    import math

    graph = model.graph
    consumers = _consumers(graph)
    producer = {o: n for n in graph.node for o in n.output}

    def scalar(name: str) -> float | None:
        value = _constant(model, name)
        return float(value) if value is not None and value.size == 1 else None

    def only(name: str, op: str) -> onnx.NodeProto | None:
        readers = consumers.get(name, [])
        return readers[0] if len(readers) == 1 and readers[0].op_type == op else None

    def other(node: onnx.NodeProto, name: str) -> str:
        return node.input[1] if node.input[0] == name else node.input[0]

    fused = 0
    for erf in [n for n in graph.node if n.op_type == "Erf"]:
        scale = producer.get(erf.input[0])
        if scale is None or scale.op_type not in ("Div", "Mul"):
            continue
        x, c = scale.input[0], scalar(scale.input[1])
        if c is None or not math.isclose(c if scale.op_type == "Div" else 1 / c, math.sqrt(2),
                                         rel_tol=1e-3):  # fmt: skip
            continue
        add = only(erf.output[0], "Add")
        if add is None or scalar(other(add, erf.output[0])) != 1.0:
            continue
        m1 = only(add.output[0], "Mul")
        if m1 is None:
            continue
        first = other(m1, add.output[0])
        m2 = only(m1.output[0], "Mul")
        if m2 is None:
            continue
        second = other(m2, m1.output[0])
        if {first, second} - {x} and sorted([first == x, second == x]) != [False, True]:
            continue
        half = second if first == x else first
        if scalar(half) != 0.5:
            continue
        gelu = onnx.helper.make_node("Gelu", [x], [m2.output[0]], name=f"{erf.name or x}_gelu",
                                     domain="com.microsoft")  # fmt: skip
        graph.node.insert(list(graph.node).index(erf), gelu)  # after x, before any reader
        # typed, since onnx's shape inference does not know the op: calibration ranges
        # (and so quantization) need the output's type
        elem = onnx.helper.np_dtype_to_tensor_dtype(_constant(model, half).dtype)
        graph.value_info.append(onnx.helper.make_tensor_value_info(m2.output[0], elem, None))
        dead = [erf, add, m1, m2]
        if len(consumers.get(scale.output[0], [])) == 1:
            dead.append(scale)
        for node in dead:
            graph.node.remove(node)
        fused += 1
    if fused and not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    return fused


def _scalar_index(model: onnx.ModelProto, producer, name: str) -> int | None:
    import numpy as np

    value = _constant(model, name)
    if value is None:
        node = producer.get(name)
        if node is None or node.op_type != "Expand":
            return None
        value = _constant(model, node.input[0])
    if value is None or value.size == 0:
        return None
    flat = np.asarray(value).ravel()
    return int(flat[0]) if (flat == flat[0]).all() else None


def _is_channel(model, gather: onnx.NodeProto, data: str, k: int, axis: int, rank: int) -> bool:
    if gather.op_type != "Gather" or gather.input[0] != data:
        return False
    g_axis = next((a.i for a in gather.attribute if a.name == "axis"), 0) % rank
    index = _constant(model, gather.input[1])
    return g_axis == axis and index is not None and index.ndim == 0 and int(index) == k


def _merge_constant_chains(model: onnx.ModelProto) -> int:
    """op(op(x, A), B) -> op(x, A (*|+) B) for Mul/Div (product) and Add/Sub (sum) by
    constants, when the inner result has no other reader."""
    import numpy as np
    from onnx import numpy_helper

    graph = model.graph
    outputs = {o.name for o in graph.output}
    merged = 0
    changed = True
    while changed:
        changed = False
        producer = {o: n for n in graph.node for o in n.output}
        consumers = _consumers(graph)
        for outer in list(graph.node):
            if outer.op_type not in _ELEMENTWISE:
                continue
            inner = producer.get(outer.input[0])
            if inner is None or inner.op_type != outer.op_type or inner.output[0] in outputs:
                continue
            if len(consumers.get(inner.output[0], [])) != 1:
                continue
            a, b = _constant(model, inner.input[1]), _constant(model, outer.input[1])
            if a is None or b is None or a.dtype != b.dtype:
                continue
            combined = a * b if outer.op_type in ("Mul", "Div") else a + b
            name = f"{outer.output[0]}_merged"
            graph.initializer.append(numpy_helper.from_array(np.asarray(combined), name))
            outer.input[0], outer.input[1] = inner.input[0], name
            graph.node.remove(inner)
            merged += 1
            changed = True
            break
    return merged


def _drop_dead(model: onnx.ModelProto) -> None:
    graph = model.graph
    needed = {o.name for o in graph.output}
    keep = []
    for node in reversed(list(graph.node)):
        if any(o in needed for o in node.output):
            keep.append(node)
            needed.update(node.input)
    del graph.node[:]
    graph.node.extend(reversed(keep))
    used = needed
    for t in list(graph.initializer):
        if t.name not in used:
            graph.initializer.remove(t)
