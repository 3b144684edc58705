"""A quantized graph is valid before any target sees it.

onnxruntime's QDQ quantizer (1.31) writes graphs that onnxruntime itself refuses, measured on
trained Keras/TensorFlow graphs converted by tf2onnx:

- per-axis parameters on an axis that does not fit the tensor: a bias [1, 214] (tf2onnx's
  `Reshape:0` constant, a Gemm's C after the normalize step) quantized to int32 with a
  [214] scale on axis 0, whose size is 1 ("For per axis quantization, scale must be 1D
  tensor with size 1" when the CPU EP runs it);
- NaN, infinite or zero scales from degenerate ranges ("invalid value encountered in
  divide" while it computes them);
- a tensor it invents colliding with one the model has (a shared Conv bias `b` is copied as
  `b0`, `b1`, `b2`, ... while a Conv output is named `b2`: the Conv output's readers then
  get the bias, and a Transpose with perm {0, 2, 3, 1} meets a tensor of shape {36}).
  quant/ort.py gives the copies names no tensor has, so this one is prevented.

- nodes out of order: an If body reading a Q/DQ pair placed after the If (silero-vad).

`repair` fixes the first two and the last on the written model (the axis that fits, the
tensor kept in float, the nodes sorted; each recorded with its reason); `check` then runs
onnx's checker with strict shape inference and one CPU inference, and raises a one-line
error naming the node when either fails: an invalid graph is the quantize step's error,
never the target's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from winml_recipes.sdk.errors import PassError

QDQ = ("QuantizeLinear", "DequantizeLinear")
# onnxruntime writes 16-bit Q/DQ in the com.microsoft domain below opset 21
QDQ_DOMAINS = ("", "ai.onnx", "com.microsoft")
# Models above this size are checked by session creation only (no CPU run), as quant/ort.py
# calls a model large.
LARGE_MODEL_BYTES = 1 << 30


def repair(path: Path, float_path: Path) -> list[dict[str, str]]:
    """Repair the quantizer's known mistakes in the QDQ model at `path` in place; what was
    changed, as {node, tensor, repair, why} records (empty: nothing to repair)."""
    from winml_recipes.onnx.io import load_model, save_model

    # the graph alone first (scales are small and stored inline); the weights are read only
    # when there is something to repair
    graph_only = load_model(path, load_external_data=False)
    done: list[dict[str, str]] = []
    moved = _sort_in_place(graph_only)
    if moved is not None:  # first, so the repairs below see the graph in order
        _write_graph(graph_only, path)
        done.append({
            "node": moved, "tensor": "(graph)", "repair": "nodes sorted topologically",
            "why": "onnxruntime's quantizer placed a node after a node (or a subgraph) that "
                   "reads its output",
        })  # fmt: skip
    if not _repair_model(graph_only, float_path):
        return done
    model = load_model(path)
    done = [*_repair_model(model, float_path), *done]
    save_model(model, path)
    return done


def _sort_in_place(model: onnx.ModelProto) -> str | None:
    """Sort `model`'s nodes, subgraphs included, with onnx_ir's TopologicalSortPass where
    they are out of order; the first node it moved (None: the order was valid, `model` is
    unchanged). silero-vad at cpu/int8: onnxruntime appended the Q/DQ pair of an If's output
    after the next If, whose body reads it from the outer scope."""
    if not _out_of_order(model.graph, set()):
        return None
    import gc

    import onnx_ir as ir
    from onnx_ir.passes.common import TopologicalSortPass

    ir_model = ir.from_proto(model)
    before = [list(g) for g in ir_model.graphs()]
    TopologicalSortPass()(ir_model)
    # compared here: the pass's `modified` looks at the main graph and functions only
    moved = next(
        (old.name or old.op_type
         for nodes, graph in zip(before, ir_model.graphs(), strict=True)
         for old, new in zip(nodes, graph, strict=True) if old is not new),
        None,
    )  # fmt: skip
    if moved is not None:
        model.CopyFrom(ir.to_proto(ir_model))  # external weights stay references to their file
    del ir_model, before
    gc.collect()  # onnx_ir's values and nodes refer to each other: free the weights it holds
    return moved


def _out_of_order(graph: onnx.GraphProto, outer: set[str]) -> bool:
    """Whether a node of `graph` (or of a subgraph, reading values of the scopes around it)
    reads a value no earlier node, input or initializer gives. Read on the protobuf: onnx_ir
    is imported only to sort, as its import stays in memory through the steps after."""
    known = outer | {v.name for v in graph.input} | {t.name for t in graph.initializer}
    for node in graph.node:
        if any(name and name not in known for name in node.input):
            return True
        for attr in node.attribute:
            subgraphs = [*([attr.g] if attr.HasField("g") else []), *attr.graphs]
            if any(_out_of_order(g, known) for g in subgraphs):
                return True
        known.update(node.output)
    return False


def _write_graph(model: onnx.ModelProto, path: Path) -> None:
    """`model` (its weights inline or referencing the files beside `path`) over `path`
    alone, atomically; its external-data files are not touched."""
    import os
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=".sorted-", suffix=".onnx", dir=path.parent)
    os.close(fd)
    try:
        onnx.save_model(model, tmp)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def _repair_model(model: onnx.ModelProto, float_path: Path) -> list[dict[str, str]]:
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    shapes = _shapes(model)
    done: list[dict[str, str]] = []
    floats: dict[str, np.ndarray] | None = None
    for node in list(graph.node):
        if node.op_type not in QDQ or node.domain not in QDQ_DOMAINS or len(node.input) < 2:
            continue
        scale_t = inits.get(node.input[1])
        if scale_t is None or _external(scale_t):
            continue
        scale = numpy_helper.to_array(scale_t)
        data = inits.get(node.input[0])
        why = _bad_scale(scale)
        if why is None and scale.size > 1 and _attr(node, "block_size", 0) == 0:
            shape = list(data.dims) if data is not None else shapes.get(node.input[0])
            why = _fix_axis(node, scale, shape, inits, done)
        if why is None:
            continue
        if floats is None:
            floats = _float_constants(float_path)
        done.append(_keep_float(graph, node, data, inits, floats, why))
    return done


def check(path: Path, float_path: Path, feed: Mapping[str, np.ndarray] | None) -> None:
    """onnx's checker (strict shape inference) and one CPU inference of the quantized model
    on `feed`; a PassError naming the node when the graph is invalid."""
    from winml_recipes.onnx.io import sidecar_paths
    from winml_recipes.runtime.sessions import open_session

    problem = _checker_error(path)
    if problem is not None and _checker_error(float_path) is None:
        raise _invalid(problem)
    size = sum(p.stat().st_size for p in [path, *sidecar_paths(path)])
    try:
        session = open_session(path)
        if feed is not None and size <= LARGE_MODEL_BYTES:
            session.run(feed)
    except Exception as exc:
        raise _invalid(getattr(exc, "message", str(exc))) from None


def _invalid(problem: str) -> PassError:
    node = _node_named(problem)
    where = f" at node {node}" if node else ""
    keep = (
        f"keep it in float with quantize: {{exclude: [{node}]}}"
        if node
        else ("keep the named tensor's nodes in float with quantize: {exclude: [...]}")
    )
    cause = " ".join(problem.split())[:240]
    return PassError(
        f"onnxruntime's quantizer wrote an invalid graph{where} (checked on the CPU before "
        f"any target run): {cause}; {keep}, and report the model"
    )


_NODE_PATTERNS = (
    re.compile(r"Name:'([^']+)'"),
    re.compile(r"Node \(([^)]+)\)"),
    re.compile(r"node name: ([^)]+?)\)"),
)


def _node_named(text: str) -> str | None:
    for pattern in _NODE_PATTERNS:
        found = pattern.search(text)
        if found:
            return found.group(1)
    return None


def _checker_error(path: Path) -> str | None:
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        return str(exc)
    return None


def _external(t: onnx.TensorProto) -> bool:
    return t.data_location == onnx.TensorProto.EXTERNAL


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((int(a.i) for a in node.attribute if a.name == name), default)


def _bad_scale(scale: np.ndarray) -> str | None:
    if not np.isfinite(scale).all():
        return "a NaN or infinite scale (a degenerate calibration range)"
    if (scale <= 0).any():
        return "a zero or negative scale (a degenerate calibration range)"
    return None


def _fix_axis(
    node: onnx.NodeProto,
    scale: np.ndarray,
    shape: list[int | None] | None,
    inits: dict[str, onnx.TensorProto],
    done: list[dict[str, str]],
) -> str | None:
    """Per-axis parameters that do not fit the tensor's axis: moved to the one axis of the
    scale's size (the values were computed along it), else the reason to keep it float."""
    if shape is None:
        return None  # unknown shape: the checks after say whether it runs
    rank = len(shape)
    axis = _attr(node, "axis", 1)
    axis = axis + rank if axis < 0 else axis
    if 0 <= axis < rank and shape[axis] == scale.size:
        return None
    fits = [k for k, d in enumerate(shape) if d == scale.size]
    if len(fits) != 1 or len(inits.get(node.input[0], onnx.TensorProto()).dims) != rank:
        return (
            f"per-axis parameters of size {scale.size} on axis {axis} of a tensor of shape "
            f"{shape}, which no single axis fits"
        )
    for a in node.attribute:
        if a.name == "axis":
            a.i = fits[0]
            break
    else:
        node.attribute.append(onnx.helper.make_attribute("axis", fits[0]))
    done.append({
        "node": node.name, "tensor": node.input[0], "repair": f"axis {axis} -> {fits[0]}",
        "why": f"per-axis parameters of size {scale.size} on axis {axis} of shape {shape}",
    })  # fmt: skip
    return None


def _keep_float(
    graph: onnx.GraphProto,
    node: onnx.NodeProto,
    data: onnx.TensorProto | None,
    inits: dict[str, onnx.TensorProto],
    floats: dict[str, np.ndarray],
    why: str,
) -> dict[str, str]:
    """The Q or DQ `node` replaced by an Identity of the float tensor it stood for."""
    if data is None:  # an activation: Q(x) -> DQ reads x again
        source = node.input[0]
        if node.op_type == "DequantizeLinear":
            producer = next((n for n in graph.node if node.input[0] in n.output), None)
            if producer is not None and producer.op_type == "QuantizeLinear":
                source = producer.input[0]
        what = "kept float (its Q/DQ bypassed)"
    else:
        value = _float_value(data.name, floats)
        if value is None:
            raise PassError(
                f"onnxruntime's quantizer wrote {why} for the constant {data.name} at node "
                f"{node.name}, and its float value is not in the float model; keep the "
                f"node that reads it in float with quantize: {{exclude: [...]}}"
            )
        source = f"{data.name}_float"
        graph.initializer.append(numpy_helper.from_array(value, source))
        what = "kept float (the float model's constant)"
    keep = onnx.helper.make_node("Identity", [source], list(node.output), name=node.name)
    index = list(graph.node).index(node)
    graph.node.remove(node)
    graph.node.insert(index, keep)
    _drop_unused(graph, inits)
    return {"node": node.name, "tensor": node.input[0], "repair": what, "why": why}


def _float_value(quantized: str, floats: dict[str, np.ndarray]) -> np.ndarray | None:
    """The float model's constant a quantized one was made from (onnxruntime names it
    `<name>_quantized`; a shared bias's copies `<name><k>_quantized`)."""
    base = quantized.removesuffix("_quantized")
    if base in floats:
        return floats[base]
    vector = base.rstrip("_").removesuffix("_vector")  # a Gemm bias given as [N] (gemm_bias)
    if vector != base and vector in floats:
        return floats[vector].reshape(-1)
    stripped = base.rstrip("0123456789")
    return floats.get(stripped) if stripped != base else None


def _float_constants(float_path: Path) -> dict[str, np.ndarray]:
    from winml_recipes.onnx.io import load_model

    model = load_model(float_path)
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def _drop_unused(graph: onnx.GraphProto, inits: dict[str, onnx.TensorProto]) -> None:
    drop_unread_qdq(graph)
    read = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    for name, t in list(inits.items()):
        if name not in read:
            graph.initializer.remove(t)
            del inits[name]


def _shapes(model: onnx.ModelProto) -> dict[str, list[int | None]]:
    """Static shapes of the graph's values, as onnx's shape inference gives them."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:
        return {}
    out: dict[str, list[int | None]] = {}
    for v in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        tt = v.type.tensor_type
        if tt.HasField("shape"):
            out[v.name] = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    return out


def first_feed(factory: Any) -> dict[str, np.ndarray] | None:
    """The first sample a feed factory gives (None: it gives none)."""
    return next(iter(factory()), None)


def drop_unread_qdq(graph) -> None:
    """Remove QuantizeLinear/DequantizeLinear nodes whose outputs nothing reads."""
    outputs = {o.name for o in graph.output}
    while True:
        read = {i for n in graph.node for i in n.input} | outputs
        dead = [
            n
            for n in graph.node
            if n.op_type in ("QuantizeLinear", "DequantizeLinear") and n.output[0] not in read
        ]
        if not dead:
            return
        for n in dead:
            graph.node.remove(n)
