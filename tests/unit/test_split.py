"""Cutting a graph into parts (onnx/split.py) and choosing how many (runtime/splitcompile.py):
Q/DQ pairs stay whole, constants go with every part that reads them, the parts run in
sequence equal the whole graph on the CPU EP, and the memory budget decides the count."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from winml_recipes.eps.qnn import PLUGIN, QnnHtp
from winml_recipes.onnx.split import Splitter
from winml_recipes.runtime.sessions import open_bytes_session
from winml_recipes.runtime.splitcompile import plan_split
from winml_recipes.sdk.ep import PreparationCost
from winml_recipes.sdk.errors import PassError

SIDE = 64


def _chain(blocks: int = 6) -> onnx.ModelProto:
    """x -> [Q -> DQ -> MatMul(DQ(w)) -> Q -> DQ -> Relu] x blocks, the block's width growing in
    the middle (so the largest tensor sits in one place), QDQ as onnxruntime writes it."""
    nodes, inits = [], []
    name, width = "x", SIDE
    rng = np.random.default_rng(0)
    for b in range(blocks):
        out_width = SIDE * 4 if b == blocks // 2 else SIDE
        w = rng.integers(0, 255, (width, out_width), dtype=np.uint8)
        inits += [
            numpy_helper.from_array(w, f"w{b}"),
            numpy_helper.from_array(np.array(0.01, np.float32), f"ws{b}"),
            numpy_helper.from_array(np.array(128, np.uint8), f"wz{b}"),
            numpy_helper.from_array(np.array(0.05, np.float32), f"s{b}"),
            numpy_helper.from_array(np.array(32768, np.uint16), f"z{b}"),
        ]
        nodes += [
            helper.make_node("QuantizeLinear", [name, f"s{b}", f"z{b}"], [f"q{b}"]),
            helper.make_node("DequantizeLinear", [f"q{b}", f"s{b}", f"z{b}"], [f"dq{b}"]),
            helper.make_node("DequantizeLinear", [f"w{b}", f"ws{b}", f"wz{b}"], [f"wdq{b}"]),
            helper.make_node("MatMul", [f"dq{b}", f"wdq{b}"], [f"m{b}"]),
            helper.make_node("QuantizeLinear", [f"m{b}", f"s{b}", f"z{b}"], [f"mq{b}"]),
            helper.make_node("DequantizeLinear", [f"mq{b}", f"s{b}", f"z{b}"], [f"mdq{b}"]),
            helper.make_node("Relu", [f"mdq{b}"], [f"r{b}"]),
        ]
        name, width = f"r{b}", out_width
    return _model(nodes, inits, "chain", [SIDE, SIDE], name, [SIDE, width])


def _run_parts(parts, feed: dict) -> dict:
    values = dict(feed)
    for part in parts:
        session = open_bytes_session(part.model.SerializeToString())
        names = [i.name for i in session.get_inputs()]
        outs = [o.name for o in session.get_outputs()]
        values.update(zip(outs, session.run(outs, {n: values[n] for n in names}), strict=True))
    return values


@pytest.mark.parametrize("boundary", ["quantized", "float"])
@pytest.mark.parametrize("parts", [2, 3])
def test_parts_keep_qdq_pairs_and_equal_the_whole_graph(parts, boundary) -> None:
    model = _chain()
    splitter = Splitter(model, boundary)
    cuts = splitter.choose_cuts(parts)
    assert len(cuts) == parts - 1
    made = splitter.parts(cuts)
    producer = {o: n for n in model.graph.node for o in n.output}
    for part in made[1:]:
        for name in part.inputs:  # what crosses is a Q output (or its DQ output): never m{b}
            want = "QuantizeLinear" if boundary == "quantized" else "DequantizeLinear"
            assert producer[name].op_type == want, name
    for part in made:
        onnx.checker.check_model(part.model, full_check=True)
        ops = [n.op_type for n in part.model.graph.node]
        # each part dequantizes its own weights (constants duplicated, not passed)
        assert ops.count("MatMul") == sum(
            1
            for n in part.model.graph.node
            if n.op_type == "DequantizeLinear" and n.input[0].startswith("w")
        )
    feed = {"x": np.random.default_rng(1).normal(0, 1, (SIDE, SIDE)).astype(np.float32)}
    whole = open_bytes_session(model.SerializeToString())
    want = whole.run(None, feed)[0]
    got = _run_parts(made, feed)[model.graph.output[0].name]
    assert np.abs(want).max() > 0
    np.testing.assert_array_equal(got, want)  # re-quantizing a DQ output is exact


def test_no_cut_between_an_op_and_its_output_quantizer() -> None:
    splitter = Splitter(_chain())
    for k in range(1, len(splitter.core)):
        crossing = splitter.crossing(k)
        if any(x.startswith("m") and not x.startswith("mq") for x in crossing):
            assert not splitter.valid(k)  # MatMul's float output before its Q


@dataclass(frozen=True)
class _Steep(QnnHtp):
    """The QNN plugin with a cost line made for this test: 1 GB per MB of weights, nothing
    else (the real fit's base alone is 1.2 GB, more than these graphs' weights)."""

    def preparation_cost(self) -> PreparationCost:
        return PreparationCost(
            base_mb=0, mb_per_million=0.0, weight_factor=1024.0, fitted_on="test"
        )


def test_the_budget_decides_how_many_parts(tmp_path: Path) -> None:
    from dataclasses import replace

    path = tmp_path / "chain.onnx"
    onnx.save(_chain(blocks=8), path)
    ep = _Steep(**{f: getattr(PLUGIN, f) for f in PLUGIN.__dataclass_fields__})
    ep = replace(ep, key="qnn-htp-steep")
    whole = plan_split(path, ep, {}, None, budget_mb=1e9)
    assert whole.count == 0 and whole.whole_mb is not None
    # a budget under the whole graph's estimate: split until every part fits (cut at equal
    # shares of weights and activations, so not always the fewest possible)
    budget = 0.6 * whole.whole_mb
    tight = plan_split(path, ep, {}, None, budget_mb=budget)
    assert tight.count >= 2 and max(tight.estimates_mb) <= budget
    assert "exceeds the memory budget" in tight.why
    tighter = plan_split(path, ep, {}, None, budget_mb=0.3 * whole.whole_mb)
    assert tighter.count > tight.count and max(tighter.estimates_mb) <= 0.3 * whole.whole_mb
    asked = plan_split(path, ep, {}, 3, budget_mb=1e9)
    assert asked.count == 3 and asked.why == "parts: 3 asked"
    with pytest.raises(PassError, match="no split into at most"):
        plan_split(path, ep, {}, None, budget_mb=0.01 * whole.whole_mb)  # one block exceeds it


def test_more_parts_than_cut_points_says_so_not_memory(tmp_path: Path) -> None:
    """parts: 16 on a graph of 12 core nodes: the error counts the places a cut may take and
    names the largest parts value that works (it blamed the memory budget before)."""
    path = tmp_path / "chain.onnx"
    onnx.save(_chain(blocks=2), path)
    with pytest.raises(PassError) as caught:
        plan_split(path, PLUGIN, {}, 16, budget_mb=1e9)
    message = str(caught.value)
    assert "memory" not in message and "budget" not in message, message
    found = re.search(r"this graph has (\d+) \(.+\); the largest parts value that works here "
                      r"is (\d+)$", message)  # fmt: skip
    assert found, message
    points, largest = map(int, found.groups())
    # in each block a cut may follow the input's Q and the MatMul's Q: 2 per block
    assert points == 4 and largest == 5
    assert plan_split(path, PLUGIN, {}, largest, budget_mb=1e9).count == largest
    with pytest.raises(PassError, match=f"parts: {largest + 1} needs {largest} cut points"):
        plan_split(path, PLUGIN, {}, largest + 1, budget_mb=1e9)
    # chosen by the budget: the graph runs out of cut points before MOST_PARTS, and says so
    from dataclasses import replace

    ep = _Steep(**{f: getattr(PLUGIN, f) for f in PLUGIN.__dataclass_fields__})
    ep = replace(ep, key="qnn-htp-steep")
    whole = plan_split(path, ep, {}, None, budget_mb=1e9).whole_mb
    with pytest.raises(PassError, match=r"this graph has 4 cut points .+, so at most 5 parts, "
                       r"and no split brings every part's preparation estimate under the "
                       r"memory budget \d+ MB \(\d+ MB at 5 parts\)"):  # fmt: skip
        plan_split(path, ep, {}, None, budget_mb=0.01 * whole)


def test_cut_after_names_the_boundaries_and_refuses_a_float_one(tmp_path: Path) -> None:
    path = tmp_path / "chain.onnx"
    onnx.save(_chain(), path)
    plan = plan_split(path, PLUGIN, {}, None, 1e9, cut_after=("mq1", "mq3"))
    assert plan.count == 3 and plan.why == "cut after 2 tensors asked"
    assert [p.inputs for p in plan.parts[1:]] == [("mq1",), ("mq3",)]
    with pytest.raises(PassError, match="a cut after 'm2' would carry m2"):
        plan_split(path, PLUGIN, {}, None, 1e9, cut_after=("m2",))  # MatMul before its Q
    with pytest.raises(PassError, match="no node of the graph's core makes a tensor named 'nope'"):
        plan_split(path, PLUGIN, {}, None, 1e9, cut_after=("nope",))


def test_a_dequantized_tensor_read_on_both_sides_crosses_once_quantized() -> None:
    """x -> Q -> DQ read by Relu (part 0) and by Add (part 1, a residual): part 0 gives only
    the quantized tensors; part 1 dequantizes its own copy. (A part that also gave the DQ
    output made the stitched sam3-mid model abort in onnxruntime.)"""
    init = [
        numpy_helper.from_array(np.array(0.05, np.float32), "s"),
        numpy_helper.from_array(np.array(32768, np.uint16), "z"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q0"]),
        helper.make_node("DequantizeLinear", ["q0", "s", "z"], ["d0"]),
        helper.make_node("Relu", ["d0"], ["r"]),
        helper.make_node("QuantizeLinear", ["r", "s", "z"], ["q1"]),
        helper.make_node("DequantizeLinear", ["q1", "s", "z"], ["d1"]),
        helper.make_node("Add", ["d1", "d0"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "residual",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4]),
            helper.make_tensor_value_info("d0", TensorProto.FLOAT, [4, 4]),
        ],
        init,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    splitter = Splitter(model)
    cut = splitter.cuts_after(["q1"])
    first, second = splitter.parts(cut)
    assert set(first.outputs) == {"q0", "q1", "d0"}  # d0: a graph output, given once
    assert set(second.inputs) == {"q0", "q1"} and second.outputs == ("y",)
    feed = {"x": np.random.default_rng(2).normal(0, 1, (4, 4)).astype(np.float32)}
    whole = open_bytes_session(model.SerializeToString()).run(None, feed)
    want = dict(zip(["y", "d0"], whole, strict=True))
    got = _run_parts([first, second], feed)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def _transformer(blocks: int = 4, hidden: int = 8, mlp: int = 32) -> onnx.ModelProto:
    """A pre-norm transformer's QDQ graph (every activation through Q -> DQ, as onnxruntime
    writes it): per block x + Attn(LN(x)), then h + MLP(LN(h)), the MLP's weights wide so
    equal shares of cost land inside blocks, nearer the attention/MLP residual than the
    block boundary."""
    rng = np.random.default_rng(3)
    inits = [
        numpy_helper.from_array(np.array(0.05, np.float32), "s"),
        numpy_helper.from_array(np.array(32768, np.uint16), "z"),
        numpy_helper.from_array(np.ones(hidden, np.float32), "g"),
        numpy_helper.from_array(np.zeros(hidden, np.float32), "b"),
    ]
    nodes: list[onnx.NodeProto] = []

    def op(kind: str, ins: list[str], out: str, **attrs) -> str:
        nodes.append(helper.make_node(kind, ins, [out], **attrs))
        nodes.append(helper.make_node("QuantizeLinear", [out, "s", "z"], [f"{out}_q"]))
        nodes.append(helper.make_node("DequantizeLinear", [f"{out}_q", "s", "z"], [f"{out}_dq"]))
        return f"{out}_dq"

    def weight(name: str, shape: tuple[int, int]) -> str:
        inits.append(numpy_helper.from_array(rng.normal(0, 0.3, shape).astype(np.float32), name))
        return name

    x = op("Identity", ["x"], "x0")
    for i in range(blocks):
        n1 = op("LayerNormalization", [x, "g", "b"], f"ln1_{i}", axis=-1)
        scores = op("MatMul", [n1, weight(f"wa{i}", (hidden, SIDE))], f"scores{i}")
        probs = op("Softmax", [scores], f"probs{i}", axis=-1)
        attn = op("MatMul", [probs, weight(f"wb{i}", (SIDE, hidden))], f"attn{i}")
        h = op("Add", [x, attn], f"res1_{i}")
        n2 = op("LayerNormalization", [h, "g", "b"], f"ln2_{i}", axis=-1)
        up = op("MatMul", [n2, weight(f"wc{i}", (hidden, mlp))], f"up{i}")
        act = op("Relu", [up], f"act{i}")
        down = op("MatMul", [act, weight(f"wd{i}", (mlp, hidden))], f"down{i}")
        x = op("Add", [h, down], f"res2_{i}")
    return _model(nodes, inits, "transformer", [SIDE, hidden], x, [SIDE, hidden])


def test_cuts_fall_between_transformer_blocks() -> None:
    """The residual stream carries one tensor between blocks and between a block's halves;
    the cut choice takes the places an attention follows (the block boundaries)."""
    splitter = Splitter(_transformer())
    blocks = splitter.block_boundaries()
    assert [splitter.crossing(k) for k in blocks] == [
        ["x0_q"],
        ["res2_0_q"],
        ["res2_1_q"],
        ["res2_2_q"],
    ]
    residual = splitter.residual_cuts()
    assert (
        sorted(set(residual) - set(blocks))
        == [k for k in residual if splitter.crossing(k)[0].startswith("res1_")]
        and len(residual) == 8
    )
    for parts in (2, 3, 4):
        cuts = splitter.choose_cuts(parts)
        assert set(cuts) <= set(blocks), [splitter.crossing(k) for k in cuts]
    # the equal-share targets sit nearer a mid-block residual: without the preference the
    # choice would differ (so the assertion above can fail)
    prefix = splitter.cost_prefix()
    targets = [
        min(range(1, len(splitter.core)), key=lambda k: abs(prefix[k] - prefix[-1] * j / 3))
        for j in (1, 2)
    ]
    assert any(min(residual, key=lambda k: abs(k - t)) not in blocks for t in targets)
    # and the parts still equal the whole graph on the CPU EP
    model = _transformer()
    made = Splitter(model).parts(Splitter(model).choose_cuts(3))
    feed = {"x": np.random.default_rng(4).normal(0, 1, (SIDE, 8)).astype(np.float32)}
    want = open_bytes_session(model.SerializeToString()).run(None, feed)[0]
    got = _run_parts(made, feed)[model.graph.output[0].name]
    np.testing.assert_array_equal(got, want)


@dataclass(frozen=True)
class _Ceiling(QnnHtp):
    """The QNN plugin with a test line (1 GB per MB of weights) and a ceiling on what it
    prepares at once, far under the budget: the ceiling decides the split."""

    def preparation_cost(self) -> PreparationCost:
        return PreparationCost(
            base_mb=0, mb_per_million=0.0, weight_factor=1024.0, fitted_on="test",
            largest_mb=2.2 * 1024 * _block_weights_mb(),
        )  # fmt: skip


def _block_weights_mb() -> float:
    w = 8 * SIDE * 2 + 8 * 32 * 2  # one block of _transformer(): wa, wb, wc, wd (float32)
    return w * 4 / 2**20


def test_the_eps_ceiling_splits_a_graph_the_budget_would_take_whole(tmp_path: Path) -> None:
    """A 6-block transformer whose whole estimate fits a huge budget but not the EP's
    largest_mb (2.2 blocks' worth): split into parts of at most 2 blocks, cut between blocks."""
    from dataclasses import replace

    path = tmp_path / "transformer.onnx"
    onnx.save(_transformer(blocks=6), path)
    ep = _Ceiling(**{f: getattr(PLUGIN, f) for f in PLUGIN.__dataclass_fields__})
    ep = replace(ep, key="qnn-htp-ceiling")
    ceiling = ep.preparation_cost().largest_mb
    plan = plan_split(path, ep, {}, None, budget_mb=1e9)
    assert plan.whole_mb is not None and plan.whole_mb > ceiling
    assert plan.count == 3 and max(plan.estimates_mb) <= ceiling
    assert "the largest graph qnn-htp-ceiling prepares at once" in plan.why
    assert [p.inputs for p in plan.parts[1:]] == [("res2_1_q",), ("res2_3_q",)]
    # without the ceiling the budget alone decides: one part
    steep = _Steep(**{f: getattr(PLUGIN, f) for f in PLUGIN.__dataclass_fields__})
    assert plan_split(path, replace(steep, key="qnn-htp-steep3"), {}, None, 1e9).count == 0


def _model(nodes, inits, name: str, x_shape: list, out: str, out_shape: list) -> onnx.ModelProto:
    """One-input float graph `x` -> `out`, opset 21."""
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, out_shape)],
        inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
