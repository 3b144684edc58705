"""What a quantization did, measured on the graphs: nodes quantized, Q/DQ inserted."""

from __future__ import annotations

from collections import Counter
from typing import Any

import onnx

MATMUL_CONV = ("MatMul", "Conv", "Gemm", "ConvTranspose")
INTEGER_OPS = {
    "MatMulInteger": "MatMul",
    "ConvInteger": "Conv",
    "QLinearMatMul": "MatMul",
    "QLinearConv": "Conv",
    "QGemm": "Gemm",
    "DynamicQuantizeMatMul": "MatMul",
    "MatMulIntegerToFloat": "MatMul",
}
QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")


def _dq_fed(node: onnx.NodeProto, producers: dict[str, str]) -> bool:
    """A QDQ-quantized compute node: its data inputs (both operands of MatMul/Conv/Gemm,
    else the first) come from DequantizeLinear."""
    data = node.input[:2] if node.op_type in MATMUL_CONV else node.input[:1]
    return bool(data) and all(producers.get(i) == "DequantizeLinear" for i in data)


def quantization_report(float_model: onnx.ModelProto, q_model: onnx.ModelProto) -> dict[str, Any]:
    before = Counter(n.op_type for n in float_model.graph.node)
    after = Counter(n.op_type for n in q_model.graph.node)
    producers = {o: n.op_type for n in q_model.graph.node for o in n.output}
    quantizable = _registry_ops()
    quantized: Counter[str] = Counter()
    for n in q_model.graph.node:
        if n.op_type in QDQ_OPS or (n.op_type not in quantizable and n.op_type not in INTEGER_OPS):
            continue
        if n.op_type in INTEGER_OPS:
            quantized[INTEGER_OPS[n.op_type]] += 1
        elif _dq_fed(n, producers):
            quantized[n.op_type] += 1
    total_mc = sum(before[t] for t in MATMUL_CONV)
    quantized_mc = sum(quantized[t] for t in MATMUL_CONV)
    return {
        "nodes_quantized": sum(quantized.values()),
        "nodes_quantized_by_op": dict(sorted(quantized.items())),
        "matmul_conv_total": total_mc,
        "matmul_conv_quantized": quantized_mc,
        "matmul_conv_quantized_fraction": round(quantized_mc / total_mc, 4) if total_mc else 0.0,
        "quantize_linear_inserted": after["QuantizeLinear"] - before["QuantizeLinear"],
        "dequantize_linear_inserted": after["DequantizeLinear"] - before["DequantizeLinear"],
        "opset": next((o.version for o in q_model.opset_import if o.domain in ("", "ai.onnx")), 0),
    }


def _registry_ops() -> set[str]:
    from winml_recipes.quant.ort import quantizable_op_types

    return quantizable_op_types()
