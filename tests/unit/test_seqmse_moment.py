"""SeqMSE on a MatMul/Gemm scores each weight range over K rows that carry the inputs' second
moment (layers.second_moment_rows) instead of every row: the same choice and errors as the
real inputs, through the same onnxruntime runner."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from winml_recipes.quant.algorithms import seqmse
from winml_recipes.quant.algorithms.layers import (
    LayerRunner,
    WeightQuant,
    fake_quant,
    second_moment_rows,
    weight_layers,
)


def _model(op: str, k: int, n: int, w: np.ndarray):
    attrs = {"transB": 1} if op == "Gemm" else {}
    node = helper.make_node(op, ["x", "w"], ["y"], name="layer", **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.reshape(-1).tolist())],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


@pytest.mark.parametrize("op", ["MatMul", "Gemm"])
def test_folded_inputs_choose_the_same_ranges_as_every_row(op: str) -> None:
    rng = np.random.default_rng(0)
    k, n = 24, 16
    w = rng.normal(size=(n, k) if op == "Gemm" else (k, n)).astype(np.float32)
    # every output channel has one 40x tap on input channel 0, which is nearly silent: its
    # range costs every other weight precision (what SeqMSE narrows)
    if op == "Gemm":
        w[:, 0] *= 40
    else:
        w[0, :] *= 40
    model = _model(op, k, n, w)
    (layer,) = weight_layers(model)
    # correlated, uneven input channels, 3 samples of 300 rows (MatMul: [1, 300, K])
    mix = rng.normal(size=(k, k)).astype(np.float32)
    shape = (300, k) if op == "Gemm" else (1, 300, k)
    inputs = [(rng.normal(size=shape) @ mix).astype(np.float32) for _ in range(3)]
    for x in inputs:
        x[..., 0] *= 0.01
    spec = WeightQuant(
        fake_quant(w, _spec(layer.channel_axis)), layer.channel_axis, -128, 127, True
    )
    run = LayerRunner(model, layer)

    folded = second_moment_rows(layer, inputs)
    assert folded is not None and folded[0].shape == (k, k)
    ratio, before, after = seqmse.choose_ratio(layer, w, spec, inputs, run)
    f_ratio, f_before, f_after = seqmse.choose_ratio(layer, w, spec, folded, run)

    assert after < before * 0.98  # the grid does find narrower ranges here
    np.testing.assert_array_equal(f_ratio, ratio)
    np.testing.assert_allclose([f_before, f_after], [before, after], rtol=1e-4)


def test_no_folding_when_it_would_not_save_rows() -> None:
    w = np.ones((8, 4), np.float32)
    (layer,) = weight_layers(_model("MatMul", 8, 4, w))
    assert second_moment_rows(layer, [np.ones((1, 5, 8), np.float32)]) is None
    # 3 K rows: a K x K factor (twice, in float64) would hold more than the rows do
    assert second_moment_rows(layer, [np.ones((1, 24, 8), np.float32)]) is None
    assert second_moment_rows(layer, [np.ones((1, 32, 8), np.float32)]) is not None


def _spec(axis: int) -> WeightQuant:
    return WeightQuant(np.zeros(1, np.float32), axis, -128, 127, True)
