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
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    shapes = {
        vi.name: [
            d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim
        ]
        for vi in [*inferred.graph.value_info, *inferred.graph.input]
        if vi.type.tensor_type.HasField("shape")
    }
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
