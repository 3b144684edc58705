"""Layers ranked by the noise they add on the target, not by their output's SQNR alone."""

from __future__ import annotations

import onnx
from onnx import helper

from winml_recipes.quant.divergence import TensorRow, _input_sqnr, rank_by_loss


def _row(tensor: str, input_db: float | None, out_db: float) -> TensorRow:
    return TensorRow(tensor, "MatMul", tensor, out_db, out_db, 200.0, input_db)


def test_the_layer_that_adds_the_most_noise_ranks_first() -> None:
    rows = [
        _row("first", None, 60.0),  # exact inputs to 60 dB: 1e-6 of noise
        _row("bad", 25.0, 15.0),  # 25 -> 15 dB: the real loss
        _row("after", 15.0, 14.8),  # downstream of it: low SQNR, little added
        _row("gain", 14.8, 20.0),  # a layer that recovers adds nothing
    ]
    assert [r.tensor for r in rank_by_loss(rows)] == ["bad", "after", "first", "gain"]
    assert rows[1].lost_db == 10.0 and rows[0].lost_db == 140.0


def test_input_sqnr_looks_through_unmeasured_ops() -> None:
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["a"], name="r"),
            helper.make_node("Reshape", ["a", "s"], ["b"], name="reshape"),  # not measured
            helper.make_node("Add", ["b", "c"], ["d"], name="add"),
            helper.make_node("Neg", ["x"], ["e"], name="neg"),
        ],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("d", onnx.TensorProto.FLOAT, [2])],
    )
    of = _input_sqnr(graph, {"a": 40.0, "c": 30.0, "d": 20.0})
    nodes = {n.name: n for n in graph.node}
    assert of(nodes["add"]) == 30.0  # min of a (through the Reshape) and c
    assert of(nodes["r"]) is None  # reads the graph input only: exact
    assert of(nodes["neg"]) is None
