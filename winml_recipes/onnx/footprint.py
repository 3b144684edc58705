"""How much memory running or rewriting a model takes, estimated from its graph alone.

Two numbers are read from the model without loading its weights: the bytes of its
initializers, and the peak of its live activations when the nodes run in graph order at
the catalog's shapes (a tensor lives from the node that makes it to its last reader, as
onnxruntime's memory planner schedules it). No library does the second: onnx's shape
inference gives each tensor's shape, the liveness walk is ours.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import onnx
from onnx import helper

MB = 1024 * 1024


@dataclass(frozen=True)
class Footprint:
    """Weights and the activation peak of one forward pass (bytes)."""

    weight_bytes: int
    activation_peak_bytes: int
    unknown_tensors: int  # activations whose size shape inference could not tell

    @property
    def weight_mb(self) -> float:
        return self.weight_bytes / MB

    @property
    def activation_mb(self) -> float:
        return self.activation_peak_bytes / MB


def _itemsize(elem_type: int) -> int:
    try:
        return helper.tensor_dtype_to_np_dtype(elem_type).itemsize
    except (KeyError, TypeError, ValueError):
        return 4


def weight_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the initializers (and Constant values), inline or external alike."""
    total = 0
    for t in model.graph.initializer:
        total += math.prod(t.dims) * _itemsize(t.data_type)
    for node in model.graph.node:
        if node.op_type == "Constant":
            for a in node.attribute:
                if a.type == onnx.AttributeProto.TENSOR:
                    total += math.prod(a.t.dims) * _itemsize(a.t.data_type)
    return total


def _with_input_shapes(
    model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]
) -> onnx.ModelProto:
    """A copy of the graph (no weights' bytes: lightview) whose inputs have the given
    concrete shapes."""
    from winml_recipes.onnx.lightview import light_view

    copy = light_view(model)
    for inp in copy.graph.input:
        shape = shapes.get(inp.name)
        if shape is None or not inp.type.HasField("tensor_type"):
            continue
        dims = inp.type.tensor_type.shape.dim
        if len(dims) != len(shape):
            continue
        for d, v in zip(dims, shape, strict=True):
            d.Clear()
            d.dim_value = int(v)
    return copy


def _sizes(model: onnx.ModelProto, bytes_: bool = True) -> dict[str, int | None]:
    """Bytes (or elements) of every typed tensor shape inference can size (None: not
    static)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception:  # inference is best effort: a model it rejects still runs
        inferred = model
    g = inferred.graph
    out: dict[str, int | None] = {}
    for vi in [*g.input, *g.value_info, *g.output]:
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
            out[vi.name] = None
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        if any(d is None for d in dims):
            out[vi.name] = None
        else:
            size = _itemsize(tt.elem_type) if bytes_ else 1
            out[vi.name] = math.prod(dims) * size  # type: ignore[arg-type]
    return out


def activation_elements(path: Path, input_shapes: Mapping[str, Sequence[int]] | None = None) -> int:
    """Elements of every sized activation of the graph, summed."""
    from winml_recipes.onnx.io import load_model

    model = load_model(Path(path), load_external_data=False)
    initializers = {t.name for t in model.graph.initializer}
    sized = _sizes(_with_input_shapes(model, input_shapes or {}), bytes_=False)
    return sum(e or 0 for n, e in sized.items() if n not in initializers)


def largest_activation(
    path: Path, input_shapes: Mapping[str, Sequence[int]] | None = None
) -> tuple[str, int]:
    """The activation with the most elements (name, elements) at `input_shapes` (default:
    the graph's own); ("", 0) when none is sized. Elements, not bytes: an EP stores it at
    its own precision (16-bit activations on an NPU)."""
    from winml_recipes.onnx.io import load_model

    return largest_activation_of(load_model(Path(path), load_external_data=False), input_shapes)


def largest_activation_of(
    model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]] | None = None
) -> tuple[str, int]:
    """`largest_activation` of a graph in memory."""
    initializers = {t.name for t in model.graph.initializer}
    sized = _sizes(_with_input_shapes(model, input_shapes or {}), bytes_=False)
    best = ("", 0)
    for name, elements in sized.items():
        if name not in initializers and elements and elements > best[1]:
            best = (name, elements)
    return best


def footprint(path: Path, input_shapes: Mapping[str, Sequence[int]]) -> Footprint:
    """Weights and activation peak of `path` at `input_shapes` (graph read, weights not)."""
    stat = Path(path).stat()
    shapes = tuple(sorted((k, tuple(v)) for k, v in input_shapes.items()))
    return _footprint(str(path), stat.st_size, stat.st_mtime_ns, shapes)


@lru_cache(maxsize=32)
def _footprint(
    path: str, size: int, mtime_ns: int, shapes: tuple[tuple[str, tuple[int, ...]], ...]
) -> Footprint:
    from winml_recipes.onnx.io import load_model

    input_shapes = dict(shapes)
    model = load_model(Path(path), load_external_data=False)
    weights = weight_bytes(model)
    sized = _sizes(_with_input_shapes(model, input_shapes))
    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    outputs = {o.name for o in graph.output}
    last_use: dict[str, int] = {}
    for i, node in enumerate(graph.node):
        for name in node.input:
            if name and name not in initializers:
                last_use[name] = i
    end = len(graph.node)
    for name in outputs:
        last_use[name] = end
    unknown = 0
    live = 0
    for inp in graph.input:
        if inp.name not in initializers:
            live += sized.get(inp.name) or 0
    peak = live
    freed_at: dict[int, list[str]] = {}
    for name, i in last_use.items():
        freed_at.setdefault(i, []).append(name)
    for i, node in enumerate(graph.node):
        for name in node.output:
            if not name:
                continue
            size = sized.get(name)
            if size is None:
                unknown += 1
                continue
            live += size
        peak = max(peak, live)
        for name in freed_at.get(i, []):
            live -= sized.get(name) or 0
        for name in node.output:  # made and never read: freed at once
            if name and name not in last_use:
                live -= sized.get(name) or 0
    return Footprint(weights, peak, unknown)
