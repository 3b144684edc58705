"""The float rewrites made for QNN HTP (the prepare pass's `htp` stage) compute what the
graph computed (CPU EP, before and after), and leave alone what they cannot rewrite exactly."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from winml_recipes.eps.qnn import PLUGIN as QNN
from winml_recipes.graph.pipeline import prepare

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _run(model: onnx.ModelProto, feed: dict) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString()).run(None, feed)[0]


def _same_after(model: onnx.ModelProto, feed: dict, rule: str) -> tuple[int, list[str]]:
    """How many nodes `rule` replaced in the `ep` stage, and the op types after (the
    prepared model is written into `model`)."""
    before = _run(model, feed)
    done = prepare(model, ["ep"], ep_rules=QNN.graph_rules())
    np.testing.assert_allclose(_run(done.model, feed), before, rtol=1e-5, atol=1e-6)
    model.CopyFrom(done.model)
    return done.log.count(rule), [n.op_type for n in model.graph.node]


def test_batchnorm_on_a_sequence_becomes_mul_add() -> None:
    rng = np.random.default_rng(0)
    c = 6
    params = [rng.uniform(0.5, 1.5, c), rng.normal(0, 0.3, c), rng.normal(0, 1, c),
              rng.uniform(0.2, 2.0, c)]  # fmt: skip
    names = ["gamma", "beta", "mean", "var"]
    model = _model(
        [helper.make_node("BatchNormalization", ["x", *names], ["y"], epsilon=1e-3)],
        [helper.make_tensor_value_info("x", F, [2, c, 10])],
        [helper.make_tensor_value_info("y", F, [2, c, 10])],
        [
            numpy_helper.from_array(p.astype(np.float32), n)
            for p, n in zip(params, names, strict=True)
        ],
    )
    feed = {"x": rng.normal(0, 2, (2, c, 10)).astype(np.float32)}
    count, ops = _same_after(model, feed, "batchnorm_to_mul_add")
    assert count == 1 and ops == ["Mul", "Add"]


@pytest.mark.parametrize("low", [float(np.finfo(np.float32).min), -1e4])
def test_where_between_constants_becomes_arithmetic(low: float) -> None:
    model = _model(
        [
            helper.make_node("Cast", ["m"], ["c"], to=TensorProto.BOOL),
            helper.make_node("Where", ["c", "zero", "low"], ["y"]),
        ],
        [helper.make_tensor_value_info("m", TensorProto.INT64, [1, 8])],
        [helper.make_tensor_value_info("y", F, [1, 8])],
        [
            numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
            numpy_helper.from_array(np.array(low, np.float32), "low"),
        ],
    )
    feed = {"m": np.array([[1, 1, 1, 0, 1, 0, 0, 0]], np.int64)}
    count, ops = _same_after(model, feed, "where_of_constants_to_arithmetic")
    assert count == 1 and "Where" not in ops


def test_where_with_an_infinite_constant_is_left_alone() -> None:
    model = _model(
        [
            helper.make_node("Cast", ["m"], ["c"], to=TensorProto.BOOL),
            helper.make_node("Where", ["c", "zero", "low"], ["y"]),
        ],
        [helper.make_tensor_value_info("m", TensorProto.INT64, [4])],
        [helper.make_tensor_value_info("y", F, [4])],
        [
            numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
            numpy_helper.from_array(np.array(-np.inf, np.float32), "low"),
        ],
    )
    count, ops = _same_after(
        model, {"m": np.array([1, 0, 1, 0], np.int64)}, "where_of_constants_to_arithmetic"
    )
    assert count == 0 and "Where" in ops


def test_erf_gelu_becomes_one_gelu() -> None:
    """x * 0.5 * (1 + erf(x / sqrt(2))), as the TorchScript exporter writes nn.GELU."""
    consts = {"sqrt2": math.sqrt(2.0), "one": 1.0, "half": 0.5}
    model = _model(
        [
            helper.make_node("Div", ["x", "sqrt2"], ["d"]),
            helper.make_node("Erf", ["d"], ["e"]),
            helper.make_node("Add", ["e", "one"], ["a"]),
            helper.make_node("Mul", ["x", "a"], ["m"]),
            helper.make_node("Mul", ["m", "half"], ["y"]),
            helper.make_node("Neg", ["y"], ["z"]),
        ],
        [helper.make_tensor_value_info("x", F, [2, 16])],
        [helper.make_tensor_value_info("z", F, [2, 16])],
        [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in consts.items()],
    )
    feed = {"x": np.linspace(-4, 4, 32, dtype=np.float32).reshape(2, 16)}
    count, ops = _same_after(model, feed, "erf_gelu_to_gelu")
    assert count == 1 and ops == ["Gelu", "Neg"]
    # onnx cannot infer a com.microsoft op's output: prepare keeps its type for calibration
    typed = {vi.name: vi.type.tensor_type.elem_type for vi in model.graph.value_info}
    assert typed == {"y": F}


@pytest.mark.parametrize("op", ["ScatterElements", "ScatterND"])
def test_scatter_of_constants_becomes_mul_add(op: str) -> None:
    """`x[:, :, 2] = c` (box corners' "not a point" embedding) with constant indices and
    updates: x * keep + table, the same values."""
    rng = np.random.default_rng(0)
    updates = rng.normal(size=(1, 1, 1, 6)).astype(np.float32)
    if op == "ScatterElements":
        index = np.full((1, 1, 1, 6), 2, np.int64)
        node = helper.make_node(op, ["x", "idx", "upd"], ["y"], axis=2)
    else:
        index = np.array([[[[0, 0, 2]]]], np.int64)  # [1, 1, 1, 3]: x[0, 0, 2, :]
        node = helper.make_node(op, ["x", "idx", "upd"], ["y"])
        updates = updates.reshape(1, 1, 1, 6)
    model = _model(
        [node],
        [helper.make_tensor_value_info("x", F, [1, 1, 3, 6])],
        [helper.make_tensor_value_info("y", F, [1, 1, 3, 6])],
        [numpy_helper.from_array(index, "idx"), numpy_helper.from_array(updates, "upd")],
    )
    count, ops = _same_after(model, {"x": rng.normal(size=(1, 1, 3, 6)).astype(np.float32)},
                             "constant_scatter_to_arithmetic")  # fmt: skip
    assert count == 1 and ops == ["Mul", "Add"]


@pytest.mark.parametrize("permuted", [False, True])
def test_gathernd_at_constant_indices_becomes_reshape(permuted: bool) -> None:
    """dynamo's BERT mask `m[None, None, :, :]` as GatherND([[0, 0], [0, 1], ...])."""
    cols = np.arange(8)[::-1] if permuted else np.arange(8)
    index = np.stack([np.zeros(8, np.int64), cols], -1).reshape(1, 1, 1, 8, 2)
    model = _model(
        [helper.make_node("GatherND", ["m", "idx"], ["y"])],
        [helper.make_tensor_value_info("m", F, [1, 8])],
        [helper.make_tensor_value_info("y", F, [1, 1, 1, 8])],
        [numpy_helper.from_array(index, "idx")],
    )
    feed = {"m": np.arange(8, dtype=np.float32)[None]}
    count, ops = _same_after(model, feed, "constant_gathernd_to_gather")
    assert count == 1 and ops == (["Reshape", "Gather", "Reshape"] if permuted else ["Reshape"])


def _batchnorm_branch(c: int) -> tuple[onnx.GraphProto, list]:
    rng = np.random.default_rng(1)
    names = ["gamma", "beta", "mean", "var"]
    params = [rng.uniform(0.5, 1.5, c), rng.normal(0, 0.3, c), rng.normal(0, 1, c),
              rng.uniform(0.2, 2.0, c)]  # fmt: skip
    inits = [
        numpy_helper.from_array(p.astype(np.float32), n) for p, n in zip(params, names, strict=True)
    ]
    branch = helper.make_graph(
        [helper.make_node("BatchNormalization", ["x", *names], ["b"])],
        "then", [], [helper.make_tensor_value_info("b", F, [2, c, 5])],
    )  # fmt: skip
    return branch, inits


def test_rules_rewrite_inside_subgraphs() -> None:
    """A BatchNormalization in an If branch (reading the outer x) is rewritten there too."""
    c = 4
    then, inits = _batchnorm_branch(c)
    other = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["o"])], "else", [],
        [helper.make_tensor_value_info("o", F, [2, c, 5])],
    )  # fmt: skip
    model = _model(
        [helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)],
        [helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x", F, [2, c, 5])],
        [helper.make_tensor_value_info("y", F, [2, c, 5])],
        inits,
    )  # fmt: skip
    x = np.random.default_rng(2).normal(size=(2, c, 5)).astype(np.float32)
    count, _ = _same_after(model, {"cond": np.array(True), "x": x}, "batchnorm_to_mul_add")
    branch = next(a.g for a in model.graph.node[0].attribute if a.name == "then_branch")
    assert count == 1 and [n.op_type for n in branch.node] == ["Mul", "Add"]


def test_ep_stage_can_be_left_out() -> None:
    """prepare without `ep` leaves what the HTP rules would rewrite."""
    model = _model(
        [helper.make_node("Add", ["x", "zero"], ["y"]), helper.make_node("Relu", ["y"], ["z"])],
        [helper.make_tensor_value_info("x", F, [2, 3])],
        [helper.make_tensor_value_info("z", F, [2, 3])],
        [numpy_helper.from_array(np.zeros(3, np.float32), "zero")],
    )
    assert not prepare(model, ["fold"]).log.nodes
    done = prepare(model, ["fold", "ep"], ep_rules=QNN.graph_rules())
    assert done.log.count("zero_constant_add") == 1
    assert [n.op_type for n in done.model.graph.node] == ["Relu"]


def test_rotate_pairwise_becomes_gather_with_signs_in_the_sin_table(tmp_path) -> None:
    """SAM 3's rotary embedding (`x * cos + rotate_pairwise(x) * sin`, as dynamo exports it):
    the rank-5 interleave becomes a Gather on the last axis, bit for bit the same."""
    from tests.sam3_blocks import rotary

    model = onnx.load(rotary(42, tmp_path / "rotary.onnx"))
    x = np.random.default_rng(0).normal(0, 3, (1, 16, 9, 64)).astype(np.float32)
    before = _run(model, {"x": x})
    done = prepare(model, ["ep"], ep_rules=QNN.graph_rules())
    np.testing.assert_array_equal(_run(done.model, {"x": x}), before)
    ops = [n.op_type for n in done.model.graph.node]
    assert done.log.count("rotate_pairwise_to_gather") == 1
    # the signs' Mul merged into the sin table's
    assert sorted(ops) == ["Add", "Gather", "Mul", "Mul"], ops


def test_an_interleave_that_is_no_rotation_is_left_alone(tmp_path) -> None:
    from tests.sam3_blocks import rotary

    model = onnx.load(rotary(42, tmp_path / "rotary.onnx"))
    neg = next(n for n in model.graph.node if n.op_type == "Neg")
    neg.input[0] = "x1"  # stack((-x1, x1)): not the rotation
    x = np.random.default_rng(1).normal(0, 1, (1, 16, 9, 64)).astype(np.float32)
    before = _run(model, {"x": x})
    done = prepare(model, ["ep"], ep_rules=QNN.graph_rules())
    np.testing.assert_array_equal(_run(done.model, {"x": x}), before)
    assert done.log.count("rotate_pairwise_to_gather") == 0
    assert "Concat" in [n.op_type for n in done.model.graph.node]


def test_max_with_minus_infinity_becomes_the_other_operand() -> None:
    """jax2tf's `Max(ReduceMax(x), -inf)` (magika's softmax): exact as x; a `Max` with a
    finite constant, and a `Min` with -inf, are left alone."""
    nodes = [
        helper.make_node("ReduceMax", ["x"], ["m"], name="rmax", keepdims=1),
        helper.make_node("Max", ["m", "minus_inf"], ["m2"], name="Maximum"),
        helper.make_node("Max", ["m2", "one"], ["m3"], name="floor"),
        helper.make_node("Min", ["m3", "minus_inf"], ["y"], name="keep"),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", F, [2, 5])],
        [helper.make_tensor_value_info("y", F, [2, 1])],
        [numpy_helper.from_array(np.array(-np.inf, np.float32), "minus_inf"),
         numpy_helper.from_array(np.array(-3.0, np.float32), "one")],
    )  # fmt: skip
    x = np.random.default_rng(3).normal(size=(2, 5)).astype(np.float32)
    count, ops = _same_after(model, {"x": x}, "infinite_bound_to_identity")
    assert count == 1
    assert ops == ["ReduceMax", "Max", "Min"]


def test_rank5_tanh_is_computed_at_rank4() -> None:
    """HTP refuses Tanh at rank 5: it runs on the leading axes merged, reshaped back
    (exact); a rank-4 Tanh and a rank-5 Sigmoid (HTP places it) are left alone."""
    nodes = [
        helper.make_node("Tanh", ["x"], ["t"], name="tanh5"),
        helper.make_node("Sigmoid", ["t"], ["s"], name="sig5"),
        helper.make_node("Reshape", ["s", "four"], ["r"], name="r"),
        helper.make_node("Tanh", ["r"], ["y"], name="tanh4"),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", F, [1, 2, 3, 4, 5])],
        [helper.make_tensor_value_info("y", F, [2, 3, 4, 5])],
        [numpy_helper.from_array(np.array([2, 3, 4, 5], np.int64), "four")],
    )
    x = np.random.default_rng(4).normal(0, 2, (1, 2, 3, 4, 5)).astype(np.float32)
    count, ops = _same_after(model, {"x": x}, "high_rank_unary_to_rank4")
    assert count == 1
    assert ops == ["Reshape", "Tanh", "Reshape", "Sigmoid", "Reshape", "Tanh"]
