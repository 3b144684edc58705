"""Mixed precision: declarative regions -> TensorQuantOverrides, and automatic promotion.

Regions name activation tensors or nodes by glob. Automatic promotion measures each
quantized activation's own quantization noise (onnxruntime's qdq_loss_debug helpers),
promotes the noisiest to 16 bit, and re-measures the outputs, until a target SQNR or a
promotion budget is reached.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from winml_recipes.errors import PassError


def _match(globs: Sequence[str], names: Iterable[str], what: str) -> list[str]:
    names = list(names)
    out: list[str] = []
    for g in globs:
        hits = [n for n in names if fnmatch.fnmatchcase(n, g)]
        if not hits:
            raise PassError(f"mixed_precision: {what} glob '{g}' matches nothing")
        out += [h for h in hits if h not in out]
    return out


def compile_regions(
    regions: Sequence[dict[str, Any]], model: onnx.ModelProto, activations: Sequence[str]
) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """Regions -> (TensorQuantOverrides with type names, node names kept in float)."""
    overrides: dict[str, list[dict[str, Any]]] = {}
    float_nodes: list[str] = []
    node_names = [n.name for n in model.graph.node if n.name]
    acts = set(activations)
    for region in regions:
        if "tensors" in region:
            tensors = _match(region["tensors"], activations, "tensor")
        else:
            nodes = _match(region["nodes"], node_names, "node")
            if region["type"] == "float":
                float_nodes += [n for n in nodes if n not in float_nodes]
                continue
            wanted = set(nodes)
            tensors = [o for n in model.graph.node if n.name in wanted for o in n.output]
            tensors = [t for t in tensors if t in acts]
        if region["type"] == "float":
            producers = {o: n.name for n in model.graph.node for o in n.output}
            float_nodes += [producers[t] for t in tensors if producers.get(t)]
            continue
        for t in tensors:
            overrides[t] = [{"quant_type": region["type"]}]
    return overrides, float_nodes


def activation_noise(
    qdq_model: Path, feeds: list[dict[str, Any]], work_dir: Path
) -> dict[str, float]:
    """SQNR (dB) of each quantized activation against its own value before Q/DQ.

    onnxruntime's qdq_loss_debug matches tensors by the `_QuantizeLinear_Input` naming of
    its own debug exports, which the QDQ models written by quantize_static do not carry, so
    the pairs are read from the graph here: every QuantizeLinear on an activation X and a
    DequantizeLinear of its output Y; both become graph outputs and SQNR(X, Y) is measured.
    """
    from winml_recipes.onnx.io import load_model, save_model
    from winml_recipes.onnx.metrics import compare_runs
    from winml_recipes.onnx.runtime import run_model

    model = load_model(qdq_model)
    initializers = {t.name for t in model.graph.initializer}
    dq_of = {n.input[0]: n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    pairs = {
        n.input[0]: dq_of[n.output[0]]
        for n in model.graph.node
        if n.op_type == "QuantizeLinear" and n.input[0] not in initializers and n.output[0] in dq_of
    }
    # A zero point at the bottom of the integer range means rmin = 0: ORT folded a Relu (or
    # the tensor is non-negative anyway), so max(X, 0) is what the pair should reproduce.
    values = {t.name: t for t in model.graph.initializer}
    relu_like = set()
    for n in model.graph.node:
        if n.op_type == "QuantizeLinear" and n.input[0] in pairs and len(n.input) > 2:
            zp = values.get(n.input[2])
            if zp is not None:
                arr = onnx.numpy_helper.to_array(zp)
                if arr.size and (arr == np.iinfo(arr.dtype).min).all():
                    relu_like.add(n.input[0])
    existing = {o.name for o in model.graph.output}
    for name in sorted({*pairs, *pairs.values()} - existing):
        model.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    augmented = save_model(model, work_dir / "noise_probe.onnx")
    runs = run_model(augmented, feeds)
    before = [{x: np.maximum(r[x], 0) if x in relu_like else r[x] for x in pairs} for r in runs]
    after = [{x: r[y] for x, y in pairs.items()} for r in runs]
    return {name: float(m["sqnr_db"]) for name, m in compare_runs(before, after).items()}
