"""Deterministic synthetic inputs from tensor specs, and specs derived from a graph."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from winml_recipes.onnx.digest import dtype_name, graph_inputs
from winml_recipes.sdk.contract import TensorSpec, resolve_shape

DEFAULT_FLOAT_RANGE = (-1.0, 1.0)
DEFAULT_INT_RANGE = (0, 10)  # low inclusive, high exclusive
DEFAULT_DIM = 1
# One synthetic input of at most 1 GiB of float32 (full-size SAM 3's largest is 3 M).
MAX_INPUT_ELEMENTS = 1 << 28
_ALIASES = {"float": "float32", "double": "float64", "half": "float16"}


def make_inputs(
    specs: Sequence[TensorSpec], dims: Mapping[str, int], seed: int, count: int = 1
) -> list[dict[str, np.ndarray]]:
    """`count` feeds, the same for the same seed (feed i does not depend on `count`).

    Floats are uniform in spec.range (default [-1, 1)); integers uniform in
    [low, high) of spec.range (default [0, 10)); bools uniform; `values` picks among them.
    """
    for s in specs:
        shape = resolve_shape(s, dims)
        elements = int(np.prod(shape, dtype=np.int64))
        if elements > MAX_INPUT_ELEMENTS or 0 in shape:
            from winml_recipes.sdk.errors import PlanError

            raise PlanError(
                f"input '{s.name}': shape {list(shape)} has {elements} elements "
                f"(allowed: 1 to {MAX_INPUT_ELEMENTS}); check the dims"
            )
    rng = np.random.default_rng(seed)
    return [{s.name: _draw(s, resolve_shape(s, dims), rng) for s in specs} for _ in range(count)]


def _draw(spec: TensorSpec, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    dtype = np.dtype(_ALIASES.get(spec.dtype, spec.dtype))
    if spec.values:
        return rng.choice(np.asarray(spec.values), size=shape).astype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if np.issubdtype(dtype, np.integer):
        low, high = spec.range or DEFAULT_INT_RANGE
        low, high = int(low), int(high)
        if high <= low:
            raise ValueError(f"input '{spec.name}': empty integer range [{low}, {high})")
        return rng.integers(low, high, size=shape, dtype=dtype)
    if np.issubdtype(dtype, np.floating):
        low, high = spec.range or DEFAULT_FLOAT_RANGE
        return rng.uniform(float(low), float(high), size=shape).astype(dtype)
    raise ValueError(f"input '{spec.name}': cannot generate data of dtype {spec.dtype}")


_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Integer inputs whose only safe synthetic value is known from the name (BERT-style).
_KNOWN_VALUES = {"token_type_ids": (0,), "attention_mask": (1,)}


def dim_names(model: onnx.ModelProto) -> dict[tuple[str, int], str]:
    """A catalog name for every dynamic dim of the graph's inputs and outputs, by
    (tensor, position).

    Converters write dims no catalog can name: `p2o.DynamicDimension.0`, `?`, torch
    dynamo's `((4//s3)) - 1`, or a value of -1 or 0. Identifier names are kept; any other
    dynamic dim becomes `<tensor>_dim<i>`, and the same raw name maps to the same catalog
    name everywhere, so dims the model shares stay shared.
    """
    raw_to_name: dict[str, str] = {}
    out: dict[tuple[str, int], str] = {}
    for vi in [*graph_inputs(model.graph), *model.graph.output]:
        for i, d in enumerate(vi.type.tensor_type.shape.dim):
            if d.HasField("dim_value") and d.dim_value > 0:
                continue
            raw = d.dim_param if d.HasField("dim_param") else ""
            fallback = re.sub(r"\W", "_", f"{vi.name}_dim{i}")
            if not re.match(r"[A-Za-z_]", fallback):
                fallback = f"_{fallback}"
            if raw and _IDENTIFIER.match(raw):
                name = raw
            elif raw:
                name = raw_to_name.setdefault(raw, fallback)
            else:
                name = fallback
            out[(vi.name, i)] = name
    return out


def specs_from_model(model: onnx.ModelProto) -> tuple[list[TensorSpec], dict[str, int]]:
    """Input specs read from the graph, for models without an I/O contract.

    Dynamic dims get catalog names (`dim_names`) and default to 1. Integer inputs named
    token_type_ids / attention_mask get their one safe value (0 / 1); other integers a
    small range (an index into a table the model may not have more of).
    """
    specs: list[TensorSpec] = []
    dims: dict[str, int] = {}
    names = dim_names(model)
    for vi in graph_inputs(model.graph):
        tt = vi.type.tensor_type
        shape: list[int | str] = []
        for i, d in enumerate(tt.shape.dim):
            if (vi.name, i) not in names:
                shape.append(int(d.dim_value))
            else:
                name = names[(vi.name, i)]
                dims.setdefault(name, DEFAULT_DIM)
                shape.append(name)
        dtype = dtype_name(tt.elem_type)
        np_dtype = np.dtype(dtype) if dtype not in ("string", "undefined") else None
        value_range: tuple[float, float] | None = None
        if np_dtype is not None and np.issubdtype(np_dtype, np.floating):
            value_range = DEFAULT_FLOAT_RANGE
        elif np_dtype is not None and np.issubdtype(np_dtype, np.integer):
            value_range = DEFAULT_INT_RANGE
        values = _KNOWN_VALUES.get(vi.name) if value_range == DEFAULT_INT_RANGE else None
        if values is not None:
            value_range = None
        specs.append(TensorSpec(vi.name, dtype, tuple(shape), value_range, values))
    return specs, dims
