"""Attention computed in query chunks (QNN HTP's `chunk_attention_queries`): the same numbers
in float on the CPU EP, for the patterns exporters write, and left alone where a chunk would
not be the same computation."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from winml_recipes.eps.qnn import PLUGIN as QNN
from winml_recipes.eps.qnn.rules import RULES, float_rewrites, rewrite
from winml_recipes.graph.pipeline import prepare

F = TensorProto.FLOAT
RULE = "chunk_attention_queries"
B, H, N, D = 1, 2, 10, 4  # scores [1, 2, 10, 10]: 200 elements, 20 per query row


def _attention(scale: str = "qk", mask: list[int] | None = None, extra_reader: bool = False):
    """Q, K, V [B,H,N,D] -> attention [B,H,N,D]. scale "qk": dynamo's SDPA form (Q and K^T
    each times sqrt(scale) before the MatMul); "div": eager's (scores / sqrt(D)). `mask`:
    the shape of an additive mask input."""
    s = np.float32(D**-0.25)
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2])]
    inits = [numpy_helper.from_array(np.array(s, np.float32), "s"),
             numpy_helper.from_array(np.array(np.sqrt(D), np.float32), "d")]  # fmt: skip
    if scale == "qk":
        nodes += [helper.make_node("Mul", ["q", "s"], ["qs"]),
                  helper.make_node("Mul", ["kt", "s"], ["ks"]),
                  helper.make_node("MatMul", ["qs", "ks"], ["scores"])]  # fmt: skip
        last = "scores"
    else:
        nodes += [helper.make_node("MatMul", ["q", "kt"], ["raw"]),
                  helper.make_node("Div", ["raw", "d"], ["scores"])]  # fmt: skip
        last = "scores"
    inputs = [helper.make_tensor_value_info(n, F, [B, H, N, D]) for n in "qkv"]
    if mask is not None:
        nodes.append(helper.make_node("Add", ["mask", last], ["masked"]))
        inputs.append(helper.make_tensor_value_info("mask", F, mask))
        last = "masked"
    nodes += [helper.make_node("Softmax", [last], ["probs"], axis=-1),
              helper.make_node("MatMul", ["probs", "v"], ["attn"]),
              helper.make_node("Relu", ["attn"], ["out"])]  # fmt: skip
    outputs = [helper.make_tensor_value_info("out", F, [B, H, N, D])]
    if extra_reader:
        outputs.append(helper.make_tensor_value_info("probs", F, [B, H, N, N]))
    graph = helper.make_graph(nodes, "attention", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    return onnx.shape_inference.infer_shapes(model)


def _feed(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        i.name: rng.normal(0, 2, [d.dim_value for d in i.type.tensor_type.shape.dim]).astype(
            np.float32
        )
        for i in model.graph.input
    }


def _run(model: onnx.ModelProto, feed: dict) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString()).run(None, feed)


def _chunked(model: onnx.ModelProto, bound: int):
    return prepare(model, ["ep"], ep_rules=_rules(bound))


def _rules(bound: int):
    from winml_recipes.sdk.ep import GraphRules

    return GraphRules("qnn-htp", RULES, lambda m, log: rewrite(m, float_rewrites(bound), log))


@pytest.mark.parametrize(
    ("scale", "mask", "bound", "chunks"),
    [
        ("qk", None, 100, 2),  # dynamo's SDPA form: 5 rows of 20 scores fit, 2 chunks
        ("qk", None, 80, 3),  # 4 rows fit: 10 rows as 4 + 3 + 3
        ("div", [1, 1, N, N], 40, 5),  # a per-query mask is split with the queries
        ("div", [1, 1, 1, N], 60, 4),  # a mask broadcast over the queries is shared
    ],
    ids=["sdpa", "sdpa-uneven", "mask-split", "mask-shared"],
)
def test_chunked_attention_is_exact_in_float(
    scale: str, mask: list[int] | None, bound: int, chunks: int
) -> None:
    model = _attention(scale, mask)
    feed = _feed(model)
    before = _run(model, feed)
    done = _chunked(model, bound)
    after = _run(done.model, feed)
    # each row is computed on its own: only the BLAS blocking may round differently
    np.testing.assert_allclose(after[0], before[0], rtol=1e-6, atol=1e-6)
    assert done.log.count(RULE) == 1
    softmaxes = [n for n in done.model.graph.node if n.op_type == "Softmax"]
    assert len(softmaxes) == chunks
    inferred = onnx.shape_inference.infer_shapes(done.model).graph.value_info
    sizes = {v.name: np.prod([d.dim_value for d in v.type.tensor_type.shape.dim]) for v in inferred}
    assert all(sizes[s.input[0]] <= bound for s in softmaxes)
    assert [o.name for o in done.model.graph.output] == ["out"]
    names = [n.name for n in done.model.graph.node if n.name]
    assert len(names) == len(set(names))  # onnxruntime refuses two nodes of one name


def test_attention_within_the_bound_is_left_alone() -> None:
    model = _attention()
    done = _chunked(model, H * N * N)
    assert RULE not in done.log.nodes
    assert [n.op_type for n in done.model.graph.node].count("Softmax") == 1


def test_probabilities_read_elsewhere_are_left_alone() -> None:
    model = _attention(extra_reader=True)
    done = _chunked(model, 100)
    assert RULE not in done.log.nodes
    kept = [k for k in done.log.kept if k["rule"] == RULE]
    assert kept and "not read by one MatMul" in kept[0]["why"], done.log.kept


def test_qnn_plugin_bounds_its_graphs() -> None:
    """The QNN plugin's rule set chunks scores above its own bound (and not below)."""
    bound = QNN.max_tensor_elements
    assert bound is not None and bound > 0
    assert RULE in QNN.graph_rules().rules
    model = _attention()
    done = prepare(model, ["ep"], ep_rules=QNN.graph_rules())
    assert RULE not in done.log.nodes  # 288 scores: far below any real bound


def test_chunks_are_multiples_of_64_rows_where_they_hold_that_many() -> None:
    """At 1008 px (16 heads x 5184 queries): 7 even chunks of 740-741 rows failed to
    finalize on HTP (QNN_COMMON_ERROR_MEM_ALLOC); 6 x 768 + 576 prepared."""
    from winml_recipes.eps.qnn.rules.attention import _sizes

    assert _sizes(5184, 16 * 5184 * 5184, 1 << 26) == [768] * 6 + [576]
    assert _sizes(10, 200, 80) == [4, 3, 3]  # fewer than 64 rows fit: as even as possible
    assert "over the bound" in _sizes(10, 200, 10)
