"""The power-of-two rescale of tiny MatMul operands (eps/qnn/rules/products.py): exact in
float, its new tensors' ranges scaled by the same power, and O(1) products left alone."""

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from winml_recipes.eps.qnn.rules.products import TINY_PEAK, rescale_tiny_products


def _attention(d: float) -> onnx.ModelProto:
    """softmax(a) @ (v * d), and a MatMul against a weight (never rescaled)."""
    nodes = [
        helper.make_node("Softmax", ["a"], ["p"], axis=-1),
        helper.make_node("Mul", ["v", "d"], ["t"]),
        helper.make_node("MatMul", ["p", "t"], ["y"], name="attn"),
        helper.make_node("MatMul", ["y", "w"], ["z"], name="proj"),
    ]
    inits = [numpy_helper.from_array(np.float32(d), "d"),
             numpy_helper.from_array(np.full((8, 4), 0.5, np.float32), "w")]  # fmt: skip
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 2, 16, 16]),
         helper.make_tensor_value_info("v", TensorProto.FLOAT, [1, 2, 16, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _ranges(model: onnx.ModelProto, feeds: dict) -> dict[str, tuple[float, float]]:
    names = ["p", "t", "y", "z"]
    tapped = onnx.ModelProto()
    tapped.CopyFrom(model)
    tapped.graph.output.extend(
        helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ["p", "t"]
    )
    values = ort.InferenceSession(tapped.SerializeToString()).run(names, feeds)
    return {
        n: (float(min(v.min(), 0)), float(max(v.max(), 0)))
        for n, v in zip(names, values, strict=True)
    }


def _feeds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"a": rng.normal(size=(1, 2, 16, 16)).astype(np.float32),
            "v": rng.normal(size=(1, 2, 16, 8)).astype(np.float32)}  # fmt: skip


def test_a_product_of_1e_minus_7_values_is_rescaled_exactly() -> None:
    model, feeds = _attention(1e-7), _feeds()
    ranges = _ranges(model, feeds)
    before = ort.InferenceSession(model.SerializeToString()).run(["y", "z"], feeds)
    new_ranges, rescaled = rescale_tiny_products(model, ranges)
    assert rescaled == {"attn": 21}  # peak ~4e-7: times 2^21 lands in [0.5, 1)
    after = ort.InferenceSession(model.SerializeToString()).run(["y", "z"], feeds)
    for b, a in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)  # powers of two: bit-exact in float
    scaled = next(n.input[1] for n in model.graph.node if n.name == "attn")
    assert new_ranges[scaled] == (ranges["t"][0] * 2.0**21, ranges["t"][1] * 2.0**21)
    assert 0.5 <= max(map(abs, new_ranges[scaled])) < 1.0
    assert [n.op_type for n in model.graph.node].count("Mul") == 3  # v * d, x 2^21, x 2^-21


def test_products_of_o1_values_are_left_alone() -> None:
    model, feeds = _attention(1.0), _feeds()
    ranges = _ranges(model, feeds)
    assert max(map(abs, ranges["t"])) > TINY_PEAK
    nodes = len(model.graph.node)
    new_ranges, rescaled = rescale_tiny_products(model, ranges)
    assert rescaled == {} and new_ranges == ranges and len(model.graph.node) == nodes
