"""One tiny graph per dequantize rule, run by onnxruntime's quantized kernel and as float.

Each graph reads its quantized input directly (so both models see the same values on the
grid) and dequantizes its quantized output with a DequantizeLinear, so the only
difference left is the output's rounding to its grid: onnxruntime rounds to the nearest
step, hence a tolerance of half an output step (plus float32 noise). A rewrite with a
wrong scale, zero point, axis or attribute is off by many steps.

The refusals check that the error names the node and gives the rule's reason.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from winml_recipes.onnx.quant import QOPERATOR_OPS, WEIGHT_ONLY_OPS
from winml_recipes.quant.dequantize import QUANT_OPS, dequantize_model
from winml_recipes.quant.dequantize.rules import fused_op_rules
from winml_recipes.quant.dequantize.state import DequantizeState
from winml_recipes.sdk.errors import PassError

MS = "com.microsoft"
U8, I8, F32 = TensorProto.UINT8, TensorProto.INT8, TensorProto.FLOAT


def _t(name: str, array) -> TensorProto:
    return numpy_helper.from_array(np.asarray(array), name)


def _model(nodes, inputs, inits, *, out_elem=F32, out_shape=None, opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, elem, shape) for n, elem, shape in inputs],
        [helper.make_tensor_value_info("y", out_elem, out_shape)],
        inits,
    )
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def _run(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


def _op_types(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def _check_rule(q: onnx.ModelProto, feeds: dict, y_step: float, *, replaced: str) -> list[str]:
    """Dequantize `q`, compare with onnxruntime's quantized kernel, return the float ops."""
    d, report = dequantize_model(q)
    assert report.counts.get(replaced) == 1, report.counts
    ops = _op_types(d)
    assert not (set(ops) & (QUANT_OPS - {"DequantizeLinear"})), ops
    assert [n.input[0] for n in d.graph.node if n.op_type == "DequantizeLinear"] == [
        i.name for i in q.graph.input if i.type.tensor_type.elem_type in (U8, I8)
    ], "only the DQ of a quantized graph input (the model's interface) stays"
    want, got = _run(q, feeds), _run(d, feeds)
    assert np.abs(want).max() > 20 * y_step, "the case must not be trivially small"
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=y_step / 2 * (1 + 1e-4))
    return ops


def _u8(rng, shape) -> np.ndarray:
    return rng.integers(0, 256, shape).astype(np.uint8)


def _dq_out(q_name: str, ys: float, yz: int) -> tuple[onnx.NodeProto, list[TensorProto]]:
    node = helper.make_node("DequantizeLinear", [q_name, "ys", "yz"], ["y"], name="out_dq")
    return node, [_t("ys", np.float32(ys)), _t("yz", np.uint8(yz))]


def _x_params(xs: float = 0.02, xz: int = 128) -> list[TensorProto]:
    return [_t("xs", np.float32(xs)), _t("xz", np.uint8(xz))]


# ----------------------------------------------------------------------------- the rules


def test_qlinear_conv_per_channel_weight_and_int32_bias():
    rng = np.random.default_rng(1)
    ws = (rng.random(4) * 0.01 + 0.005).astype(np.float32)
    inits = [
        *_x_params(),
        _t("w", rng.integers(-60, 61, (4, 2, 3, 3)).astype(np.int8)),
        _t("ws", ws),
        _t("wz", np.zeros(4, np.int8)),
        _t("b", rng.integers(-2000, 2000, 4).astype(np.int32)),
    ]
    conv = helper.make_node(
        "QLinearConv",
        ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"],
        ["yq"],
        name="conv1",
        pads=[1, 1, 1, 1],
        strides=[2, 2],
    )
    out, out_inits = _dq_out("yq", 0.15, 128)
    q = _model([conv, out], [("x", U8, [1, 2, 7, 7])], inits + out_inits)
    feeds = {"x": _u8(rng, (1, 2, 7, 7))}
    ops = _check_rule(q, feeds, 0.15, replaced="qlinear_conv_replaced")
    assert ops == ["DequantizeLinear", "Conv"]


def test_qlinear_matmul():
    rng = np.random.default_rng(2)
    inits = [
        *_x_params(),
        _t("w", _u8(rng, (6, 5))),
        _t("ws", np.float32(0.01)),
        _t("wz", np.uint8(120)),
    ]
    mm = helper.make_node(
        "QLinearMatMul", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["yq"], name="mm"
    )
    out, out_inits = _dq_out("yq", 0.1, 128)
    q = _model([mm, out], [("x", U8, [3, 6])], inits + out_inits)
    ops = _check_rule(q, {"x": _u8(rng, (3, 6))}, 0.1, replaced="qlinear_matmul_replaced")
    assert ops == ["DequantizeLinear", "MatMul"]


@pytest.mark.parametrize(("op", "float_op"), [("QLinearAdd", "Add"), ("QLinearMul", "Mul")])
def test_qlinear_binary(op: str, float_op: str):
    rng = np.random.default_rng(3)
    inits = [*_x_params(0.05), _t("b", _u8(rng, (2, 4))), _t("bs", np.float32(0.04))]
    inits.append(_t("bz", np.uint8(100)))
    node = helper.make_node(
        op, ["x", "xs", "xz", "b", "bs", "bz", "ys", "yz"], ["yq"], domain=MS, name="bin"
    )
    step = 0.12 if op == "QLinearAdd" else 0.4  # |x| <= 6.4, b in [-4, 6.2]: no clipping
    out, out_inits = _dq_out("yq", step, 128)
    q = _model([node, out], [("x", U8, [2, 4])], inits + out_inits)
    ops = _check_rule(
        q, {"x": _u8(rng, (2, 4))}, step, replaced=f"qlinear_{op[7:].lower()}_replaced"
    )
    assert ops == ["DequantizeLinear", float_op]


@pytest.mark.parametrize(
    ("op", "attrs", "step"),
    [
        ("QLinearSigmoid", {}, 1 / 256),
        ("QLinearLeakyRelu", {"alpha": 0.2}, 0.02),
        ("QLinearGlobalAveragePool", {}, 0.01),
        ("QLinearAveragePool", {"kernel_shape": [2, 2], "strides": [2, 2]}, 0.025),
    ],
)
def test_qlinear_unary(op: str, attrs: dict, step: float):
    rng = np.random.default_rng(4)
    yz = 0 if op == "QLinearSigmoid" else 128
    node = helper.make_node(
        op, ["x", "xs", "xz", "ys", "yz"], ["yq"], domain=MS, name="unary", **attrs
    )
    out, out_inits = _dq_out("yq", step, yz)
    q = _model([node, out], [("x", U8, [1, 3, 4, 4])], _x_params() + out_inits)
    key = "qlinear_" + {"QLinearSigmoid": "sigmoid", "QLinearLeakyRelu": "leaky_relu"}.get(
        op, "global_average_pool" if "Global" in op else "average_pool"
    )
    ops = _check_rule(q, {"x": _u8(rng, (1, 3, 4, 4))}, step, replaced=f"{key}_replaced")
    assert ops == ["DequantizeLinear", op.removeprefix("QLinear")]


def test_qlinear_softmax_opset_13():
    rng = np.random.default_rng(5)
    node = helper.make_node(
        "QLinearSoftmax",
        ["x", "xs", "xz", "ys", "yz"],
        ["yq"],
        domain=MS,
        name="softmax",
        axis=-1,
        opset=13,
    )
    out, out_inits = _dq_out("yq", 1 / 256, 0)
    q = _model([node, out], [("x", U8, [2, 8])], _x_params(0.03) + out_inits)
    ops = _check_rule(q, {"x": _u8(rng, (2, 8))}, 1 / 256, replaced="qlinear_softmax_replaced")
    assert ops == ["DequantizeLinear", "Softmax"]


def test_qlinear_concat_with_a_different_scale_per_input():
    rng = np.random.default_rng(6)
    inits = [*_x_params(), _t("c", _u8(rng, (2, 3))), _t("cs", np.float32(0.05))]
    inits.append(_t("cz", np.uint8(90)))
    node = helper.make_node(
        "QLinearConcat",
        ["ys", "yz", "x", "xs", "xz", "c", "cs", "cz"],
        ["yq"],
        domain=MS,
        name="cat",
        axis=1,
    )
    out, out_inits = _dq_out("yq", 0.06, 128)
    q = _model([node, out], [("x", U8, [2, 4])], inits + out_inits)
    ops = _check_rule(q, {"x": _u8(rng, (2, 4))}, 0.06, replaced="qlinear_concat_replaced")
    assert ops == ["DequantizeLinear", "Concat"]


def test_qgemm_with_a_quantized_output():
    rng = np.random.default_rng(7)
    inits = [
        *_x_params(),
        _t("w", rng.integers(-60, 61, (5, 4)).astype(np.int8)),
        _t("ws", np.float32(0.02)),
        _t("wz", np.int8(0)),
        _t("c", rng.integers(-500, 500, 5).astype(np.int32)),
    ]
    node = helper.make_node(
        "QGemm",
        ["x", "xs", "xz", "w", "ws", "wz", "c", "ys", "yz"],
        ["yq"],
        domain=MS,
        name="gemm",
        transB=1,
    )
    out, out_inits = _dq_out("yq", 0.04, 128)
    q = _model([node, out], [("x", U8, [3, 4])], inits + out_inits)
    ops = _check_rule(q, {"x": _u8(rng, (3, 4))}, 0.04, replaced="qgemm_replaced")
    assert ops == ["DequantizeLinear", "Gemm"]


def test_dynamic_quantize_matmul_with_bias():
    """Float in, float out: the kernel quantizes A itself; the float MatMul does not."""
    rng = np.random.default_rng(8)
    # |w| <= 60: MLAS's u8 x s8 kernel may saturate pairs of products at int16 otherwise
    w = rng.integers(-60, 61, (6, 3)).astype(np.int8)
    ws = (rng.random(3) * 0.02 + 0.01).astype(np.float32)
    inits = [_t("w", w), _t("ws", ws), _t("wz", np.zeros(3, np.int8))]
    inits.append(_t("bias", rng.standard_normal(3).astype(np.float32)))
    node = helper.make_node(
        "DynamicQuantizeMatMul", ["x", "w", "ws", "wz", "bias"], ["y"], domain=MS, name="dqmm"
    )
    q = _model([node], [("x", F32, [4, 6])], inits)
    d, report = dequantize_model(q)
    assert report.counts == {"dynamic_quantize_matmul_replaced": 1}
    assert _op_types(d) == ["MatMul", "Add"]
    x = rng.standard_normal((4, 6)).astype(np.float32)
    want = x @ (w.astype(np.float32) * ws) + numpy_helper.to_array(inits[-1])
    np.testing.assert_allclose(_run(d, {"x": x}), want, rtol=1e-5, atol=1e-5)
    # the kernel's own error: A rounded to its dynamic u8 grid, |x| <= 4 -> step <= 8/255
    a_step = float(np.ptp(np.append(x, 0))) / 255
    bound = a_step / 2 * np.abs(w.astype(np.float32) * ws).sum(axis=0).max()
    assert np.abs(_run(q, {"x": x}) - want).max() <= bound


def test_every_fused_op_the_detector_knows_has_a_rule_in_both_domains():
    state = DequantizeState(ir.from_proto(_model([], [("y", F32, [1])], [])))
    names = {str(rule) for rule in fused_op_rules(state)}
    integer_fusions = {"ConvInteger", "MatMulInteger"}  # a pass: their Mul chain varies
    for op in (QOPERATOR_OPS | WEIGHT_ONLY_OPS | {"DynamicQuantizeMatMul"}) - integer_fusions:
        assert {op, f"{op}[{MS}]"} <= names, op


# ---------------------------------------------------------------------------- refusals


def test_refused_qlinear_conv_names_the_node_and_the_reason():
    rng = np.random.default_rng(9)
    inits = [
        _t("xz", np.uint8(128)),
        _t("w", rng.integers(-60, 61, (2, 1, 1, 1)).astype(np.int8)),
        _t("ws", np.float32(0.01)),
        _t("wz", np.int8(0)),
    ]
    conv = helper.make_node(
        "QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"], name="conv1"
    )
    inits += [_t("ys", np.float32(0.03)), _t("yz", np.uint8(128))]
    q = _model([conv], [("x", U8, [1, 1, 2, 2]), ("xs", F32, [])], inits, out_elem=U8)
    with pytest.raises(PassError) as err:
        dequantize_model(q)
    assert str(err.value) == (
        "cannot dequantize node conv1 (QLinearConv): scale 'xs' is not a constant "
        "(fold it to an initializer first)"
    )


def test_refused_matmul_nbits_with_g_idx():
    inits = [
        _t("B", np.zeros((2, 1, 8), np.uint8)),
        _t("s", np.ones(2, np.float32)),
        _t("g", np.zeros(16, np.int32)),
    ]
    node = helper.make_node(
        "MatMulNBits",
        ["a", "B", "s", "", "g"],
        ["y"],
        domain=MS,
        name="mmnb",
        K=16,
        N=2,
        bits=4,
        block_size=16,
    )
    q = _model([node], [("a", F32, [1, 16])], inits)
    with pytest.raises(
        PassError, match=r"^cannot dequantize node mmnb \(MatMulNBits\): input g_idx"
    ):
        dequantize_model(q)


def test_refused_integer_fusion_without_its_scale_chain():
    """A MatMulInteger whose int32 output is read as is: no float form to restore."""
    inits = [_t("w", np.ones((2, 2), np.int8)), _t("wz", np.int8(0))]
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"], name="dql"),
        helper.make_node("MatMulInteger", ["xq", "w", "xz", "wz"], ["acc"], name="mmi"),
        helper.make_node("Cast", ["acc"], ["y"], to=F32, name="cast"),
    ]
    q = _model(nodes, [("x", F32, [2, 2])], inits)
    with pytest.raises(PassError) as err:
        dequantize_model(q)
    msg = str(err.value)
    assert msg.startswith("cannot dequantize 2 nodes: dql (DynamicQuantizeLinear), mmi ")
    assert msg.endswith(
        "; node mmi (MatMulInteger): its output is not Cast(to float) -> Mul by the input scales"
    )


def test_refused_requantizing_pair_says_why():
    inits = [_t("s1", np.float32(0.1)), _t("s2", np.float32(0.2)), _t("z", np.uint8(128))]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s1", "z"], ["q"], name="q1"),
        helper.make_node("DequantizeLinear", ["q", "s2", "z"], ["y"], name="dq2"),
    ]
    q = _model(nodes, [("x", F32, [2])], inits)
    with pytest.raises(PassError) as err:
        dequantize_model(q)
    assert str(err.value).endswith(
        "; node dq2 (DequantizeLinear): its scale or zero point differ from those of q1: "
        "a requantization"
    )


def test_rule_inside_a_model_local_function_makes_constant_nodes():
    """Functions have no initializers: the float weight is a Constant node in the body."""
    rng = np.random.default_rng(10)
    k, n, block = 32, 4, 16
    packed = rng.integers(0, 256, (n, k // block, block // 2)).astype(np.uint8)
    scales = (rng.random(n * k // block) * 0.1).astype(np.float32)
    mk = helper.make_node
    body = [
        mk("Constant", [], ["B"], value=_t("B", packed)),
        mk("Constant", [], ["s"], value=_t("s", scales)),
        mk("MatMulNBits", ["a", "B", "s"], ["out"], domain=MS, name="mmnb", K=k, N=n, bits=4,
           block_size=block),
    ]  # fmt: skip
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)]
    fn = helper.make_function("local", "Proj", ["a"], ["out"], body, opsets)
    proj = mk("Proj", ["x"], ["y"], domain="local", name="proj")
    q = _model([proj], [("x", F32, [2, k])], [], out_shape=[2, n])
    q.opset_import.append(helper.make_opsetid("local", 1))
    q.functions.append(fn)
    d, report = dequantize_model(q)
    assert report.counts == {"matmul_nbits_replaced": 1}
    assert [(n.op_type, n.domain) for n in d.functions[0].node] == [
        ("Constant", ""),
        ("MatMul", ""),
    ]
    assert not d.graph.initializer
    onnx.checker.check_model(d)
    x = rng.standard_normal((2, k)).astype(np.float32)
    np.testing.assert_allclose(_run(d, {"x": x}), _run(q, {"x": x}), rtol=1e-5, atol=1e-5)


def test_nodes_the_rules_do_not_rewrite_keep_their_names():
    """onnxscript's rewriter names unnamed nodes and dedups names; the rewrite undoes that."""
    mk = helper.make_node
    nodes = [
        mk("Relu", ["x0"], ["r"]),  # unnamed
        mk("Neg", ["r"], ["n1"], name="dup"),
        mk("Neg", ["n1"], ["x1"], name="dup"),
        mk("QuantizeLinear", ["x1", "xs", "xz"], ["x"], name="q"),
        mk("QLinearSigmoid", ["x", "xs", "xz", "ys", "yz"], ["yq"], domain=MS, name="sig"),
    ]
    out, out_inits = _dq_out("yq", 1 / 256, 0)
    q = _model([*nodes, out], [("x0", F32, [2])], _x_params() + out_inits)
    d, report = dequantize_model(q)
    assert report.counts == {"qlinear_sigmoid_replaced": 1}  # its Q/DQ pairs are its own
    assert [(n.name, n.op_type) for n in d.graph.node] == [
        ("", "Relu"),
        ("dup", "Neg"),
        ("dup", "Neg"),
        ("sig", "Sigmoid"),
    ]
