"""AveragePool whose window covers the whole map -> GlobalAveragePool (exact, every target).

transformers' EfficientNet ends in `nn.AvgPool2d(hidden_dim, ceil_mode=True)`: a 1280 (tiny
config: 320) window on a 7x7 (2x2) map, which torch and onnxruntime's float kernel average
over the elements inside the map. Once quantized, onnxruntime's CPU EP at its default
optimization level (EXTENDED and above: the QDQ fusion into QLinearAveragePool) computes that
pool as if the window were all inside, and the tiny EfficientNet's cpu/int8 logits came out 0
for every photo (onnxruntime 1.31; the BASIC level the build verifies at gave 11.9 dB).
GlobalAveragePool averages the same elements and is fused correctly. The NPU plugin has the
same rewrite for its own reason (the NPU refused the pool).
"""

from __future__ import annotations

import onnx


def _attr(node: onnx.NodeProto, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _spatial(model: onnx.ModelProto) -> dict[str, list[int | None]]:
    """Tensor -> its static dims, from onnx shape inference (no external data needed)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except (ValueError, onnx.shape_inference.InferenceError):  # > 2 GB proto, bad graph
        return {}
    out: dict[str, list[int | None]] = {}
    graph = inferred.graph
    for info in [*graph.input, *graph.value_info, *graph.output]:
        t = info.type.tensor_type
        if t.HasField("shape"):
            out[info.name] = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
    return out


def _covers_map(node: onnx.NodeProto, shape: list[int | None] | None) -> bool:
    """One output position per spatial axis, every element of the map inside the window."""
    if shape is None or len(shape) < 3 or any(d is None for d in shape[2:]):
        return False
    if _attr(node, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET", b"", ""):
        return False
    if any(_attr(node, "pads", [])) or any(d != 1 for d in _attr(node, "dilations", [])):
        return False
    kernel = list(_attr(node, "kernel_shape", []))
    spatial = [int(d) for d in shape[2:] if d is not None]
    if len(kernel) != len(spatial) or any(k < d for k, d in zip(kernel, spatial, strict=True)):
        return False
    strides = list(_attr(node, "strides", [])) or [1] * len(kernel)
    ceil = int(_attr(node, "ceil_mode", 0))
    for d, k, st in zip(spatial, kernel, strides, strict=True):
        if d < k and not ceil:
            return False  # floor mode with an overhanging window: no output position
        if d >= k and (d - k + (st - 1 if ceil else 0)) // st + 1 != 1:
            return False
    return True


def whole_map_pools_to_global(model: onnx.ModelProto) -> list[str]:
    """Replace, in place, each AveragePool whose window covers its whole input map with a
    GlobalAveragePool; the replaced nodes' names."""
    pools = [
        n for n in model.graph.node if n.op_type == "AveragePool" and n.domain in ("", "ai.onnx")
    ]
    if not pools:
        return []
    shapes = _spatial(model)
    done: list[str] = []
    for node in pools:
        if _covers_map(node, shapes.get(node.input[0])):
            node.op_type = "GlobalAveragePool"
            del node.attribute[:]
            done.append(node.name)
    return done
