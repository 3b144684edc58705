"""Which tensors the HTP encoding rules give one encoding (eps/qnn/rules/encodings.py).

What each rule fixes on the NPU is measured in tests/integration/test_qnn.py; here, which
graphs a rule reaches and which it leaves alone.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from winml_recipes.eps.qnn.rules.encodings import shared_encoding_groups
from winml_recipes.quant.calibrate import tensors_to_calibrate


def _branch(i: int, producer: str, via: list[str]) -> tuple[list, list, str]:
    """x -> producer -> via ops -> branch output, with the constants it needs."""
    inits = [numpy_helper.from_array(np.full((1, 2, 1, 1), i + 1.0, np.float32), f"k{i}")]
    if producer == "Concat":
        nodes = [
            helper.make_node("Mul", ["x", f"k{i}"], [f"m{i}"]),
            helper.make_node("Concat", ["x", f"m{i}"], [f"p{i}"], axis=1),
        ]
    elif producer == "Conv":
        w = np.ones((4, 2, 1, 1), np.float32) * (i + 1)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes = [helper.make_node("Conv", ["x", f"w{i}"], [f"p{i}"])]
    else:  # Tile of an Add: 4 channels, as the other producers
        nodes = [
            helper.make_node("Add", ["x", f"k{i}"], [f"a{i}"]),
            helper.make_node("Tile", [f"a{i}", "reps"], [f"p{i}"]),
        ]
    last = f"p{i}"
    for j, op in enumerate(via):
        out = f"v{i}_{j}"
        if op == "Reshape":
            nodes.append(helper.make_node("Reshape", [last, "flat"], [out]))
        else:  # the shape stays [1, 4, 3, 3]
            nodes.append(helper.make_node("Transpose", [last], [out], perm=[0, 1, 3, 2]))
        last = out
    return nodes, inits, last


def _groups(producer: str, via: list[str]) -> list[list[str]]:
    nodes, inits, heads = (
        [],
        [
            numpy_helper.from_array(np.array([1, 4, -1], np.int64), "flat"),
            numpy_helper.from_array(np.array([1, 2, 1, 1], np.int64), "reps"),
        ],
        [],
    )
    for i in range(3):
        n, c, last = _branch(i, producer, via)
        nodes += n
        inits += c
        heads.append(last)
    reshaped = "Reshape" in via
    nodes.append(helper.make_node("Concat", heads, ["y"], axis=2))
    for k, node in enumerate(nodes):
        node.name = f"n{k}"
    shape = [1, 4, 27] if reshaped else [1, 4, 9, 3]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    model = onnx.shape_inference.infer_shapes(model)
    return shared_encoding_groups(model, tensors_to_calibrate(model, None))


@pytest.mark.parametrize("via", [["Reshape"], ["Transpose"], ["Transpose", "Reshape"]])
def test_a_reshaped_concat_shares_the_outer_concats_encoding(via: list[str]) -> None:
    (group,) = _groups("Concat", via)
    chain = [f"v{i}_{j}" for i in range(3) for j in range(len(via))]
    assert group == sorted(["p0", "p1", "p2", *chain, "y"])


@pytest.mark.parametrize(("producer", "via"), [("Concat", []), ("Conv", ["Reshape"])])
def test_concat_inputs_htp_requantizes_are_left_alone(producer: str, via: list[str]) -> None:
    # a Concat read directly, and a Conv through a Reshape, are right on HTP as they are
    assert _groups(producer, via) == []


def test_a_concat_behind_an_op_that_keeps_its_input_encoding_is_left_alone() -> None:
    # Tile is neither shape-only nor a Concat: the branch reaches the outer Concat from it
    assert _groups("Tile", ["Reshape"]) == []
