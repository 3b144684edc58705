"""HTP's product of two 16-bit activations on tiny values, against the CPU EP's simulation of
the same QDQ model, with and without a power-of-two rescale around the product.

    python experiments/htp_tiny_products.py KIND:D:K:MODE ...

KIND `matmul`: softmax(a) @ (v * D); `mul`: (v * D) * sigmoid(v * D). MODE `none`, or
`mulconst`: the tiny operand times 2^K before the product and the product times 2^-K after
(what eps/qnn/rules/products.py writes). Quantized with onnxruntime's QNN config directly
(uint16 activations, uint8 weights, range floor 1e-12); one JSON line per case.
"""

from __future__ import annotations

import json
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
import onnxruntime_qnn
from onnx import TensorProto
from onnx import helper as h
from onnx import numpy_helper as nh
from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize
from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config


def _const(name: str, value: float) -> onnx.TensorProto:
    return nh.from_array(np.asarray(value, np.float32), name)


def graph(kind: str, d: float, k: int, mode: str) -> onnx.ModelProto:
    nodes, inits = [], [_const("d", d), _const("back", 1.0 / d)]
    if kind == "matmul":
        inputs = [("a", [1, 2, 16, 16]), ("v", [1, 2, 16, 8])]
        nodes += [
            h.make_node("Softmax", ["a"], ["p"], axis=-1),
            h.make_node("Mul", ["v", "d"], ["t"]),
        ]
        lhs, rhs, op = "p", "t", "MatMul"
    else:
        inputs = [("v", [1, 8, 16, 16])]
        nodes += [h.make_node("Mul", ["v", "d"], ["t"]), h.make_node("Sigmoid", ["t"], ["p"])]
        lhs, rhs, op = "t", "p", "Mul"
    if mode == "mulconst":
        inits += [_const("up", 2.0**k), _const("down", 2.0**-k)]
        nodes.append(h.make_node("Mul", ["t", "up"], ["ts"]))
        lhs, rhs = (lhs, "ts") if kind == "matmul" else ("ts", rhs)
        nodes += [h.make_node(op, [lhs, rhs], ["ys"]), h.make_node("Mul", ["ys", "down"], ["y0"])]
    else:
        nodes.append(h.make_node(op, [lhs, rhs], ["y0"]))
    nodes.append(h.make_node("Mul", ["y0", "back"], ["y"]))  # back to O(1)
    g = h.make_graph(
        nodes, "g", [h.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [h.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits,
    )  # fmt: skip
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)


class _Reader(CalibrationDataReader):
    def __init__(self, feeds: list) -> None:
        self.it = iter(feeds)

    def get_next(self):
        return next(self.it, None)


def _sqnr(ref: np.ndarray, got: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(ref**2) / max(np.sum((ref - got) ** 2), 1e-30)))


def run(kind: str, d: float, k: int, mode: str) -> dict:
    model = graph(kind, d, k, mode)
    rng = np.random.default_rng(0)
    shapes = {
        i.name: [x.dim_value for x in i.type.tensor_type.shape.dim] for i in model.graph.input
    }
    feeds = [
        {n: rng.normal(size=s).astype(np.float32) for n, s in shapes.items()} for _ in range(5)
    ]
    tmp = tempfile.mkdtemp()
    src, qdq = f"{tmp}/f.onnx", f"{tmp}/q.onnx"
    onnx.save(model, src)
    cfg = get_qnn_qdq_config(
        src, _Reader(feeds[:4]), activation_type=QuantType.QUInt16, weight_type=QuantType.QUInt8
    )
    cfg.extra_options["MinimumRealRange"] = 1e-12
    quantize(src, qdq, cfg)
    ref = ort.InferenceSession(src).run(None, feeds[4])[0]
    sim = ort.InferenceSession(qdq).run(None, feeds[4])[0]
    so = ort.SessionOptions()
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    devices = [x for x in ort.get_ep_devices() if x.ep_name == "QNNExecutionProvider"]
    so.add_provider_for_devices(devices, {"backend_type": "htp"})
    htp = ort.InferenceSession(qdq, sess_options=so).run(None, feeds[4])[0]
    return {"kind": kind, "d": d, "k": k, "mode": mode,
            "sim_db": round(_sqnr(ref, sim), 1), "htp_db": round(_sqnr(ref, htp), 1)}  # fmt: skip


if __name__ == "__main__":
    ort.register_execution_provider_library(
        "QNNExecutionProvider", onnxruntime_qnn.get_library_path()
    )
    for spec in sys.argv[1:]:
        kind, d, k, mode = spec.split(":")
        print(json.dumps(run(kind, float(d), int(k), mode)), flush=True)
