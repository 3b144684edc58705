"""The prepare rewrites (winml_recipes.graph): each leaves no op HTP refuses, and each is exact.

The rewritten model is run against the model it came from on the CPU EP (and against
numpy or torch where the graph's meaning is simple), never against itself.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests import prepare_models
from winml_recipes.graph.exactness import first_difference
from winml_recipes.graph.fold import RULE_FOLD, RULE_IF
from winml_recipes.graph.gathernd import RULE as RULE_GATHERND
from winml_recipes.graph.pipeline import prepare
from winml_recipes.graph.recurrent import RULE_GRU, RULE_LSTM
from winml_recipes.runtime.sessions import run_model


def _ops(model: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in model.graph.node)


def _static(path: Path, shapes: dict[str, list[int]]) -> onnx.ModelProto:
    """The model with static input shapes (what fix_shapes leaves), outputs re-derived."""
    model = onnx.load(str(path))
    for vi in model.graph.input:
        if vi.name in shapes:
            dims = vi.type.tensor_type.shape.dim
            for d, value in zip(dims, shapes[vi.name], strict=True):
                d.dim_value = value
    for out in model.graph.output:
        out.type.tensor_type.ClearField("shape")
    return onnx.shape_inference.infer_shapes(model)


def _run(model: onnx.ModelProto, tmp: Path, name: str, feeds: list[dict]) -> list[dict]:
    path = tmp / f"{name}.onnx"
    onnx.save(model, str(path))
    return run_model(path, feeds)


def _rules(done) -> dict[str, list[str]]:
    return {r["rule"]: r["nodes"] for r in done.log.to_metrics()}


def test_detector_anchor_grid_folds_to_a_constant(tmp_path: Path) -> None:
    source = _static(prepare_models.detector(tmp_path / "det.onnx"), {"images": [1, 3, 64, 48]})
    done = prepare(source)
    ops = _ops(done.model)
    assert not {"Shape", "Range", "ConstantOfShape", "Expand", "Cast", "Gather"} & set(ops), ops
    assert len(done.model.graph.node) < len(source.graph.node)
    assert done.folded["Range"] == 2 and done.folded["Shape"] == 2
    assert "grid/range_x" in _rules(done)[RULE_FOLD]
    images = np.random.default_rng(3).uniform(-1, 1, (1, 3, 64, 48)).astype(np.float32)
    before = _run(source, tmp_path, "before", [{"images": images}])
    after = _run(done.model, tmp_path, "after", [{"images": images}])
    assert first_difference(before, after) is None
    # The folded grid is the grid: boxes minus the head's offsets are the numpy anchors.
    offsets = after[0]["boxes"] - prepare_models.detector_reference(images, tmp_path)
    assert offsets.min() >= 0 and offsets.max() <= 16


def test_folding_stops_at_the_size_limit(tmp_path: Path) -> None:
    """A ConstantOfShape the size of an activation keeps running; a small one is folded."""
    n = helper.make_node
    nodes = [
        n("Shape", ["x"], ["s"], name="shape"),
        n("ConstantOfShape", ["s"], ["ones"], name="ones",
          value=numpy_helper.from_array(np.array([1.0], np.float32))),
        n("Add", ["x", "ones"], ["y"], name="add"),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 32, 32])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    small = prepare(model, max_elements=1 << 16)
    assert _ops(small.model) == {"Add": 1}
    large = prepare(model, max_elements=1 << 15)  # 65,536 elements > 32,768
    assert _ops(large.model)["ConstantOfShape"] == 1


@pytest.mark.parametrize(
    ("batch_dims", "contiguous", "replacement"),
    [(0, False, "Gather"), (0, True, "Slice"), (1, False, "Gather")],
)
def test_gathernd_with_constant_indices(
    tmp_path: Path, batch_dims: int, contiguous: bool, replacement: str
) -> None:
    path = prepare_models.gathernd(tmp_path / "g.onnx", batch_dims, contiguous)
    source = onnx.load(str(path))
    done = prepare(source)
    ops = _ops(done.model)
    assert "GatherND" not in ops and ops[replacement] == 1, ops
    assert _rules(done)[RULE_GATHERND] == ["pick"]
    x = np.random.default_rng(0).standard_normal((2, 5, 4)).astype(np.float32)
    before = _run(source, tmp_path, "before", [{"x": x}])
    after = _run(done.model, tmp_path, "after", [{"x": x}])
    assert np.array_equal(before[0]["y"], after[0]["y"])
    indices = numpy_helper.to_array(next(t for t in source.graph.initializer if t.name == "idx"))
    r = np.maximum(x, 0)
    if batch_dims == 0:
        want = np.stack([r[i, j] for i, j in indices]) * 2
    else:
        want = np.stack([np.stack([r[b, int(j)] for (j,) in indices[b]]) for b in range(2)]) * 2
    assert np.array_equal(after[0]["y"], want)


def test_out_of_range_gathernd_indices_are_left_alone(tmp_path: Path) -> None:
    model = onnx.load(str(prepare_models.gathernd(tmp_path / "g.onnx")))
    idx = next(t for t in model.graph.initializer if t.name == "idx")
    idx.CopyFrom(numpy_helper.from_array(np.array([[0, 7]], np.int64), "idx"))
    done = prepare(model, stages=("gathernd",))
    assert _ops(done.model)["GatherND"] == 1


def test_if_with_a_constant_condition_is_inlined(tmp_path: Path) -> None:
    source = _static(prepare_models.constant_if(tmp_path / "if.onnx"), {"x": [2, 5]})
    done = prepare(source)
    assert "If" not in _ops(done.model) and "Sub" not in _ops(done.model)
    assert _rules(done)[RULE_IF] == ["branch"]
    x = np.random.default_rng(0).standard_normal((2, 5)).astype(np.float32)
    after = _run(done.model, tmp_path, "after", [{"x": x}])
    assert np.array_equal(after[0]["y"], np.maximum(x * 2, 0))
    narrow = _static(prepare_models.constant_if(tmp_path / "if2.onnx"), {"x": [2, 3]})
    taken = prepare(narrow)
    assert "Mul" not in _ops(taken.model)
    x3 = x[:, :3].copy()
    assert np.array_equal(
        _run(taken.model, tmp_path, "n", [{"x": x3}])[0]["y"], np.maximum(x3 - 1, 0)
    )


CASES = {
    # kind, bidirectional, options
    "lstm": ("LSTM", False, {}),
    "lstm-bidirectional-2-layers-states-seq-first": (
        "LSTM", True, {"layers": 2, "states": True, "batch_first": False, "opset": 11}
    ),
    "gru-bidirectional": ("GRU", True, {"opset": 14}),
    "gru-states": ("GRU", False, {"states": True, "opset": 12}),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_recurrent_unrolled_exactly(tmp_path: Path, case: str) -> None:
    import torch

    kind, bidirectional, options = CASES[case]
    path = prepare_models.recurrent(tmp_path / "rnn.onnx", kind, bidirectional, **options)
    source = onnx.load(str(path))
    done = prepare(source)
    ops = _ops(done.model)
    assert kind not in ops and ops["MatMul"] > 0 and ops["Sigmoid"] > 0, ops
    rule = RULE_LSTM if kind == "LSTM" else RULE_GRU
    assert len(_rules(done)[rule]) == options.get("layers", 1)
    rng = np.random.default_rng(1)
    feeds = []
    for _ in range(2):
        feed = {}
        for vi in source.graph.input:
            shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
            feed[vi.name] = rng.standard_normal(shape).astype(np.float32)
        feeds.append(feed)
    before = _run(source, tmp_path, "before", feeds)
    after = _run(done.model, tmp_path, "after", feeds)
    for b, a in zip(before, after, strict=True):
        for name in ("y", "h"):
            assert a[name].shape == b[name].shape
            assert np.abs(a[name] - b[name]).max() <= 1e-5, (name, np.abs(a[name] - b[name]).max())
    # And against torch itself, through the same export's weights (not the ONNX kernel).
    torch_net = _torch_twin(kind, bidirectional, options)
    with torch.no_grad():
        got = torch_net(*(torch.from_numpy(feeds[0][vi.name]) for vi in source.graph.input))
    assert np.abs(got.numpy() - after[0]["y"]).max() <= 1e-5


def _torch_twin(kind: str, bidirectional: bool, options: dict):
    """The module prepare_models.recurrent exported (same seed, so the same weights)."""
    import torch

    torch.manual_seed(0)
    rnn = getattr(torch.nn, kind)(
        10, 16, num_layers=options.get("layers", 1), batch_first=options.get("batch_first", True),
        bidirectional=bidirectional,
    )  # fmt: skip
    fc = torch.nn.Linear(32 if bidirectional else 16, 4)

    def forward(x, *state):
        if kind == "LSTM":
            y, _ = rnn(x, (state[0], state[1])) if state else rnn(x)
        else:
            y, _ = rnn(x, state[0]) if state else rnn(x)
        return fc(y)

    rnn.eval()
    return forward


def test_recurrent_nodes_it_cannot_unroll_are_kept_with_the_reason(tmp_path: Path) -> None:
    model = onnx.load(str(prepare_models.recurrent(tmp_path / "r.onnx", "LSTM", False)))
    lstm = next(n for n in model.graph.node if n.op_type == "LSTM")
    lstm.attribute.append(helper.make_attribute("clip", 3.0))
    done = prepare(model)
    assert _ops(done.model)["LSTM"] == 1
    assert done.log.kept == [{"rule": RULE_LSTM, "node": lstm.name, "why": "clip is set"}]


def test_a_model_over_the_unroll_budget_is_refused_naming_the_node_and_the_next_step(
    tmp_path: Path,
) -> None:
    """Two stacked LSTM layers each just over half the budget (MAX_MODEL_STEPS, measured on
    HTP): unrolled, such a model kept resemblyzer's build on the emulated HTP past 30
    minutes; kept as LSTM nodes, HTP cannot finalize it. prepare refuses it in one line: the
    longest node, the total, the budget, and windows that fit."""
    from winml_recipes.graph.recurrent import MAX_MODEL_STEPS, UnrollBudgetError

    seq = MAX_MODEL_STEPS // 2 + 4
    path = prepare_models.recurrent(tmp_path / "r.onnx", "LSTM", False, seq=seq, layers=2)
    model = onnx.load(str(path))
    lstms = [n for n in model.graph.node if n.op_type == "LSTM"]
    assert len(lstms) == 2
    with pytest.raises(UnrollBudgetError) as err:
        prepare(model)
    message = str(err.value)
    assert "\n" not in message
    assert f"recurrent node '{lstms[0].name}' (LSTM, {seq} steps x 1 direction(s))" in message
    assert (
        f"unroll to {2 * seq} steps x directions, over the NPU's budget of {MAX_MODEL_STEPS}"
        in message
    )
    window = seq * MAX_MODEL_STEPS // (2 * seq)
    assert f"next step: export the model over windows of at most {window} steps" in message
    # one such layer fits the budget: unrolled (exact: the cases above)
    one = onnx.load(str(prepare_models.recurrent(tmp_path / "one.onnx", "LSTM", False, seq=seq)))
    assert _ops(prepare(one).model)["LSTM"] == 0


def test_first_difference_names_the_output_and_the_size() -> None:
    a = [{"y": np.array([1.0, 2.0], np.float32), "i": np.array([1, 2])}]
    assert (
        first_difference(a, [{"y": np.array([1.0, 2.00001], np.float32), "i": a[0]["i"]}]) is None
    )
    off = first_difference(a, [{"y": np.array([1.0, 2.001], np.float32), "i": a[0]["i"]}])
    assert off is not None and off.startswith("output 'y' differs by up to 0.001")
    ints = first_difference(a, [{"y": a[0]["y"], "i": np.array([1, 3])}])
    assert ints == "output 'i' changed on sample 0 (values of type int64)"


def _hand_rnn(kind: str, **attrs) -> onnx.ModelProto:
    """One ONNX LSTM/GRU node with random weights (forms torch does not export: peepholes,
    GRU without linear_before_reset, layout 1)."""
    rng = np.random.default_rng(7)
    gates, hidden, size, seq = (4 if kind == "LSTM" else 3), 5, 3, 6
    dirs = 2 if attrs.get("direction") == "bidirectional" else 1
    layout = attrs.get("layout", 0)
    x_shape = [seq, 2, size] if layout == 0 else [2, seq, size]
    f32 = np.float32
    inits = [
        numpy_helper.from_array(rng.standard_normal((dirs, gates * hidden, s)).astype(f32), name)
        for name, s in (("W", size), ("R", hidden))
    ]
    bias = rng.standard_normal((dirs, 2 * gates * hidden)).astype(f32)
    inits.append(numpy_helper.from_array(bias, "B"))
    inputs = ["x", "W", "R", "B", ""]
    if kind == "LSTM":
        p = rng.standard_normal((dirs, 3 * hidden)).astype(np.float32)
        inits.append(numpy_helper.from_array(p, "P"))
        inputs += ["", "", "P"]
    outs = ["Y", "Y_h"] + (["Y_c"] if kind == "LSTM" else [])
    node = helper.make_node(kind, inputs, outs, name="cell", hidden_size=hidden, **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=10)
    return onnx.shape_inference.infer_shapes(model)


@pytest.mark.parametrize(
    ("kind", "attrs"),
    [
        ("GRU", {"linear_before_reset": 0, "direction": "bidirectional"}),
        ("GRU", {"linear_before_reset": 0, "direction": "reverse"}),
        ("LSTM", {"direction": "bidirectional"}),  # with peepholes
        ("LSTM", {"activations": ["Sigmoid", "Relu", "Tanh"]}),
    ],
)
def test_hand_written_recurrent_forms(tmp_path: Path, kind: str, attrs: dict) -> None:
    source = _hand_rnn(kind, **attrs)
    done = prepare(source)
    assert kind not in _ops(done.model)
    shape = [d.dim_value for d in source.graph.input[0].type.tensor_type.shape.dim]
    feeds = [{"x": np.random.default_rng(2).standard_normal(shape).astype(np.float32)}]
    before = _run(source, tmp_path, "before", feeds)
    after = _run(done.model, tmp_path, "after", feeds)
    assert first_difference(before, after) is None
    assert {k: v.shape for k, v in after[0].items()} == {k: v.shape for k, v in before[0].items()}
