"""A copy of a model without the bytes of its large tensors, for the tools that need only
the graph (shape inference, the version converter, the checker).

Given a model with its weights loaded, onnx's shape inference and version converter
serialize the whole proto and build their own copies: on the full-size SAM 3 vision
encoder (1.8 GB of weights) shape inference peaked at 8.9 GB and the opset converter at
16.2 GB, and a proto over 2 GiB fails outright. What they read of an initializer is its
name, type and dims (and the values of small ones, e.g. a Reshape's shape), so a view
whose large initializers are marked external, as `onnx.load(load_external_data=False)`
leaves them, gives the same result. `with_weights` puts the bytes back into a model
made from a view (moving them, so the two copies never coexist).
"""

from __future__ import annotations

import numpy as np
import onnx

LIMIT_BYTES = 1024  # what onnx keeps inline when it saves with external data
PLACEHOLDER = "winml-recipes:light-view"


def _nbytes(tensor: onnx.TensorProto) -> int:
    if tensor.HasField("raw_data"):
        return len(tensor.raw_data)
    count = int(np.prod(tensor.dims)) if tensor.dims else 1
    return count * 8  # an upper bound for the typed fields (float_data, int64_data, ...)


def light_view(model: onnx.ModelProto, limit: int = LIMIT_BYTES) -> onnx.ModelProto:
    """`model` without the data of initializers over `limit` bytes (marked external)."""
    graph = model.graph
    # Everything but the graph's initializers, then the initializers one by one.
    view = _copy_without(model, "graph")
    view.graph.CopyFrom(_copy_without(graph, "initializer"))
    for tensor in graph.initializer:
        if _nbytes(tensor) > limit:
            stub = view.graph.initializer.add()
            stub.name = tensor.name
            stub.data_type = tensor.data_type
            stub.dims.extend(tensor.dims)
            stub.data_location = onnx.TensorProto.EXTERNAL
            entry = stub.external_data.add()
            entry.key, entry.value = "location", PLACEHOLDER
        else:
            view.graph.initializer.add().CopyFrom(tensor)
    return view


def _copy_without(message, skipped: str):
    """A copy of a proto message without its field `skipped` (nothing large is copied)."""
    out = type(message)()
    for field, value in message.ListFields():
        if field.name == skipped:
            continue
        if isinstance(value, str | bytes | int | float | bool):
            setattr(out, field.name, value)
        elif hasattr(value, "CopyFrom"):  # a message
            getattr(out, field.name).CopyFrom(value)
        else:  # a repeated field
            getattr(out, field.name).extend(value)
    return out


def with_weights(made: onnx.ModelProto, source: onnx.ModelProto) -> onnx.ModelProto:
    """`made` (from a light view of `source`) with the bytes of its placeholder tensors
    moved from `source`'s initializers of the same name; `source` loses them."""
    originals = {t.name: t for t in source.graph.initializer}
    for tensor in made.graph.initializer:
        if not _is_placeholder(tensor):
            continue
        original = originals[tensor.name]
        tensor.CopyFrom(original)
        original.Clear()  # the bytes now live in `made` only
    return made


def _is_placeholder(tensor: onnx.TensorProto) -> bool:
    return tensor.data_location == onnx.TensorProto.EXTERNAL and any(
        e.key == "location" and e.value == PLACEHOLDER for e in tensor.external_data
    )
