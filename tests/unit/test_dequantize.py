"""Tests for winml_recipes.quant.dequantize.

Tiny float models are built here (the conftest MLP, a BERT-like attention block, a small
conv net) and quantized here by onnxruntime.quantization in each format; the dequantized
model must hold no quantization op, pass the full ONNX checker, run on CPU, keep folded
weights exactly `(W - zp) * scale`, and be at least as close to the float model as the
quantized one was. Weight-only ops are checked against onnxruntime's own kernels.
Run with `-s` to see the SQNR figures.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import make_mlp_onnx
from winml_recipes.onnx.metrics import compare_runs
from winml_recipes.onnx.quant import detect_quantization
from winml_recipes.quant.dequantize import QUANT_OPS, DequantizeReport, dequantize_model
from winml_recipes.runtime.sessions import run_model
from winml_recipes.sdk.errors import PassError

IR_VERSION = 10  # onnxruntime 1.31 reads up to IR 13; onnx 1.23 writes 14 by default
MS = "com.microsoft"
# Activation requantization removed by the rewrite may cost a little on some inputs.
SQNR_EPSILON_DB = 0.5


# ------------------------------------------------------------------------ model builders


def _t(name: str, array: np.ndarray) -> TensorProto:
    return numpy_helper.from_array(array, name)


def _vi(name: str, elem: int, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, inits=(), opset=17, ms=True, functions=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    opsets = [helper.make_opsetid("", opset)]
    if ms:
        opsets.append(helper.make_opsetid(MS, 1))
    if functions:
        opsets.append(helper.make_opsetid("local", 1))
    return helper.make_model(
        graph, opset_imports=opsets, ir_version=IR_VERSION, functions=list(functions)
    )


def _randn(rng, shape, scale=0.5) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def attention_model(hidden: int = 16, seq: int = 6) -> onnx.ModelProto:
    """x -> Q/K/V projections -> softmax(QK^T/sqrt(d)) V -> out projection -> +x -> LayerNorm."""
    rng = np.random.default_rng(1)
    inits = [
        _t("wq", _randn(rng, (hidden, hidden))),
        _t("wk", _randn(rng, (hidden, hidden))),
        _t("wv", _randn(rng, (hidden, hidden))),
        _t("wo", _randn(rng, (hidden, hidden))),
        _t("bq", _randn(rng, (hidden,))),
        _t("bo", _randn(rng, (hidden,))),
        _t("ln_g", np.ones(hidden, np.float32)),
        _t("ln_b", np.zeros(hidden, np.float32)),
        _t("inv_sqrt", np.array(1 / np.sqrt(hidden), np.float32)),
    ]
    mk = helper.make_node
    nodes = [
        mk("MatMul", ["x", "wq"], ["q0"], name="q_proj"),
        mk("Add", ["q0", "bq"], ["q"], name="q_bias"),
        mk("MatMul", ["x", "wk"], ["k"], name="k_proj"),
        mk("MatMul", ["x", "wv"], ["v"], name="v_proj"),
        mk("Transpose", ["k"], ["kt"], perm=[0, 2, 1], name="k_t"),
        mk("MatMul", ["q", "kt"], ["s0"], name="scores"),
        mk("Mul", ["s0", "inv_sqrt"], ["s"], name="scale"),
        mk("Softmax", ["s"], ["p"], axis=-1, name="softmax"),
        mk("MatMul", ["p", "v"], ["ctx"], name="context"),
        mk("MatMul", ["ctx", "wo"], ["o0"], name="o_proj"),
        mk("Add", ["o0", "bo"], ["o1"], name="o_bias"),
        mk("Add", ["o1", "x"], ["res"], name="residual"),
        mk("LayerNormalization", ["res", "ln_g", "ln_b"], ["y"], axis=-1, name="ln"),
    ]
    return _model(
        nodes,
        [_vi("x", TensorProto.FLOAT, ["batch", seq, hidden])],
        [_vi("y", TensorProto.FLOAT, ["batch", seq, hidden])],
        inits,
        ms=False,
    )


CONV_ATTRS = {
    "conv1": {"pads": [1, 1, 1, 1], "strides": [2, 2], "kernel_shape": [3, 3]},
    "conv2": {"pads": [2, 2, 2, 2], "dilations": [2, 2], "group": 4},
}


def conv_model() -> onnx.ModelProto:
    """Conv(stride 2) -> Relu -> grouped dilated Conv -> Relu -> GAP -> Flatten -> Gemm."""
    rng = np.random.default_rng(2)
    inits = [
        _t("c1_w", _randn(rng, (8, 3, 3, 3))),
        _t("c1_b", _randn(rng, (8,), 0.1)),
        _t("c2_w", _randn(rng, (8, 2, 3, 3))),
        _t("c2_b", _randn(rng, (8,), 0.1)),
        _t("fc_w", _randn(rng, (5, 8))),
        _t("fc_b", _randn(rng, (5,), 0.1)),
    ]
    mk = helper.make_node
    nodes = [
        mk("Conv", ["x", "c1_w", "c1_b"], ["c1"], name="conv1", **CONV_ATTRS["conv1"]),
        mk("Relu", ["c1"], ["r1"], name="relu1"),
        mk("Conv", ["r1", "c2_w", "c2_b"], ["c2"], name="conv2", **CONV_ATTRS["conv2"]),
        mk("Relu", ["c2"], ["r2"], name="relu2"),
        mk("GlobalAveragePool", ["r2"], ["g"], name="gap"),
        mk("Flatten", ["g"], ["f"], name="flatten"),
        mk("Gemm", ["f", "fc_w", "fc_b"], ["y"], name="fc", transB=1),
    ]
    return _model(
        nodes,
        [_vi("x", TensorProto.FLOAT, ["batch", 3, 12, 12])],
        [_vi("y", TensorProto.FLOAT, ["batch", 5])],
        inits,
        ms=False,
    )


def zoo_model() -> onnx.ModelProto:
    """The rest of the QOperator family: LeakyRelu, AveragePool, Sigmoid, Mul, Concat."""
    rng = np.random.default_rng(3)
    inits = [_t("cw", _randn(rng, (4, 3, 3, 3))), _t("cb", _randn(rng, (4,), 0.1))]
    mk = helper.make_node
    nodes = [
        mk("Conv", ["x", "cw", "cb"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        mk("LeakyRelu", ["c"], ["lr"], alpha=0.1, name="leaky"),
        mk("AveragePool", ["lr"], ["ap"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
        mk("Sigmoid", ["ap"], ["sg"], name="sigmoid"),
        mk("Mul", ["ap", "sg"], ["m"], name="swish"),
        mk("Concat", ["m", "ap"], ["cat"], axis=1, name="concat"),
        mk("Softmax", ["cat"], ["y"], axis=1, name="softmax"),
    ]
    return _model(
        nodes,
        [_vi("x", TensorProto.FLOAT, ["batch", 3, 8, 8])],
        [_vi("y", TensorProto.FLOAT, ["batch", 8, 4, 4])],
        inits,
        ms=False,
    )


def mlp_model(tmp: Path) -> onnx.ModelProto:
    return onnx.load(str(make_mlp_onnx(tmp / "mlp_src.onnx", hidden=16)))


FLOAT_MODELS = {
    "mlp": (mlp_model, (4,)),
    "attention": (lambda tmp: attention_model(), (6, 16)),
    "convnet": (lambda tmp: conv_model(), (3, 12, 12)),
    "zoo": (lambda tmp: zoo_model(), (3, 8, 8)),
}


def _feeds(sample_shape, seed: int, n: int = 4, batch: int = 8) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((batch, *sample_shape)).astype(np.float32)} for _ in range(n)]


# --------------------------------------------------------------------------- quantizing


class _Reader:
    """onnxruntime CalibrationDataReader over a fixed list of feeds."""

    def __init__(self, feeds):
        self._it = iter(feeds)

    def get_next(self):
        return next(self._it, None)


def _quantize(src: Path, fmt: str, sample_shape, out: Path) -> onnx.ModelProto:
    from onnxruntime.quantization import (
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    logging.getLogger().setLevel(logging.ERROR)  # "please run pre-processing" warnings
    calib = _Reader(_feeds(sample_shape, seed=100, n=4))
    u8, s8 = QuantType.QUInt8, QuantType.QInt8
    if fmt == "dynamic_s8":
        quantize_dynamic(src, out, weight_type=s8)
    elif fmt == "dynamic_u8":
        quantize_dynamic(src, out, weight_type=u8)
    elif fmt == "qdq_u8":
        quantize_static(
            src, out, calib, quant_format=QuantFormat.QDQ, activation_type=u8, weight_type=u8
        )
    elif fmt == "qdq_s8_per_channel":
        quantize_static(
            src,
            out,
            calib,
            quant_format=QuantFormat.QDQ,
            activation_type=s8,
            weight_type=s8,
            per_channel=True,
        )
    elif fmt == "qoperator_u8":
        quantize_static(
            src, out, calib, quant_format=QuantFormat.QOperator, activation_type=u8, weight_type=u8
        )
    elif fmt == "qoperator_s8_per_channel":
        quantize_static(
            src,
            out,
            calib,
            quant_format=QuantFormat.QOperator,
            activation_type=s8,
            weight_type=s8,
            per_channel=True,
        )
    elif fmt == "qdq_u16_contrib":
        quantize_static(
            src,
            out,
            calib,
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QUInt16,
            weight_type=u8,
            extra_options={"UseQDQContribOps": True},
        )
    else:
        raise AssertionError(fmt)
    return onnx.load(str(out))


# ------------------------------------------------------------------------ expectations


def _arrays(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def _numpy_dequant(q, scale, zp, axis=None, block=0) -> np.ndarray:
    """Independent numpy reference: (q - zp) * scale, in float32."""
    q = np.asarray(q).astype(np.int64)
    scale = np.asarray(scale, dtype=np.float32)
    zp = np.zeros_like(scale, dtype=np.int64) if zp is None else np.asarray(zp).astype(np.int64)
    if block:
        scale = np.repeat(scale, block, axis=axis).take(range(q.shape[axis]), axis=axis)
        zp = np.repeat(zp, block, axis=axis).take(range(q.shape[axis]), axis=axis)
    elif scale.size > 1:
        shape = [1] * q.ndim
        shape[axis] = -1
        scale, zp = scale.reshape(shape), zp.reshape(shape)
    return (q - zp).astype(np.float32) * scale


def _expected_weights(q: onnx.ModelProto) -> list[tuple[str, np.ndarray]]:
    """Every constant quantized weight of an onnxruntime-quantized model, dequantized."""
    arr = _arrays(q)
    out = []

    def add(node, data, scale, zp, axis):
        names = list(node.input) + [""] * 9
        if names[data] not in arr or names[scale] not in arr:
            return
        zero = arr.get(names[zp]) if zp is not None else None
        out.append((names[data], _numpy_dequant(arr[names[data]], arr[names[scale]], zero, axis)))

    for node in q.graph.node:
        op = node.op_type
        if op == "DequantizeLinear" and node.input[0] in arr:
            axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
            add(node, 0, 1, 2, axis)
        elif op in ("QLinearConv",):
            add(node, 3, 4, 5, 0)
        elif op in ("QLinearMatMul", "QLinearAdd", "QLinearMul"):
            add(node, 0, 1, 2, -2)
            add(node, 3, 4, 5, -1)
        elif op == "QGemm":
            trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
            add(node, 3, 4, 5, 0 if trans_b else 1)
        elif op in ("MatMulInteger", "ConvInteger"):
            w = node.input[1]  # quantize_dynamic names: w_quantized, w_scale, w_zero_point
            scale = arr[w.removesuffix("_quantized") + "_scale"]
            zp = arr[node.input[3]]
            axis = 0 if op == "ConvInteger" else -1
            out.append((w, _numpy_dequant(arr[w], scale, zp, axis)))
    return out


def _assert_weights_exact(q: onnx.ModelProto, d: onnx.ModelProto) -> int:
    """Each expected weight is, bit for bit, one of the dequantized model's initializers."""
    floats = list(_arrays(d).values())
    expected = _expected_weights(q)
    for name, want in expected:
        match = [
            f
            for f in floats
            if f.size == want.size
            and f.dtype == want.dtype
            and (np.array_equal(f, want) or np.array_equal(f, want.T))
        ]
        assert match, f"no float initializer equals (W - zp) * scale for {name}"
    return len(expected)


def _op_types(model: onnx.ModelProto) -> set[str]:
    ops = {n.op_type for n in model.graph.node}
    for fn in model.functions:
        ops |= {n.op_type for n in fn.node}
    return ops


def _check_float(d: onnx.ModelProto) -> None:
    assert not detect_quantization(d).quantized
    assert not (_op_types(d) & QUANT_OPS)
    assert MS not in {o.domain for o in d.opset_import}
    onnx.checker.check_model(d, full_check=True)


def _check_idempotent(d: onnx.ModelProto) -> None:
    again, report = dequantize_model(d)
    assert report.changed is False
    assert report.describe() == "already float: nothing to do"
    assert again.SerializeToString() == d.SerializeToString()


def _sqnr(path_ref: Path, path: Path, feeds) -> float:
    refs = run_model(path_ref, feeds)
    return compare_runs(refs, run_model(path, feeds))["y"]["sqnr_db"]


# ---------------------------------------------------------------------- numerical matrix

CASES = [
    ("mlp", "dynamic_s8"),
    ("mlp", "dynamic_u8"),
    ("mlp", "qdq_u8"),
    ("mlp", "qdq_s8_per_channel"),
    ("mlp", "qoperator_u8"),
    ("mlp", "qdq_u16_contrib"),
    ("attention", "dynamic_s8"),
    ("attention", "dynamic_u8"),
    ("attention", "qdq_u8"),
    ("attention", "qdq_s8_per_channel"),
    ("attention", "qoperator_u8"),
    ("attention", "qoperator_s8_per_channel"),
    ("convnet", "dynamic_s8"),
    ("convnet", "dynamic_u8"),
    ("convnet", "qdq_u8"),
    ("convnet", "qdq_s8_per_channel"),
    ("convnet", "qoperator_u8"),
    ("convnet", "qoperator_s8_per_channel"),
    ("zoo", "qoperator_u8"),
    ("zoo", "qdq_u8"),
]


@pytest.mark.parametrize(("name", "fmt"), CASES, ids=[f"{m}-{f}" for m, f in CASES])
def test_quantized_models_dequantize_to_float(tmp_path: Path, name: str, fmt: str):
    build, sample_shape = FLOAT_MODELS[name]
    src = tmp_path / "float.onnx"
    onnx.save(build(tmp_path), str(src))
    q = _quantize(src, fmt, sample_shape, tmp_path / "quant.onnx")
    assert detect_quantization(q).quantized
    before = q.SerializeToString()

    d, report = dequantize_model(q)

    assert q.SerializeToString() == before, "the input model was modified"
    assert report.changed and not report.remaining
    _check_float(d)
    n_weights = _assert_weights_exact(q, d)
    assert n_weights > 0
    onnx.save(d, str(tmp_path / "deq.onnx"))
    feeds = _feeds(sample_shape, seed=7)
    q_db = _sqnr(src, tmp_path / "quant.onnx", feeds)
    d_db = _sqnr(src, tmp_path / "deq.onnx", feeds)
    print(
        f"\nSQNR {name:9s} {fmt:20s} quantized {q_db:6.1f} dB  dequantized {d_db:6.1f} dB"
        f"  | {report.describe()}"
    )
    assert d_db >= q_db - SQNR_EPSILON_DB
    _check_idempotent(d)


def test_float_op_structure_is_restored(tmp_path: Path):
    """The dynamic conv net comes back as Conv(+bias) with its attributes, DQL shared."""
    src = tmp_path / "float.onnx"
    onnx.save(conv_model(), str(src))
    q = _quantize(src, "dynamic_s8", (3, 12, 12), tmp_path / "q.onnx")
    d, report = dequantize_model(q)
    assert report.counts["conv_integer_replaced"] == 2
    assert report.counts["bias_add_folded"] == 2
    convs = [n for n in d.graph.node if n.op_type == "Conv"]
    assert [len(n.input) for n in convs] == [3, 3]
    for node, want in zip(convs, CONV_ATTRS.values(), strict=True):
        got = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        assert {k: got[k] for k in want} == want
    assert [n.op_type for n in d.graph.node] == [
        "Conv",
        "Relu",
        "Conv",
        "Relu",
        "GlobalAveragePool",
        "Flatten",
        "MatMul",
        "Add",
    ]
    assert {i.name for i in d.graph.initializer} >= {"c1_w", "c1_b", "c2_w", "fc_w"}


def test_one_dynamic_quantize_linear_shared_by_several_integer_ops(tmp_path: Path):
    src = tmp_path / "float.onnx"
    onnx.save(attention_model(), str(src))
    q = _quantize(src, "dynamic_s8", (6, 16), tmp_path / "q.onnx")
    dql = [n for n in q.graph.node if n.op_type == "DynamicQuantizeLinear"]
    users = [
        n for n in q.graph.node if n.op_type == "MatMulInteger" and n.input[0] == "x_quantized"
    ]
    assert len(dql) == 2 and len(users) == 3
    d, report = dequantize_model(q)
    assert report.counts == {"matmul_integer_replaced": 4}
    assert report.describe() == "replaced 4 MatMulInteger fusions"
    restored = sorted(n.op_type for n in d.graph.node)
    assert restored == sorted(n.op_type for n in attention_model().graph.node)


def test_onnxruntime_fused_dynamic_quantize_matmul(tmp_path: Path):
    """ORT's EXTENDED optimizer fuses quantize_dynamic output into DynamicQuantizeMatMul."""
    src = tmp_path / "float.onnx"
    onnx.save(mlp_model(tmp_path), str(src))
    _quantize(src, "dynamic_u8", (4,), tmp_path / "q.onnx")
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(tmp_path / "fused.onnx")
    ort.InferenceSession(str(tmp_path / "q.onnx"), so, providers=["CPUExecutionProvider"])
    fused = onnx.load(str(tmp_path / "fused.onnx"))
    assert "DynamicQuantizeMatMul" in _op_types(fused)
    d, report = dequantize_model(fused)
    assert report.counts["dynamic_quantize_matmul_replaced"] == 2
    _check_float(d)
    onnx.save(d, str(tmp_path / "d.onnx"))
    feeds = _feeds((4,), seed=3)
    assert _sqnr(src, tmp_path / "d.onnx", feeds) >= _sqnr(src, tmp_path / "fused.onnx", feeds)
    _check_idempotent(d)


# ------------------------------------------------------------------- hand-built patterns


def _run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    """Outputs by the plain kernels: no graph optimization (which fuses DQ -> MatMul into
    ops that also quantize the activations)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def test_matmul_integer_to_float():
    rng = np.random.default_rng(4)
    wq = rng.integers(-100, 100, (8, 5)).astype(np.int8)
    ws = (rng.random(5) * 0.02 + 0.01).astype(np.float32)
    inits = [_t("wq", wq), _t("ws", ws), _t("wzp", np.zeros(5, np.int8)), _t("b", _randn(rng, 5))]
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"], name="dql"),
        helper.make_node(
            "MatMulIntegerToFloat",
            ["xq", "wq", "xs", "ws", "xz", "wzp", "b"],
            ["y"],
            domain=MS,
            name="mm",
        ),
    ]
    q = _model(
        nodes, [_vi("x", TensorProto.FLOAT, [3, 8])], [_vi("y", TensorProto.FLOAT, [3, 5])], inits
    )
    d, report = dequantize_model(q)
    assert report.counts == {"matmul_integer_to_float_replaced": 1}
    _check_float(d)
    assert [n.op_type for n in d.graph.node] == ["MatMul", "Add"]
    w = _arrays(d)["wq"]
    assert np.array_equal(w, _numpy_dequant(wq, ws, None, axis=-1))
    x = rng.standard_normal((3, 8)).astype(np.float32)
    want = x @ w + numpy_helper.to_array(inits[3])
    np.testing.assert_allclose(_run(d, {"x": x})[0], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_run(q, {"x": x})[0], want, atol=0.05)
    _check_idempotent(d)


def test_qgemm_alpha_and_int32_bias_match_the_kernel():
    """QGemm's C is int32 at scale alpha * a_scale * b_scale (checked on onnxruntime's kernel)."""
    rng = np.random.default_rng(15)
    # |b| <= 60: on CPUs where MLAS multiplies u8 x s8 with VPMADDUBSW, each pair of products
    # saturates at int16 (2 * 255 * 100 would); 2 * 255 * 60 stays exact on every kernel.
    b = rng.integers(-60, 61, (5, 4)).astype(np.int8)
    c = rng.integers(-1000, 1000, 5).astype(np.int32)
    inits = [
        _t("as", np.array(0.02, np.float32)),
        _t("az", np.array(128, np.uint8)),
        _t("B", b),
        _t("bs", (rng.random(5) * 0.03 + 0.01).astype(np.float32)),
        _t("bz", np.zeros(5, np.int8)),
        _t("C", c),
    ]
    node = helper.make_node(
        "QGemm",
        ["A", "as", "az", "B", "bs", "bz", "C"],
        ["y"],
        domain=MS,
        name="qgemm",
        transB=1,
        alpha=0.5,
    )
    q = _model(
        [node], [_vi("A", TensorProto.UINT8, [3, 4])], [_vi("y", TensorProto.FLOAT, [3, 5])], inits
    )
    d, report = dequantize_model(q)
    assert report.counts == {"qgemm_replaced": 1}
    assert [n.op_type for n in d.graph.node] == ["DequantizeLinear", "Gemm"]  # uint8 input
    a = rng.integers(0, 256, (3, 4)).astype(np.uint8)
    np.testing.assert_allclose(_run(d, {"A": a})[0], _run(q, {"A": a})[0], rtol=1e-5, atol=1e-5)


def test_qlinear_softmax_with_opset_12_semantics_in_an_opset_17_model():
    inits = [
        _t("xs", np.array(0.05, np.float32)),
        _t("xz", np.array(128, np.uint8)),
        _t("ys", np.array(1 / 256, np.float32)),
        _t("yz", np.array(0, np.uint8)),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="q_in"),
        helper.make_node(
            "QLinearSoftmax",
            ["xq", "xs", "xz", "ys", "yz"],
            ["yq"],
            domain=MS,
            name="softmax",
            axis=1,
            opset=12,
        ),
        helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"], name="dq_out"),
    ]
    q = _model(
        nodes,
        [_vi("x", TensorProto.FLOAT, [2, 3, 4])],
        [_vi("y", TensorProto.FLOAT, [2, 3, 4])],
        inits,
    )
    d, report = dequantize_model(q)
    assert report.counts == {"qlinear_softmax_replaced": 1}
    assert [n.op_type for n in d.graph.node] == ["Flatten", "Softmax", "Shape", "Reshape"]
    _check_float(d)
    x = np.random.default_rng(16).standard_normal((2, 3, 4)).astype(np.float32)
    got = _run(d, {"x": x})[0]
    e = np.exp(x.reshape(2, 12) - x.reshape(2, 12).max(axis=1, keepdims=True))
    np.testing.assert_allclose(got, (e / e.sum(axis=1, keepdims=True)).reshape(2, 3, 4), rtol=1e-5)
    np.testing.assert_allclose(_run(q, {"x": x})[0], got, atol=0.01)  # the quantized kernel


def _dq_matmul_model(w_tensor: TensorProto, scale, zp, *, axis=None, block=0, domain="", opset=21):
    """x @ DequantizeLinear(w) with the given stored weight and parameters."""
    inits = [w_tensor, _t("s", scale)]
    inputs = ["w", "s"]
    if zp is not None:
        inits.append(zp if isinstance(zp, TensorProto) else _t("z", zp))
        inputs.append(inits[-1].name)
    attrs = {} if axis is None else {"axis": axis}
    if block:
        attrs["block_size"] = block
    nodes = [
        helper.make_node("DequantizeLinear", inputs, ["wf"], domain=domain, name="dq_w", **attrs),
        helper.make_node("MatMul", ["x", "wf"], ["y"], name="mm"),
    ]
    k, n = w_tensor.dims
    return _model(
        nodes,
        [_vi("x", TensorProto.FLOAT, [2, k])],
        [_vi("y", TensorProto.FLOAT, [2, n])],
        inits,
        opset=opset,
    )


def _int_tensor(name, dtype, values: np.ndarray) -> TensorProto:
    return helper.make_tensor(name, dtype, values.shape, values.flatten().tolist())


WEIGHT_CASES = {
    # name: (onnx dtype, value range, axis, block, with zero point)
    "int8_per_tensor": (TensorProto.INT8, (-128, 128), None, 0, True),
    "uint8_per_channel": (TensorProto.UINT8, (0, 256), 1, 0, True),
    "int16_per_channel": (TensorProto.INT16, (-30000, 30000), 1, 0, True),
    "uint16_per_tensor": (TensorProto.UINT16, (0, 65536), None, 0, True),
    "int4_blocked": (TensorProto.INT4, (-8, 8), 0, 16, False),
    "uint4_blocked_zp": (TensorProto.UINT4, (0, 16), 0, 16, True),
    "int8_blocked_axis1": (TensorProto.INT8, (-128, 128), 1, 4, True),
}


@pytest.mark.parametrize("case", list(WEIGHT_CASES))
def test_weight_dequantize_linear_folds_exactly(case: str):
    dtype, (lo, hi), axis, block, with_zp = WEIGHT_CASES[case]
    rng = np.random.default_rng(5)
    k, n = 40, 12
    q = rng.integers(lo, hi, (k, n))
    if block:
        shape = [k, n]
        shape[axis] = -(-shape[axis] // block)
        param_shape = tuple(shape)
    elif axis is not None:
        param_shape = (n,) if axis == 1 else (k,)
    else:
        param_shape = ()
    scale = (rng.random(param_shape) * 0.01 + 0.001).astype(np.float32)
    zp = None
    if with_zp:
        zp = _int_tensor("z", dtype, rng.integers(lo, hi, param_shape) // 2 + (lo + hi) // 4)
    model = _dq_matmul_model(_int_tensor("w", dtype, q), scale, zp, axis=axis, block=block)
    d, report = dequantize_model(model)
    assert report.counts == {"weight_dq_folded": 1}
    assert report.describe() == "folded 1 weight DQ"
    _check_float(d)
    zarr = None if zp is None else numpy_helper.to_array(zp)
    want = _numpy_dequant(q, scale, zarr, axis=axis if axis is not None else 0, block=block)
    (w,) = _arrays(d).values()
    assert w.dtype == np.float32 and np.array_equal(w, want)
    x = np.random.default_rng(6).standard_normal((2, k)).astype(np.float32)
    np.testing.assert_allclose(_run(d, {"x": x})[0], _run(model, {"x": x})[0], rtol=1e-5, atol=1e-5)
    _check_idempotent(d)


def test_weight_in_a_constant_node_and_contrib_domain():
    rng = np.random.default_rng(8)
    q = rng.integers(-128, 128, (6, 3)).astype(np.int8)
    nodes = [
        helper.make_node("Constant", [], ["w"], value=_t("wv", q)),
        helper.make_node("Constant", [], ["s"], value_float=0.05),
        helper.make_node("DequantizeLinear", ["w", "s"], ["wf"], domain=MS, name="dq"),
        helper.make_node("MatMul", ["x", "wf"], ["y"], name="mm"),
    ]
    model = _model(
        nodes, [_vi("x", TensorProto.FLOAT, [2, 6])], [_vi("y", TensorProto.FLOAT, [2, 3])]
    )
    d, report = dequantize_model(model)
    assert report.counts == {"weight_dq_folded": 1}
    _check_float(d)
    assert np.array_equal(_arrays(d)["w"], q.astype(np.float32) * np.float32(0.05))


def _qdq_chain(x: str, out: str, prefix: str, zp: int, domain: str = "") -> tuple[list, list]:
    inits = [
        _t(f"{prefix}_s", np.array(0.05, np.float32)),
        _t(f"{prefix}_z", np.array(zp, np.uint8)),
    ]
    nodes = [
        helper.make_node(
            "QuantizeLinear",
            [x, f"{prefix}_s", f"{prefix}_z"],
            [f"{prefix}_q"],
            name=f"{prefix}_quant",
            domain=domain,
        ),
        helper.make_node(
            "DequantizeLinear",
            [f"{prefix}_q", f"{prefix}_s", f"{prefix}_z"],
            [out],
            name=f"{prefix}_dequant",
            domain=domain,
        ),
    ]
    return nodes, inits


@pytest.mark.parametrize("domain", ["", MS])
def test_q_feeding_several_dqs_and_shape(domain: str):
    """One Q read by two DQs and a Shape: all rewired to the float tensor, Q removed."""
    inits = [_t("s", np.array(0.05, np.float32)), _t("z", np.array(128, np.uint8))]
    mk = helper.make_node
    nodes = [
        mk("Tanh", ["x"], ["t"], name="tanh"),
        mk("QuantizeLinear", ["t", "s", "z"], ["tq"], name="q", domain=domain),
        mk("DequantizeLinear", ["tq", "s", "z"], ["a"], name="dq_a", domain=domain),
        mk("DequantizeLinear", ["tq", "s", "z"], ["b"], name="dq_b", domain=domain),
        mk("Mul", ["a", "b"], ["m"], name="mul"),
        mk("Shape", ["tq"], ["shape"], name="shape"),
        mk("Reshape", ["m", "shape"], ["y"], name="reshape"),
    ]
    model = _model(
        nodes, [_vi("x", TensorProto.FLOAT, [2, 3])], [_vi("y", TensorProto.FLOAT, [2, 3])], inits
    )
    d, report = dequantize_model(model)
    assert report.counts == {"qdq_pairs_collapsed": 2}
    assert report.describe() == "collapsed 2 Q/DQ pairs"
    _check_float(d)
    assert [(n.op_type, list(n.input)) for n in d.graph.node] == [
        ("Tanh", ["x"]),
        ("Mul", ["t", "t"]),
        ("Shape", ["t"]),
        ("Reshape", ["m", "shape"]),
    ]
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_allclose(_run(d, {"x": x})[0], np.tanh(x) ** 2, rtol=1e-6)


def test_fused_relu_is_restored_from_a_range_starting_at_zero():
    """A u8 Q/DQ with zero point 0 clamps negatives (the Relu onnxruntime removed)."""
    nodes, inits = _qdq_chain("x", "r", "p", zp=0)
    nodes.append(helper.make_node("Neg", ["r"], ["y"], name="neg"))
    model = _model(
        nodes, [_vi("x", TensorProto.FLOAT, [4])], [_vi("y", TensorProto.FLOAT, [4])], inits
    )
    d, report = dequantize_model(model)
    assert report.counts == {"qdq_pairs_collapsed": 1, "relu_restored": 1}
    assert [n.op_type for n in d.graph.node] == ["Relu", "Neg"]
    x = np.array([-1.0, -0.01, 0.3, 2.0], np.float32)
    np.testing.assert_allclose(_run(d, {"x": x})[0], -np.maximum(x, 0))


def test_graph_output_keeps_its_name_and_interface_qdq_is_kept():
    """Q on a graph output and DQ of a uint8 graph input are the model's I/O: left alone."""
    inits = [_t("s", np.array(0.1, np.float32)), _t("z", np.array(128, np.uint8))]
    nodes = [
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["x"], name="in_dq"),
        helper.make_node("Sigmoid", ["x"], ["h"], name="sig"),
        helper.make_node("QuantizeLinear", ["h", "s", "z"], ["hq"], name="mid_q"),
        helper.make_node("DequantizeLinear", ["hq", "s", "z"], ["y"], name="out_dq"),
        helper.make_node("QuantizeLinear", ["y", "s", "z"], ["yq"], name="out_q"),
    ]
    model = _model(
        nodes,
        [_vi("xq", TensorProto.UINT8, [3])],
        [_vi("y", TensorProto.FLOAT, [3]), _vi("yq", TensorProto.UINT8, [3])],
        inits,
    )
    d, report = dequantize_model(model)
    assert report.counts == {"qdq_pairs_collapsed": 1}
    assert [o.name for o in d.graph.output] == ["y", "yq"]
    assert [n.op_type for n in d.graph.node] == ["DequantizeLinear", "Sigmoid", "QuantizeLinear"]
    onnx.checker.check_model(d, full_check=True)
    _check_idempotent(d)


def test_qdq_inside_an_if_branch():
    rng = np.random.default_rng(9)
    wq = rng.integers(-128, 128, (4, 4)).astype(np.int8)
    then_nodes, then_inits = _qdq_chain("x", "xd", "t", zp=128)
    then_nodes += [
        helper.make_node("DequantizeLinear", ["wq", "ws"], ["wf"], name="then_dq_w"),
        helper.make_node("MatMul", ["xd", "wf"], ["ty"], name="then_mm"),
    ]
    then_g = helper.make_graph(
        then_nodes, "then", [], [_vi("ty", TensorProto.FLOAT, [2, 4])], then_inits
    )
    else_g = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["ey"], name="else_neg")],
        "else",
        [],
        [_vi("ey", TensorProto.FLOAT, [2, 4])],
    )
    nodes = [
        helper.make_node("If", ["c"], ["y"], name="if", then_branch=then_g, else_branch=else_g)
    ]
    model = _model(
        nodes,
        [_vi("c", TensorProto.BOOL, []), _vi("x", TensorProto.FLOAT, [2, 4])],
        [_vi("y", TensorProto.FLOAT, [2, 4])],
        [_t("wq", wq), _t("ws", np.array(0.02, np.float32))],
    )
    d, report = dequantize_model(model)
    assert report.counts == {"weight_dq_folded": 1, "qdq_pairs_collapsed": 1}
    _check_float(d)
    branches = {a.name: [n.op_type for n in a.g.node] for a in d.graph.node[0].attribute}
    assert branches == {"then_branch": ["MatMul"], "else_branch": ["Neg"]}
    x = rng.standard_normal((2, 4)).astype(np.float32)
    want = x @ (wq.astype(np.float32) * np.float32(0.02))
    got = _run(d, {"c": np.array(True), "x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    _check_idempotent(d)


def test_qdq_inside_a_model_local_function():
    rng = np.random.default_rng(10)
    wq = rng.integers(-128, 128, (3, 3)).astype(np.int8)
    mk = helper.make_node
    body = [
        mk("Constant", [], ["wq"], value=_t("wq", wq)),
        mk("Constant", [], ["ws"], value=_t("ws", np.array(0.1, np.float32))),
        mk("Constant", [], ["s"], value=_t("s", np.array(0.05, np.float32))),
        mk("Constant", [], ["z"], value=_t("z", np.array(128, np.uint8))),
        mk("DequantizeLinear", ["wq", "ws"], ["wf"], name="f_dq_w"),
        mk("QuantizeLinear", ["a", "s", "z"], ["aq"], name="f_q"),
        mk("DequantizeLinear", ["aq", "s", "z"], ["ad"], name="f_dq"),
        mk("MatMul", ["ad", "wf"], ["out"], name="f_mm"),
    ]
    fn = helper.make_function("local", "QProj", ["a"], ["out"], body, [helper.make_opsetid("", 17)])
    nodes = [mk("QProj", ["x"], ["y"], domain="local", name="proj")]
    model = _model(
        nodes,
        [_vi("x", TensorProto.FLOAT, [2, 3])],
        [_vi("y", TensorProto.FLOAT, [2, 3])],
        functions=[fn],
    )
    d, report = dequantize_model(model)
    assert report.counts == {"weight_dq_folded": 1, "qdq_pairs_collapsed": 1}
    _check_float(d)
    assert [n.op_type for n in d.functions[0].node] == ["Constant", "MatMul"]
    x = rng.standard_normal((2, 3)).astype(np.float32)
    want = x @ (wq.astype(np.float32) * np.float32(0.1))
    np.testing.assert_allclose(_run(d, {"x": x})[0], want, rtol=1e-5, atol=1e-6)
    _check_idempotent(d)


# --------------------------------------------------------------------- weight-only ops


def _matmul_float(k: int, n: int, seed: int = 11) -> onnx.ModelProto:
    w = _randn(np.random.default_rng(seed), (k, n), 1.0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")]
    return _model(
        nodes,
        [_vi("x", TensorProto.FLOAT, ["batch", k])],
        [_vi("y", TensorProto.FLOAT, ["batch", n])],
        [_t("w", w)],
        ms=False,
    )


@pytest.mark.parametrize(("bits", "symmetric"), [(4, True), (4, False), (8, False)])
def test_matmul_nbits_from_onnxruntime_quantizer(bits: int, symmetric: bool):
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    k, n = 80, 24  # K is not a multiple of the block: the last block is padded
    float_model = _matmul_float(k, n)
    cfg = DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=symmetric, bits=bits)
    quantizer = MatMulNBitsQuantizer(
        onnx.ModelProto.FromString(float_model.SerializeToString()), algo_config=cfg
    )
    quantizer.process()
    q = quantizer.model.model
    assert _op_types(q) == {"MatMulNBits"}
    d, report = dequantize_model(q)
    assert report.counts == {"matmul_nbits_replaced": 1}
    _check_float(d)
    x = np.random.default_rng(12).standard_normal((5, k)).astype(np.float32)
    y_q, y_d = _run(q, {"x": x})[0], _run(d, {"x": x})[0]
    np.testing.assert_allclose(y_d, y_q, rtol=1e-5, atol=1e-5)  # onnxruntime's own kernel
    y_f = _run(float_model, {"x": x})[0]
    q_db = compare_runs([{"y": y_f}], [{"y": y_q}])["y"]["sqnr_db"]
    d_db = compare_runs([{"y": y_f}], [{"y": y_d}])["y"]["sqnr_db"]
    print(
        f"\nSQNR matmul    MatMulNBits {bits}-bit sym={symmetric!s:5s} quantized {q_db:6.1f} dB"
        f"  dequantized {d_db:6.1f} dB"
    )
    assert d_db >= q_db - SQNR_EPSILON_DB
    _check_idempotent(d)


@pytest.mark.parametrize("zp_kind", ["float", "packed2", "none"])
def test_matmul_nbits_hand_built(zp_kind: str):
    rng = np.random.default_rng(13)
    bits = 2 if zp_kind == "packed2" else 4
    k, n, block = 64, 8, 16
    k_blocks = k // block
    packed = rng.integers(0, 256, (n, k_blocks, block * bits // 8)).astype(np.uint8)
    inits = [_t("B", packed), _t("scales", (rng.random(n * k_blocks) * 0.1).astype(np.float32))]
    inputs = ["A", "B", "scales"]
    if zp_kind == "float":
        inits.append(_t("zp", (rng.random((n, k_blocks)) * 15).astype(np.float32)))
    elif zp_kind == "packed2":
        inits.append(_t("zp", rng.integers(0, 256, (n, 1)).astype(np.uint8)))
    inputs.append("zp" if zp_kind != "none" else "")
    inits.append(_t("bias", _randn(rng, n)))
    inputs += ["", "bias"]
    node = helper.make_node(
        "MatMulNBits",
        inputs,
        ["y"],
        domain=MS,
        name="mmnb",
        K=k,
        N=n,
        bits=bits,
        block_size=block,
        accuracy_level=1,
    )
    q = _model(
        [node],
        [_vi("A", TensorProto.FLOAT, [3, k])],
        [_vi("y", TensorProto.FLOAT, [3, n])],
        inits,
        opset=21,
    )
    d, report = dequantize_model(q)
    assert report.counts == {"matmul_nbits_replaced": 1}
    _check_float(d)
    assert [x.op_type for x in d.graph.node] == ["MatMul", "Add"]
    a = rng.standard_normal((3, k)).astype(np.float32)
    np.testing.assert_allclose(_run(d, {"A": a})[0], _run(q, {"A": a})[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("dtype", "bits", "with_zp"),
    [
        (TensorProto.INT4, 4, False),
        (TensorProto.UINT4, 4, True),
        (TensorProto.UINT8, 4, True),
        (TensorProto.UINT8, 8, False),
    ],
)
def test_gather_block_quantized(dtype: int, bits: int, with_zp: bool):
    rng = np.random.default_rng(14)
    rows, cols, block = 10, 64, 16
    if dtype == TensorProto.UINT8:
        per_byte = 8 // bits
        data = _t("table", rng.integers(0, 256, (rows, cols // per_byte)).astype(np.uint8))
        zp = _t("zp", rng.integers(0, 256, (rows, cols // block // per_byte)).astype(np.uint8))
    else:
        lo, hi = (-8, 8) if dtype == TensorProto.INT4 else (0, 16)
        data = _int_tensor("table", dtype, rng.integers(lo, hi, (rows, cols)))
        zp = _int_tensor("zp", dtype, rng.integers(lo, hi, (rows, cols // block)))
    scales = _t("scales", (rng.random((rows, cols // block)) * 0.1).astype(np.float32))
    inits = [data, scales] + ([zp] if with_zp else [])
    node = helper.make_node(
        "GatherBlockQuantized",
        ["table", "ids", "scales"] + (["zp"] if with_zp else []),
        ["y"],
        domain=MS,
        name="embed",
        bits=bits,
        block_size=block,
        quantize_axis=1,
        gather_axis=0,
    )
    q = _model(
        [node],
        [_vi("ids", TensorProto.INT64, [2, 3])],
        [_vi("y", TensorProto.FLOAT, [2, 3, cols])],
        inits,
        opset=21,
    )
    d, report = dequantize_model(q)
    assert report.counts == {"gather_block_quantized_replaced": 1}
    _check_float(d)
    assert [x.op_type for x in d.graph.node] == ["Gather"]
    ids = np.array([[0, 3, 9], [3, 1, 0]], np.int64)
    np.testing.assert_array_equal(_run(d, {"ids": ids})[0], _run(q, {"ids": ids})[0])
    _check_idempotent(d)


# ---------------------------------------------------------------------------- bad input


def test_float_model_is_returned_unchanged(tmp_path: Path):
    model = onnx.load(str(make_mlp_onnx(tmp_path / "mlp.onnx")))
    out, report = dequantize_model(model)
    assert isinstance(report, DequantizeReport)
    assert report.changed is False and report.counts == {} and report.remaining == []
    assert report.describe() == "already float: nothing to do"
    assert report.to_dict() == {
        "changed": False,
        "counts": {},
        "remaining": [],
        "summary": "already float: nothing to do",
    }
    assert out is not model and out.SerializeToString() == model.SerializeToString()


def test_scale_from_a_graph_input_is_refused():
    q = np.ones((4, 2), np.int8)
    model = _dq_matmul_model(_t("w", q), np.array(0.1, np.float32), None, opset=17)
    model.graph.initializer.pop()  # drop the scale initializer ...
    model.graph.input.append(_vi("s", TensorProto.FLOAT, []))  # ... and feed it instead
    with pytest.raises(PassError) as err:
        dequantize_model(model)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("cannot dequantize node dq_w (DequantizeLinear): scale 's'")
    assert "not a constant" in msg


def test_activation_scale_from_a_graph_input_is_refused():
    nodes, inits = _qdq_chain("x", "y", "a", zp=128)
    model = _model(
        nodes,
        [_vi("x", TensorProto.FLOAT, [2]), _vi("a_s", TensorProto.FLOAT, [])],
        [_vi("y", TensorProto.FLOAT, [2])],
        inits[1:],
    )
    with pytest.raises(PassError, match=r"node a_quant \(QuantizeLinear\): scale 'a_s' is not"):
        dequantize_model(model)


def _qlinear_unary(op: str, zp_dtype=np.uint8, **attrs) -> onnx.ModelProto:
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(zp_dtype))
    inits = [
        _t("xs", np.array(0.1, np.float32)),
        _t("xz", np.array(3, zp_dtype)),
        _t("ys", np.array(0.1, np.float32)),
        _t("yz", np.array(3, zp_dtype)),
    ]
    node = helper.make_node(
        op, ["x", "xs", "xz", "ys", "yz"], ["y"], domain=MS, name="bad_op", **attrs
    )
    return _model([node], [_vi("x", elem, [1, 2, 3, 3])], [_vi("y", elem, None)], inits)


@pytest.mark.parametrize(
    ("model", "needle"),
    [
        (_qlinear_unary("QLinearGlobalAveragePool", channels_last=1), "channels_last=1"),
        (_qlinear_unary("QLinearSigmoid", bogus=2), "attribute 'bogus'"),
        (_qlinear_unary("QLinearLeakyRelu", zp_dtype=np.int16), "dtype int16"),
    ],
    ids=["channels_last", "unknown-attribute", "int16"],
)
def test_unsupported_qlinear_attribute_or_dtype(model: onnx.ModelProto, needle: str):
    with pytest.raises(PassError) as err:
        dequantize_model(model)
    msg = str(err.value)
    assert msg.startswith("cannot dequantize node bad_op (") and needle in msg
    assert "\n" not in msg


def test_float8_weight_is_refused():
    w = helper.make_tensor("w", TensorProto.FLOAT8E4M3FN, [4, 2], np.ones(8, np.float32))
    model = _dq_matmul_model(w, np.array(0.5, np.float32), None)
    with pytest.raises(PassError, match=r"dq_w \(DequantizeLinear\): dtype float8e4m3fn"):
        dequantize_model(model)


def test_unknown_quantized_ops_are_listed():
    nodes = [
        helper.make_node("QLinearFoo", [f"x{i}"], [f"y{i}"], domain=MS, name=f"foo{i}")
        for i in range(12)
    ]
    nodes.append(helper.make_node("MatMulBnb4", ["a", "b"], ["c"], domain=MS, name="bnb"))
    io = [_vi(f"x{i}", TensorProto.UINT8, [1]) for i in range(12)]
    outs = [_vi(f"y{i}", TensorProto.UINT8, [1]) for i in range(12)]
    model = _model(
        nodes,
        [*io, _vi("a", TensorProto.FLOAT, [1, 2])],
        [*outs, _vi("c", TensorProto.FLOAT, None)],
        [_t("b", np.zeros((1, 1, 1), np.uint8))],
    )
    with pytest.raises(PassError) as err:
        dequantize_model(model)
    shown = ", ".join(f"foo{i} (QLinearFoo)" for i in range(10))
    assert str(err.value) == f"cannot dequantize 13 nodes: {shown} and 3 more"


def test_real_unsupported_op_is_named():
    node = helper.make_node(
        "QAttention", ["x", "w", "b", "s", "ws"], ["y"], domain=MS, name="attn", num_heads=2
    )
    model = _model(
        [node],
        [_vi("x", TensorProto.FLOAT, [1, 2, 4])],
        [_vi("y", TensorProto.FLOAT, None)],
        [
            _t("w", np.zeros((4, 12), np.int8)),
            _t("b", np.zeros(12, np.float32)),
            _t("s", np.array(1.0, np.float32)),
            _t("ws", np.array(1.0, np.float32)),
        ],
    )
    with pytest.raises(PassError, match=r"^cannot dequantize 1 node: attn \(QAttention\)$"):
        dequantize_model(model)


def test_mismatched_q_dq_pair_is_reported_not_merged():
    """A requantizing pair (different scales) is not an identity: it is left and reported."""
    inits = [
        _t("s1", np.array(0.1, np.float32)),
        _t("s2", np.array(0.2, np.float32)),
        _t("z", np.array(128, np.uint8)),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s1", "z"], ["q"], name="q1"),
        helper.make_node("DequantizeLinear", ["q", "s2", "z"], ["y"], name="dq2"),
    ]
    model = _model(
        nodes, [_vi("x", TensorProto.FLOAT, [2])], [_vi("y", TensorProto.FLOAT, [2])], inits
    )
    with pytest.raises(PassError, match=r"cannot dequantize 2 nodes: q1 \(QuantizeLinear\), dq2"):
        dequantize_model(model)


def test_report_describe_and_to_dict():
    report = DequantizeReport(
        counts={"weight_dq_folded": 12, "qdq_pairs_collapsed": 40, "conv_integer_replaced": 9},
        changed=True,
        remaining=[],
    )
    assert report.describe() == (
        "folded 12 weight DQ, collapsed 40 Q/DQ pairs, replaced 9 ConvInteger fusions"
    )
    assert report.to_dict()["counts"] == report.counts
    assert report.to_dict()["summary"] == report.describe()


def test_mixed_precision_convert_chain():
    """Q(u16) -> DQ -> Q(u8) -> DQ (a precision convert) collapses pair by pair."""
    inits = [
        _t("s16", np.array(1e-4, np.float32)),
        _t("z16", np.array(32768, np.uint16)),
        _t("s8", np.array(0.02, np.float32)),
        _t("z8", np.array(128, np.uint8)),
    ]
    mk = helper.make_node
    nodes = [
        mk("Sin", ["x"], ["h"], name="sin"),
        mk("QuantizeLinear", ["h", "s16", "z16"], ["h16"], name="q16", domain=MS),
        mk("DequantizeLinear", ["h16", "s16", "z16"], ["hd"], name="dq16", domain=MS),
        mk("QuantizeLinear", ["hd", "s8", "z8"], ["h8"], name="q8"),
        mk("DequantizeLinear", ["h8", "s8", "z8"], ["y"], name="dq8"),
    ]
    model = _model(
        nodes, [_vi("x", TensorProto.FLOAT, [3])], [_vi("y", TensorProto.FLOAT, [3])], inits
    )
    d, report = dequantize_model(model)
    assert report.counts == {"qdq_pairs_collapsed": 2}
    _check_float(d)
    assert [(n.op_type, list(n.output)) for n in d.graph.node] == [("Sin", ["y"])]


def test_dynamic_quantize_linear_through_an_integer_transpose():
    """quantize_dynamic can route DQL output through Transpose to a DQ (SAM 3 decoder)."""
    rng = np.random.default_rng(17)
    wq = rng.integers(-127, 128, (4, 3)).astype(np.int8)
    inits = [
        _t("w_quantized", wq),
        _t("w_scale", np.array(0.02, np.float32)),
        _t("w_zero_point", np.array(0, np.int8)),
    ]
    mk = helper.make_node
    nodes = [
        mk("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"], name="dql"),
        mk("Transpose", ["xq"], ["xtq"], perm=[1, 0], name="t"),
        mk("DequantizeLinear", ["xtq", "xs", "xz"], ["xt"], name="dq_t"),
        mk("Mul", ["xs", "w_scale"], ["sc"], name="scales"),
        mk("MatMulInteger", ["xq", "w_quantized", "xz", "w_zero_point"], ["acc"], name="mm"),
        mk("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT, name="cast"),
        mk("Mul", ["accf", "sc"], ["y"], name="rescale"),
    ]
    model = _model(
        nodes,
        [_vi("x", TensorProto.FLOAT, [2, 4])],
        [_vi("y", TensorProto.FLOAT, [2, 3]), _vi("xt", TensorProto.FLOAT, [4, 2])],
        inits,
        ms=False,
    )
    d, report = dequantize_model(model)
    assert report.counts == {"matmul_integer_replaced": 1, "passthrough_converted": 1}
    _check_float(d)
    assert sorted(n.op_type for n in d.graph.node) == ["MatMul", "Transpose"]
    x = rng.standard_normal((2, 4)).astype(np.float32)
    y, xt = _run(d, {"x": x})
    np.testing.assert_allclose(y, x @ (wq.astype(np.float32) * np.float32(0.02)), rtol=1e-5)
    np.testing.assert_array_equal(xt, x.T)
