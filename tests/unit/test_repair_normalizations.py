"""The `float_normalizations` divergence repair (quant/repair.py): offered where the layer the
target departs at reads a LayerNormalization within a few producers, and it floats every
LayerNormalization of the graph (HTP got the tiny MobileViT's MLP wrong after a quantized
LayerNormalization: 12.3 dB against the simulation, 62.6 with it float)."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from winml_recipes.quant.repair import QuantizeState, _repairs


def _transformer_mlp() -> onnx.GraphProto:
    """x -> LayerNorm -> MatMul -> x * sigmoid(x) -> MatMul -> + x -> LayerNorm -> y, and a
    Conv branch with no normalization above it."""
    w = {n: numpy_helper.from_array(np.ones(s, np.float32), n)
         for n, s in (("g", [8]), ("b", [8]), ("w1", [8, 16]), ("w2", [16, 8]),
                      ("k", [1, 1, 1, 1]))}  # fmt: skip
    nodes = [
        helper.make_node("LayerNormalization", ["x", "g", "b"], ["ln"], name="ln_1"),
        helper.make_node("MatMul", ["ln", "w1"], ["h"], name="fc1"),
        helper.make_node("Sigmoid", ["h"], ["s"], name="sig"),
        helper.make_node("Mul", ["h", "s"], ["silu"], name="silu"),
        helper.make_node("MatMul", ["silu", "w2"], ["o"], name="fc2"),
        helper.make_node("Add", ["o", "x"], ["r"], name="residual"),
        helper.make_node("LayerNormalization", ["r", "g", "b"], ["y"], name="ln_2"),
        helper.make_node("Conv", ["img", "k"], ["c"], name="conv"),
        helper.make_node("Relu", ["c"], ["z"], name="relu"),
    ]
    return helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8]),
         helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, 1, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        list(w.values()),
    )  # fmt: skip


def _state(graph: onnx.GraphProto, exclude: list[str] | None = None) -> QuantizeState:
    tensors = [o for n in graph.node for o in n.output]
    return QuantizeState({t: (-1.0, 1.0) for t in tensors}, {}, exclude or [])


def _offered(node_name: str, exclude: list[str] | None = None) -> dict[str, QuantizeState]:
    graph = _transformer_mlp()
    node = next(n for n in graph.node if n.name == node_name)
    return dict(_repairs(node, _state(graph, exclude), "uint16", graph))


def test_the_mlp_after_a_layernorm_gets_every_layernorm_in_float() -> None:
    offered = _offered("silu")  # two producers below ln_1
    assert list(offered) == ["float", "float_normalizations"]  # tried after the layer alone
    assert offered["float_normalizations"].exclude == ["ln_1", "ln_2"]


def test_no_normalization_above_the_layer_no_such_repair() -> None:
    assert "float_normalizations" not in _offered("relu")


def test_layernorms_already_float_are_not_offered_again() -> None:
    assert "float_normalizations" not in _offered("silu", exclude=["ln_1", "ln_2"])
    assert _offered("silu", exclude=["ln_1"])["float_normalizations"].exclude == ["ln_1", "ln_2"]
