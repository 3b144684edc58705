"""Graph digest for golden files, and a fingerprint of a model's semantic content.

`graph_fingerprint` hashes what the model computes: ir_version, opsets, graph structure
(node names, op types, edges, attributes), I/O types, initializer bytes and model-local
functions. It ignores metadata_props, doc strings, producer name/version, model
domain/version, value_info (shape-inference annotations) and device configurations, so
writing a stamp into metadata_props leaves it unchanged while any graph edit changes it.

Tensor bytes are hashed in canonical form (raw little-endian bytes), so a tensor stored
in typed fields and the same tensor in raw_data hash alike, as does a model saved with
external data and loaded back. For tensors left on disk (`load_external_data=False`),
pass `base_dir` to stream their bytes from the sidecar (same fingerprint as loaded);
without it the external reference (location, offset, length) is hashed instead.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path
from typing import Any

import onnx
from onnx import AttributeProto, TensorProto, numpy_helper

from winml_recipes.onnx.quant import detect_quantization

_SUB_BYTE_BITS = {
    TensorProto.UINT4: 4,
    TensorProto.INT4: 4,
    TensorProto.FLOAT4E2M1: 4,
    TensorProto.UINT2: 2,
    TensorProto.INT2: 2,
    TensorProto.FLOAT6E2M3: 6,
    TensorProto.FLOAT6E3M2: 6,
}
_CHUNK = 1 << 22


def dtype_name(elem_type: int) -> str:
    """numpy-style name of an ONNX element type: float32, int64, bool, int4, string ..."""
    if elem_type == TensorProto.STRING:
        return "string"
    try:
        return onnx.helper.tensor_dtype_to_np_dtype(elem_type).name
    except (KeyError, ValueError, TypeError):
        return "undefined"


def value_info_dict(vi: onnx.ValueInfoProto) -> dict[str, Any]:
    """{name, dtype, shape}; dims are ints, names, or None when unknown; shape None if no rank."""
    tt = vi.type.tensor_type
    shape: list[int | str | None] | None = None
    if tt.HasField("shape"):
        shape = [
            d.dim_value
            if d.HasField("dim_value")
            else (d.dim_param if d.HasField("dim_param") else None)
            for d in tt.shape.dim
        ]
    return {"name": vi.name, "dtype": dtype_name(tt.elem_type), "shape": shape}


def graph_inputs(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    """Real inputs: graph inputs that are not also initializers."""
    inits = {t.name for t in graph.initializer} | {s.values.name for s in graph.sparse_initializer}
    return [vi for vi in graph.input if vi.name not in inits]


def graph_digest(model: onnx.ModelProto, base_dir: Path | str | None = None) -> dict[str, Any]:
    """Plain data describing `model`, with a stable key order, for golden YAML files.

    node_count and op_histogram cover the main graph and its subgraphs; function bodies
    are covered by the fingerprint only.
    """
    graph = model.graph
    ops: Counter[str] = Counter()
    init_bytes: Counter[str] = Counter()
    init_count = 0
    for g in _graphs(graph):
        for node in g.node:
            domain = node.domain
            ops[node.op_type if domain in ("", "ai.onnx") else f"{domain}::{node.op_type}"] += 1
        for t in g.initializer:
            init_count += 1
            init_bytes[dtype_name(t.data_type)] += _tensor_nbytes(t)
    return {
        "opset_imports": {
            (o.domain or "ai.onnx"): o.version
            for o in sorted(model.opset_import, key=lambda o: o.domain or "ai.onnx")
        },
        "inputs": [value_info_dict(vi) for vi in graph_inputs(graph)],
        "outputs": [value_info_dict(vi) for vi in graph.output],
        "node_count": sum(ops.values()),
        "op_histogram": dict(sorted(ops.items())),
        "initializers": {"count": init_count, "bytes_per_dtype": dict(sorted(init_bytes.items()))},
        "quantization": detect_quantization(model).to_dict(),
        "fingerprint": graph_fingerprint(model, base_dir),
    }


def graph_fingerprint(model: onnx.ModelProto, base_dir: Path | str | None = None) -> str:
    """sha256 of the model's semantic content (see module docstring)."""
    hasher = _TensorHasher(Path(base_dir) if base_dir is not None else None)
    skeleton = onnx.ModelProto(ir_version=model.ir_version)
    skeleton.opset_import.extend(
        sorted(model.opset_import, key=lambda o: (o.domain or "ai.onnx", o.version))
    )
    skeleton.graph.CopyFrom(_strip_graph(model.graph, hasher))
    for fn in model.functions:
        skeleton.functions.append(_strip_function(fn, hasher))
    return hashlib.sha256(skeleton.SerializeToString(deterministic=True)).hexdigest()


def _graphs(graph: onnx.GraphProto):
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == AttributeProto.GRAPH:
                yield from _graphs(attr.g)
            elif attr.type == AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _graphs(g)


def _tensor_nbytes(t: TensorProto) -> int:
    if t.data_type == TensorProto.STRING:
        return sum(len(s) for s in t.string_data)
    numel = 1
    for d in t.dims:
        numel *= d
    bits = _SUB_BYTE_BITS.get(t.data_type)
    if bits is None:
        try:
            bits = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize * 8
        except (KeyError, ValueError, TypeError):
            return 0
    return (numel * bits + 7) // 8


class _TensorHasher:
    """Canonical digest of a tensor's content."""

    def __init__(self, base_dir: Path | None) -> None:
        self.base_dir = base_dir

    def digest(self, t: TensorProto) -> bytes:
        h = hashlib.sha256()
        raw = t.raw_data  # read once: each access may copy the bytes
        if t.data_location == TensorProto.EXTERNAL and not raw:
            self._external(t, h)
        elif raw:
            h.update(b"raw:")
            h.update(raw)
        elif t.data_type == TensorProto.STRING:
            h.update(b"str:")
            for s in t.string_data:
                h.update(len(s).to_bytes(8, "little"))
                h.update(s)
        else:  # typed fields: re-encode as raw so both encodings hash alike
            h.update(b"raw:")
            h.update(numpy_helper.from_array(numpy_helper.to_array(t)).raw_data)
        return h.digest()

    def _external(self, t: TensorProto, h: Any) -> None:
        info = {e.key: e.value for e in t.external_data}
        location = info.get("location", "")
        path = self.base_dir / location if self.base_dir is not None else None
        # Only read data the one loader would accept (inside the model's folder, a regular
        # file); anything else is described by its reference, never opened.
        inside = (
            path is not None
            and not Path(location).is_absolute()
            and self.base_dir is not None
            and self.base_dir.resolve() in path.resolve().parents
        )
        if path is None or not inside or not path.is_file():
            h.update(b"external:")
            for key in ("location", "offset", "length"):
                h.update(f"{key}={info.get(key, '')};".encode())
            return
        offset = int(info.get("offset", 0) or 0)
        remaining = int(info["length"]) if info.get("length") else None
        h.update(b"raw:")
        with open(path, "rb") as fh:
            fh.seek(offset)
            while remaining is None or remaining > 0:
                chunk = fh.read(_CHUNK if remaining is None else min(_CHUNK, remaining))
                if not chunk:
                    break
                h.update(chunk)
                if remaining is not None:
                    remaining -= len(chunk)

    def strip(self, t: TensorProto) -> TensorProto:
        out = TensorProto(name=t.name, data_type=t.data_type, dims=t.dims)
        out.raw_data = self.digest(t)
        return out

    def strip_sparse(self, st: onnx.SparseTensorProto) -> onnx.SparseTensorProto:
        out = onnx.SparseTensorProto(dims=st.dims)
        out.values.CopyFrom(self.strip(st.values))
        out.indices.CopyFrom(self.strip(st.indices))
        return out


def _strip_value_info(vi: onnx.ValueInfoProto) -> onnx.ValueInfoProto:
    out = onnx.ValueInfoProto(name=vi.name)
    out.type.CopyFrom(vi.type)
    return out


def _strip_graph(graph: onnx.GraphProto, hasher: _TensorHasher) -> onnx.GraphProto:
    out = onnx.GraphProto(name=graph.name)
    out.input.extend(_strip_value_info(v) for v in graph.input)
    out.output.extend(_strip_value_info(v) for v in graph.output)
    out.initializer.extend(hasher.strip(t) for t in graph.initializer)
    out.sparse_initializer.extend(hasher.strip_sparse(s) for s in graph.sparse_initializer)
    out.node.extend(_strip_node(n, hasher) for n in graph.node)
    out.quantization_annotation.extend(graph.quantization_annotation)
    return out


def _strip_function(fn: onnx.FunctionProto, hasher: _TensorHasher) -> onnx.FunctionProto:
    out = onnx.FunctionProto(
        name=fn.name,
        domain=fn.domain,
        overload=fn.overload,
        input=fn.input,
        output=fn.output,
        attribute=fn.attribute,
    )
    out.attribute_proto.extend(_strip_attr(a, hasher) for a in fn.attribute_proto)
    out.opset_import.extend(fn.opset_import)
    out.node.extend(_strip_node(n, hasher) for n in fn.node)
    return out


def _strip_node(node: onnx.NodeProto, hasher: _TensorHasher) -> onnx.NodeProto:
    out = onnx.NodeProto(
        name=node.name,
        op_type=node.op_type,
        domain=node.domain,
        overload=node.overload,
        input=node.input,
        output=node.output,
    )
    out.attribute.extend(_strip_attr(a, hasher) for a in node.attribute)
    return out


def _strip_attr(attr: AttributeProto, hasher: _TensorHasher) -> AttributeProto:
    heavy = (
        AttributeProto.TENSOR,
        AttributeProto.TENSORS,
        AttributeProto.GRAPH,
        AttributeProto.GRAPHS,
        AttributeProto.SPARSE_TENSOR,
        AttributeProto.SPARSE_TENSORS,
    )
    if attr.type not in heavy:
        out = AttributeProto()
        out.CopyFrom(attr)
        out.ClearField("doc_string")
        return out
    out = AttributeProto(name=attr.name, ref_attr_name=attr.ref_attr_name, type=attr.type)
    if attr.HasField("t"):
        out.t.CopyFrom(hasher.strip(attr.t))
    out.tensors.extend(hasher.strip(t) for t in attr.tensors)
    if attr.HasField("g"):
        out.g.CopyFrom(_strip_graph(attr.g, hasher))
    out.graphs.extend(_strip_graph(g, hasher) for g in attr.graphs)
    if attr.HasField("sparse_tensor"):
        out.sparse_tensor.CopyFrom(hasher.strip_sparse(attr.sparse_tensor))
    out.sparse_tensors.extend(hasher.strip_sparse(s) for s in attr.sparse_tensors)
    return out
