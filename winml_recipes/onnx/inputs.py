"""Deterministic synthetic inputs from tensor specs, and specs derived from a graph."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from winml_recipes.onnx.digest import dtype_name, graph_inputs
from winml_recipes.sdk.contract import ImagePreprocess, TensorSpec, resolve_shape

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
    if _is_mask(spec, shape):
        # as a tokenizer pads: ones, then zeros; at least one position kept per row
        rows = int(np.prod(shape[:-1], dtype=np.int64))
        kept = rng.integers(1, shape[-1] + 1, size=rows)
        mask = np.arange(shape[-1])[None, :] < kept[:, None]
        return mask.reshape(shape).astype(dtype)
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
_KNOWN_VALUES = {"token_type_ids": (0,), "attention_mask": (0, 1)}


def _is_mask(spec: TensorSpec, shape: tuple[int, ...]) -> bool:
    """An integer {0, 1} input named like a mask, over a sequence: drawn as padding is.

    Calibrating with no masked position leaves a mask path (`(1 - m) * finfo.min`) a
    range of 0, so the quantized model would ignore the mask; all-ones masks did.
    """
    return (
        spec.name.endswith("mask")
        and spec.values is not None
        and sorted(spec.values) == [0, 1]
        and len(shape) >= 2
        and shape[-1] > 0
    )


def dim_names(model: onnx.ModelProto) -> dict[tuple[str, int], str]:
    """A catalog name for every dynamic dim of the graph's inputs and outputs, by
    (tensor, position).

    Converters write dims no catalog can name: `p2o.DynamicDimension.0`, `?`, torch
    dynamo's `((4//s3)) - 1`, or a value of -1 or 0. Identifier names are kept (a name
    such as dynamo's `s3` says two dims are one). Anonymous dims (no name, `?`, a number)
    and a non-identifier name that a tensor repeats (`[?, 3, 48, ?]` is not square) get
    one name per position, `<tensor>_dim<i>`; any other non-identifier name maps to one
    catalog name everywhere, so dims the model shares stay shared.
    """
    raw_to_name: dict[str, str] = {}
    out: dict[tuple[str, int], str] = {}
    for vi in [*graph_inputs(model.graph), *model.graph.output]:
        dims = vi.type.tensor_type.shape.dim
        raws = [d.dim_param if d.HasField("dim_param") else "" for d in dims]
        for i, d in enumerate(dims):
            if d.HasField("dim_value") and d.dim_value > 0:
                continue
            raw = raws[i]
            fallback = re.sub(r"\W", "_", f"{vi.name}_dim{i}")
            if not re.match(r"[A-Za-z_]", fallback):
                fallback = f"_{fallback}"
            if raw and _IDENTIFIER.match(raw):
                name = raw
            elif names_one_dim(raw, raws):
                name = raw_to_name.setdefault(raw, fallback)
            else:
                name = fallback
            out[(vi.name, i)] = name
    return out


# Dim params that name nothing: empty, `?`, `-1`, `None`, a bare number.
_ANONYMOUS = re.compile(r"^\s*(\?|-?\d*|None|none|unk|unknown)?\s*$")


def names_one_dim(raw: str, tensor_dims: list[str]) -> bool:
    """Whether the dim param `raw` names one dim wherever it appears: an identifier, or
    a converter's name the tensor (`tensor_dims`: its dim params) does not repeat."""
    if raw and _IDENTIFIER.match(raw):
        return True
    return not _ANONYMOUS.match(raw) and tensor_dims.count(raw) == 1


# Ops an integer input passes through on its way to what it indexes or masks.
# Clip only ever moves a value into its bounds, so a value that indexes right unclipped still
# does after it (SAM's labels are clamped at 0 before indexing the point embeddings).
_PASS_THROUGH = frozenset(
    {"Cast", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Identity", "Expand", "Transpose",
     "Clip"}
)  # fmt: skip
_MASK_OPS = frozenset({"Not", "And", "Or", "Xor"})
# What an image model takes when nothing says otherwise: ImageNet's normalization.
IMAGE_MEAN = (0.485, 0.456, 0.406)
IMAGE_STD = (0.229, 0.224, 0.225)
MIN_IMAGE_SIDE = 16  # smaller 3-channel inputs are not taken for images


def _readers(model: onnx.ModelProto) -> dict[str, list[onnx.NodeProto]]:
    out: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in dict.fromkeys(node.input):
            out.setdefault(name, []).append(node)
    return out


def _constant_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    shapes = {t.name: tuple(t.dims) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            attr = next((a for a in node.attribute if a.name == "value"), None)
            if attr is not None:
                shapes[node.output[0]] = tuple(attr.t.dims)
    return shapes


def _small_constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Values of the integer constants with one element (initializers and Constant nodes)."""
    from onnx import numpy_helper

    tensors = {t.name: t for t in model.graph.initializer if _is_scalar(t)}
    for node in model.graph.node:
        if node.op_type == "Constant":
            attr = next((a for a in node.attribute if a.name == "value"), None)
            if attr is not None and _is_scalar(attr.t):
                tensors[node.output[0]] = attr.t
    return {name: numpy_helper.to_array(t) for name, t in tensors.items()}


def _is_scalar(tensor: onnx.TensorProto) -> bool:
    return int(np.prod(tensor.dims)) == 1 and tensor.data_type in _INT_TYPES


_INT_TYPES = frozenset({onnx.TensorProto.INT64, onnx.TensorProto.INT32,
                        onnx.TensorProto.INT16, onnx.TensorProto.INT8})  # fmt: skip


def integer_values(
    model: onnx.ModelProto, name: str
) -> tuple[tuple[int, int] | None, tuple[int, ...] | None]:
    """(range, values) that are safe for the integer input `name`, read from the graph.

    Ids that index a constant table (Gather, through casts, reshapes, Clip, and Add/Sub of
    an integer constant) stay within its rows: token ids below the embedding's vocabulary,
    token_type_ids below its type count, SAM's point labels (`label + 1`, or
    `clamp(label, 0)`, into a 4-row table) in what the table holds. An input that only
    becomes a boolean (Cast to bool, Not/And/Or) is a mask: {0, 1}. (None, None) when the
    graph says neither.
    """
    readers = _readers(model)
    tables = _constant_shapes(model)
    offsets = _small_constants(model)
    bounds: list[tuple[int, int]] = []  # [low, high) of the input, per table it indexes
    boolean = False
    seen: set[tuple[str, int]] = set()
    pending = [(name, 0)]  # (tensor, what was added to the input to make it)
    while pending:
        tensor, shift = pending.pop()
        if (tensor, shift) in seen:
            continue
        seen.add((tensor, shift))
        for node in readers.get(tensor, []):
            if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == tensor:
                table = tables.get(node.input[0])
                axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                if table and -len(table) <= axis < len(table) and table[axis] > 0:
                    bounds.append((-shift, int(table[axis]) - shift))
            elif node.op_type in _MASK_OPS or (
                node.op_type == "Cast" and _cast_to(node) == onnx.TensorProto.BOOL
            ):
                boolean = True
            elif node.op_type in _PASS_THROUGH and node.input[0] == tensor:
                pending.extend((out, shift) for out in node.output)
            elif node.op_type in ("Add", "Sub") and len(node.input) == 2:
                other = node.input[1] if node.input[0] == tensor else node.input[0]
                value = offsets.get(other)
                if value is None or (node.op_type == "Sub" and node.input[0] != tensor):
                    continue
                step = int(value.ravel()[0])
                pending.append((node.output[0], shift + (step if node.op_type == "Add" else -step)))
    if bounds:
        low = max(lo for lo, _ in bounds)
        high = min(hi for _, hi in bounds)
        if low < high:
            return (low, high), None
    if boolean:
        return None, (0, 1)
    return None, None


def _cast_to(node: onnx.NodeProto) -> int | None:
    return next((a.i for a in node.attribute if a.name == "to"), None)


def image_preprocess(shape: Sequence[int | str]) -> ImagePreprocess | None:
    """An ImageNet-normalized image block for a float [N, 3, H, W] (or [N, H, W, 3]) input
    with static sides of at least MIN_IMAGE_SIDE, so an image folder can calibrate it."""
    if len(shape) != 4:
        return None
    for layout, channels, hw in (("NCHW", shape[1], shape[2:]), ("NHWC", shape[3], shape[1:3])):
        if channels == 3 and all(isinstance(d, int) and d >= MIN_IMAGE_SIDE for d in hw):
            size = (int(hw[0]), int(hw[1]))
            return ImagePreprocess(size=size, mean=IMAGE_MEAN, std=IMAGE_STD, layout=layout)
    return None


def image_range(pre: ImagePreprocess) -> tuple[float, float]:
    """What [0, 1] pixels become after (x - mean) / std."""
    low = min((0.0 - m) / s for m, s in zip(pre.mean, pre.std, strict=False))
    high = max((1.0 - m) / s for m, s in zip(pre.mean, pre.std, strict=False))
    return round(low, 4), round(high, 4)


def specs_from_model(model: onnx.ModelProto) -> tuple[list[TensorSpec], dict[str, int]]:
    """Input specs read from the graph, for models without an I/O contract.

    Dynamic dims get catalog names (`dim_names`) and default to 1. Integer inputs named
    token_type_ids / attention_mask get their one safe value (0 / 1); other integers what
    the graph says is safe (`integer_values`: below the row count of the table they index,
    {0, 1} for masks), else a small range. Float inputs shaped like images get an
    ImageNet-normalized image block (an image folder can then calibrate them) and the
    range that normalization gives; other floats [-1, 1).
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
        values: tuple | None = None
        image = None
        if np_dtype is not None and np.issubdtype(np_dtype, np.floating):
            image = image_preprocess(shape)
            value_range = image_range(image) if image is not None else DEFAULT_FLOAT_RANGE
        elif np_dtype is not None and np.issubdtype(np_dtype, np.integer):
            values = _KNOWN_VALUES.get(vi.name)
            if values is None:
                value_range, values = integer_values(model, vi.name)
                value_range = value_range or (None if values else DEFAULT_INT_RANGE)
        specs.append(TensorSpec(vi.name, dtype, tuple(shape), value_range, values, image))
    return specs, dims
