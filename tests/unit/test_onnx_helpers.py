"""Tests for winml_recipes.onnx: quant detection, digest/fingerprint, stamp, inputs, metrics,
runtime. Models are built here with onnx.helper and quantized with onnxruntime.quantization."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from winml_recipes.onnx.digest import graph_digest, graph_fingerprint
from winml_recipes.onnx.inputs import make_inputs, specs_from_model
from winml_recipes.onnx.metrics import SQNR_CAP_DB, compare_outputs, compare_runs
from winml_recipes.onnx.quant import detect_quantization
from winml_recipes.onnx.stamp import STAMP_KEY, is_normalized, read_stamp, write_stamp
from winml_recipes.runtime.sessions import run_model, session_options
from winml_recipes.sdk.contract import TensorSpec
from winml_recipes.sdk.errors import CatalogError, ModelFileError

# onnx 1.23 writes IR 14 by default; onnxruntime 1.31 reads up to IR 13.
IR_VERSION = 10
MS = "com.microsoft"


def _model(nodes, inputs, outputs, inits=(), opset=17, **kw) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION, **kw)


def _t(name: str, array: np.ndarray) -> TensorProto:
    return numpy_helper.from_array(array, name)


def _vi(name: str, elem: int, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def float_model(seed: int = 0) -> onnx.ModelProto:
    """x[N,8,4,4] -> Conv -> Relu -> Reshape -> MatMul -> y[N,6]."""
    rng = np.random.default_rng(seed)
    inits = [
        _t("w", rng.standard_normal((8, 8, 3, 3)).astype(np.float32)),
        _t("b", rng.standard_normal(8).astype(np.float32)),
        _t("m", rng.standard_normal((128, 6)).astype(np.float32)),
        _t("shp", np.array([0, -1], dtype=np.int64)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Reshape", ["r", "shp"], ["f"], name="flat"),
        helper.make_node("MatMul", ["f", "m"], ["y"], name="mm"),
    ]
    return _model(
        nodes,
        [_vi("x", TensorProto.FLOAT, ["N", 8, 4, 4])],
        [_vi("y", TensorProto.FLOAT, ["N", 6])],
        inits,
    )


class _Reader:
    """CalibrationDataReader over a few random batches."""

    def __init__(self) -> None:
        rng = np.random.default_rng(1)
        batches = [{"x": rng.standard_normal((1, 8, 4, 4)).astype(np.float32)} for _ in range(4)]
        self._it = iter(batches)

    def get_next(self):
        return next(self._it, None)

    def __iter__(self):
        return self

    def __next__(self):
        item = self.get_next()
        if item is None:
            raise StopIteration
        return item


@pytest.fixture(scope="module")
def qdir(tmp_path_factory) -> Path:
    """Float model and its ORT-quantized variants, built once."""
    from onnxruntime.quantization import (
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    d = tmp_path_factory.mktemp("quant")
    onnx.save(float_model(), d / "float.onnx")
    src = str(d / "float.onnx")
    quantize_dynamic(src, str(d / "dynamic.onnx"))
    quantize_static(
        src,
        str(d / "qdq_u8.onnx"),
        _Reader(),
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QUInt8,
    )
    quantize_static(
        src,
        str(d / "qdq_s8_pc.onnx"),
        _Reader(),
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        per_channel=True,
    )
    quantize_static(
        src,
        str(d / "qoperator.onnx"),
        _Reader(),
        quant_format=QuantFormat.QOperator,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
    )
    return d


# ---------------------------------------------------------------- quantization detection


def test_float_model_is_not_quantized():
    q = detect_quantization(float_model())
    assert not q.quantized
    assert q.describe() == "not quantized"
    assert q.to_dict() == {
        "quantized": False,
        "formats": [],
        "op_counts": {},
        "activation_dtypes": [],
        "weight_dtypes": [],
        "bias_dtypes": [],
        "weight_granularity": [],
    }


def test_dynamic_quantization(qdir):
    q = detect_quantization(onnx.load(qdir / "dynamic.onnx"))
    assert q.quantized
    assert q.formats == ("qoperator", "dynamic")
    assert q.counts == {"ConvInteger": 1, "DynamicQuantizeLinear": 2, "MatMulInteger": 1}
    assert q.activation_dtypes == ("uint8",)
    assert q.weight_dtypes == ("int8",)
    assert q.weight_granularity == ("per_tensor",)
    assert q.describe() == (
        "QOperator+dynamic: ConvInteger x1, DynamicQuantizeLinear x2, MatMulInteger x1 "
        "(weights int8 per_tensor, activations uint8)"
    )


def test_static_qdq_u8_per_tensor(qdir):
    q = detect_quantization(onnx.load(qdir / "qdq_u8.onnx"))
    assert q.formats == ("qdq",)
    assert set(q.counts) == {"QuantizeLinear", "DequantizeLinear"}
    assert q.counts["DequantizeLinear"] > q.counts["QuantizeLinear"] >= 2
    assert q.activation_dtypes == ("uint8",)
    assert q.weight_dtypes == ("uint8",)
    assert q.bias_dtypes == ("int32",)
    assert q.weight_granularity == ("per_tensor",)


def test_static_qdq_s8_per_channel(qdir):
    q = detect_quantization(onnx.load(qdir / "qdq_s8_pc.onnx"))
    assert q.formats == ("qdq",)
    assert q.activation_dtypes == ("uint8",)
    assert q.weight_dtypes == ("int8",)
    assert q.weight_granularity == ("per_channel",)


def test_qoperator_boundary_q_dq_do_not_make_it_qdq(qdir):
    model = onnx.load(qdir / "qoperator.onnx")
    q = detect_quantization(model)
    assert q.formats == ("qoperator",)
    assert q.counts["QLinearConv"] == 1
    assert q.counts["QLinearMatMul"] == 1
    assert q.counts["QuantizeLinear"] == 1  # graph input boundary
    assert q.weight_dtypes == ("int8",)
    assert q.activation_dtypes == ("uint8",)
    assert q.bias_dtypes == ("int32",)


def test_detection_needs_no_tensor_data(qdir, tmp_path):
    model = onnx.load(qdir / "qdq_s8_pc.onnx")
    onnx.save(model, tmp_path / "m.onnx", save_as_external_data=True, size_threshold=0)
    lazy = onnx.load(tmp_path / "m.onnx", load_external_data=False)
    assert any(t.data_location == TensorProto.EXTERNAL for t in lazy.graph.initializer)
    assert detect_quantization(lazy) == detect_quantization(onnx.load(qdir / "qdq_s8_pc.onnx"))


def _matmul_nbits_model() -> onnx.ModelProto:
    k, n, block = 32, 8, 16
    inits = [
        _t("wq", np.zeros((n, k // block, block // 2), dtype=np.uint8)),
        _t("ws", np.ones((n * k // block,), dtype=np.float32)),
        _t("table", np.zeros((10, 8), dtype=np.uint8)),
        _t("ts", np.ones((10, 1), dtype=np.float32)),
    ]
    nodes = [
        helper.make_node(
            "MatMulNBits", ["a", "wq", "ws"], ["y"], domain=MS, K=k, N=n, bits=4, block_size=block
        ),
        helper.make_node(
            "GatherBlockQuantized",
            ["table", "ids"],
            ["e"],
            domain=MS,
            bits=8,
            block_size=16,
            quantize_axis=1,
        ),
    ]
    nodes[1].input.append("ts")
    return _model(
        nodes,
        [_vi("a", TensorProto.FLOAT, [1, k]), _vi("ids", TensorProto.INT64, [3])],
        [_vi("y", TensorProto.FLOAT, [1, n]), _vi("e", TensorProto.FLOAT, [3, 8])],
        inits,
    )


def test_weight_only_ops():
    q = detect_quantization(_matmul_nbits_model())
    assert q.formats == ("weight_only",)
    assert q.counts == {"GatherBlockQuantized": 1, "MatMulNBits": 1}
    assert q.weight_dtypes == ("uint4", "uint8")
    assert q.weight_granularity == ("block",)
    assert q.activation_dtypes == ()
    assert q.describe() == (
        "weight-only: GatherBlockQuantized x1, MatMulNBits x1 (weights uint4/uint8 block)"
    )


def test_blocked_int4_dequantize_linear():
    w = helper.make_tensor("w", TensorProto.INT4, [4, 8], np.zeros(32, dtype=np.int8))
    s = _t("s", np.ones((2, 8), dtype=np.float32))
    nodes = [
        helper.make_node("DequantizeLinear", ["w", "s"], ["wf"], axis=0, block_size=2),
        helper.make_node("MatMul", ["x", "wf"], ["y"]),
    ]
    model = _model(
        nodes, [_vi("x", TensorProto.FLOAT, [1, 4])], [_vi("y", TensorProto.FLOAT, [1, 8])], [w, s]
    )
    q = detect_quantization(model)
    assert q.formats == ("qdq",)
    assert q.weight_dtypes == ("int4",)
    assert q.weight_granularity == ("block",)
    assert q.activation_dtypes == ()


def _qdq_pair(prefix: str, domain: str = "", zp_dtype=np.uint8) -> tuple[list, list]:
    inits = [
        _t(f"{prefix}s", np.array(0.1, dtype=np.float32)),
        _t(f"{prefix}z", np.array(0, dtype=zp_dtype)),
    ]
    nodes = [
        helper.make_node(
            "QuantizeLinear",
            [f"{prefix}in", f"{prefix}s", f"{prefix}z"],
            [f"{prefix}q"],
            domain=domain,
        ),
        helper.make_node(
            "DequantizeLinear",
            [f"{prefix}q", f"{prefix}s", f"{prefix}z"],
            [f"{prefix}out"],
            domain=domain,
        ),
    ]
    return nodes, inits


def test_if_subgraph_is_walked():
    then_nodes, then_inits = _qdq_pair("t")
    then_nodes.insert(0, helper.make_node("Identity", ["x"], ["tin"]))
    then_g = helper.make_graph(
        then_nodes, "then", [], [_vi("tout", TensorProto.FLOAT, [2])], then_inits
    )
    else_g = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["eout"])],
        "else",
        [],
        [_vi("eout", TensorProto.FLOAT, [2])],
    )
    node = helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)
    model = _model(
        [node],
        [_vi("c", TensorProto.BOOL, []), _vi("x", TensorProto.FLOAT, [2])],
        [_vi("y", TensorProto.FLOAT, [2])],
    )
    q = detect_quantization(model)
    assert q.formats == ("qdq",)
    assert q.counts == {"DequantizeLinear": 1, "QuantizeLinear": 1}
    assert q.activation_dtypes == ("uint8",)
    digest = graph_digest(model)
    assert digest["node_count"] == 5  # If, then: Identity + Q + DQ, else: Identity
    assert digest["op_histogram"]["QuantizeLinear"] == 1


def test_model_local_function_is_walked():
    body = [
        helper.make_node("QuantizeLinear", ["fx", "fs", "fz"], ["fq"]),
        helper.make_node("DequantizeLinear", ["fq", "fs", "fz"], ["fy"]),
    ]
    fn = helper.make_function(
        "local", "FakeQuant", ["fx", "fs", "fz"], ["fy"], body, [helper.make_opsetid("", 17)]
    )
    inits = [_t("s", np.array(0.1, dtype=np.float32)), _t("z", np.array(0, dtype=np.int8))]
    model = _model(
        [helper.make_node("FakeQuant", ["x", "s", "z"], ["y"], domain="local")],
        [_vi("x", TensorProto.FLOAT, [2])],
        [_vi("y", TensorProto.FLOAT, [2])],
        inits,
        functions=[fn],
    )
    model.opset_import.append(helper.make_opsetid("local", 1))
    q = detect_quantization(model)
    assert q.formats == ("qdq",)
    assert q.counts == {"DequantizeLinear": 1, "QuantizeLinear": 1}
    assert graph_digest(model)["op_histogram"] == {"local::FakeQuant": 1}


def test_com_microsoft_qdq_16bit_and_custom_domain_ignored():
    nodes, inits = _qdq_pair("a", domain=MS, zp_dtype=np.uint16)
    fake = helper.make_node("QuantizeLinear", ["ain"], ["other"], domain="my.ops")
    model = _model(
        [*nodes, fake],
        [_vi("ain", TensorProto.FLOAT, [2])],
        [_vi("aout", TensorProto.FLOAT, [2]), _vi("other", TensorProto.FLOAT, [2])],
        inits,
    )
    q = detect_quantization(model)
    assert q.formats == ("qdq",)
    assert q.counts == {"DequantizeLinear": 1, "QuantizeLinear": 1}
    assert q.activation_dtypes == ("uint16",)


def test_dequantized_uint8_input_alone_is_not_quantized():
    inits = [_t("s", np.array(1 / 255, dtype=np.float32)), _t("z", np.array(0, dtype=np.uint8))]
    model = _model(
        [helper.make_node("DequantizeLinear", ["img", "s", "z"], ["y"])],
        [_vi("img", TensorProto.UINT8, [1, 3])],
        [_vi("y", TensorProto.FLOAT, [1, 3])],
        inits,
    )
    q = detect_quantization(model)
    assert not q.quantized
    assert q.counts == {"DequantizeLinear": 1}


def test_quant_summary_is_json_data(qdir):
    d = detect_quantization(onnx.load(qdir / "qdq_s8_pc.onnx")).to_dict()
    assert json.loads(json.dumps(d)) == d
    assert list(d) == [
        "quantized",
        "formats",
        "op_counts",
        "activation_dtypes",
        "weight_dtypes",
        "bias_dtypes",
        "weight_granularity",
    ]


# ---------------------------------------------------------------- digest and fingerprint


def test_graph_digest_content():
    model = float_model()
    model.graph.input.append(_vi("shp", TensorProto.INT64, [2]))  # initializer listed as input
    model.graph.node.append(helper.make_node("Gelu", ["y"], ["g"], domain=MS))
    model.graph.output.append(_vi("g", TensorProto.FLOAT, ["N", 6]))
    d = graph_digest(model)
    assert list(d) == [
        "opset_imports",
        "inputs",
        "outputs",
        "node_count",
        "op_histogram",
        "initializers",
        "quantization",
        "fingerprint",
    ]
    assert d["opset_imports"] == {"ai.onnx": 17, MS: 1}
    assert d["inputs"] == [{"name": "x", "dtype": "float32", "shape": ["N", 8, 4, 4]}]
    assert d["outputs"][0] == {"name": "y", "dtype": "float32", "shape": ["N", 6]}
    assert d["node_count"] == 5
    assert d["op_histogram"] == {
        "Conv": 1,
        "MatMul": 1,
        "Relu": 1,
        "Reshape": 1,
        f"{MS}::Gelu": 1,
    }
    assert d["initializers"] == {
        "count": 4,
        "bytes_per_dtype": {"float32": 4 * (8 * 8 * 9 + 8 + 128 * 6), "int64": 16},
    }
    assert d["quantization"]["quantized"] is False
    assert d["fingerprint"] == graph_fingerprint(model)
    assert json.loads(json.dumps(d)) == d


def test_fingerprint_ignores_metadata():
    base = graph_fingerprint(float_model())
    model = float_model()
    model.producer_name = "someone"
    model.producer_version = "9"
    model.doc_string = "doc"
    model.graph.doc_string = "graph doc"
    model.metadata_props.add(key="k", value="v")
    model.graph.node[0].doc_string = "node doc"
    model.graph.node[0].attribute[0].doc_string = "attribute doc"
    model.graph.node[0].metadata_props.add(key="pkg.torch.stack", value="x" * 100)
    model.graph.input[0].doc_string = "input doc"
    assert graph_fingerprint(model) == base


@pytest.mark.parametrize(
    "edit",
    [
        "weight_byte",
        "attribute",
        "opset",
        "rename_output",
        "add_node",
        "input_dim",
        "function",
    ],
)
def test_fingerprint_changes_on_graph_edits(edit):
    model = float_model()
    base = graph_fingerprint(model)
    g = model.graph
    if edit == "weight_byte":
        w = numpy_helper.to_array(g.initializer[0]).copy()
        w.flat[5] += 1.0
        g.initializer[0].CopyFrom(_t("w", w))
    elif edit == "attribute":
        g.node[0].attribute[0].ints[0] = 0
    elif edit == "opset":
        model.opset_import[0].version = 18
    elif edit == "rename_output":
        g.node[3].output[0] = "z"
        g.output[0].name = "z"
    elif edit == "add_node":
        g.node.append(helper.make_node("Relu", ["y"], ["y2"]))
    elif edit == "input_dim":
        g.input[0].type.tensor_type.shape.dim[0].dim_value = 1
    elif edit == "function":
        body = [helper.make_node("Relu", ["a"], ["b"])]
        model.functions.append(
            helper.make_function("f", "F", ["a"], ["b"], body, [helper.make_opsetid("", 17)])
        )
    assert graph_fingerprint(model) != base


def test_fingerprint_same_for_typed_and_raw_tensors():
    raw = _model(
        [helper.make_node("Add", ["x", "c"], ["y"])],
        [_vi("x", TensorProto.FLOAT, [3])],
        [_vi("y", TensorProto.FLOAT, [3])],
        [_t("c", np.array([1.0, 2.0, 3.0], dtype=np.float32))],
    )
    typed = onnx.ModelProto()
    typed.CopyFrom(raw)
    typed.graph.initializer[0].CopyFrom(
        helper.make_tensor("c", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])
    )
    assert not typed.graph.initializer[0].raw_data
    assert graph_fingerprint(typed) == graph_fingerprint(raw)
    typed.graph.initializer[0].float_data[1] = 2.5
    assert graph_fingerprint(typed) != graph_fingerprint(raw)


def test_fingerprint_with_external_data(tmp_path):
    model = float_model()
    expected = graph_fingerprint(model)
    to_save = onnx.ModelProto()
    to_save.CopyFrom(model)
    onnx.save(
        to_save,
        tmp_path / "m.onnx",
        save_as_external_data=True,
        location="m.onnx_data",
        size_threshold=1024,
    )
    assert (tmp_path / "m.onnx_data").exists()
    assert graph_fingerprint(onnx.load(tmp_path / "m.onnx")) == expected
    lazy = onnx.load(tmp_path / "m.onnx", load_external_data=False)
    assert graph_fingerprint(lazy, base_dir=tmp_path) == expected
    by_reference = graph_fingerprint(lazy)
    assert by_reference != expected
    assert graph_fingerprint(onnx.load(tmp_path / "m.onnx", load_external_data=False)) == (
        by_reference
    )


# ---------------------------------------------------------------- stamp


def test_stamp_round_trip_and_edit_invalidates(tmp_path):
    model = float_model()
    model.metadata_props.add(key="keep", value="me")
    assert read_stamp(model) is None
    assert not is_normalized(model)
    stamp = write_stamp(model, "onnxruntime-basic")
    assert stamp == {"tool": "onnxruntime-basic", "fingerprint": graph_fingerprint(model)}
    assert read_stamp(model) == stamp
    assert is_normalized(model)
    write_stamp(model, "again")
    keys = [p.key for p in model.metadata_props]
    assert keys.count(STAMP_KEY) == 1
    assert "keep" in keys
    assert read_stamp(model)["tool"] == "again"
    onnx.save(model, tmp_path / "n.onnx")
    assert is_normalized(onnx.load(tmp_path / "n.onnx"))
    model.graph.node[1].op_type = "Sigmoid"
    assert read_stamp(model) is not None
    assert not is_normalized(model)


def test_unreadable_stamp_is_none():
    model = float_model()
    model.metadata_props.add(key=STAMP_KEY, value="{not json")
    assert read_stamp(model) is None
    assert not is_normalized(model)
    model.metadata_props[0].value = json.dumps({"tool": "x"})
    assert not is_normalized(model)


# ---------------------------------------------------------------- synthetic inputs

SPECS = [
    TensorSpec("pts", "float32", ("B", 1, "P", 2), range=(0.0, 1008.0)),
    TensorSpec("labels", "int64", ("B", 1, "P"), values=(-1, 0, 1)),
    TensorSpec("ids", "int32", (5, 7)),
    TensorSpec("x", "float16", (4,)),
    TensorSpec("mask", "bool", (64,)),
]
DIMS = {"B": 2, "P": 3}


def test_make_inputs_shapes_dtypes_and_ranges():
    (feed,) = make_inputs(SPECS, DIMS, seed=0)
    assert list(feed) == ["pts", "labels", "ids", "x", "mask"]
    assert feed["pts"].shape == (2, 1, 3, 2) and feed["pts"].dtype == np.float32
    assert feed["pts"].min() >= 0.0 and feed["pts"].max() < 1008.0
    assert feed["pts"].max() > 1.0  # really drawn from the spec range, not [-1, 1]
    assert feed["labels"].dtype == np.int64
    assert set(np.unique(feed["labels"])) <= {-1, 0, 1}
    assert feed["ids"].dtype == np.int32
    assert feed["ids"].min() >= 0 and feed["ids"].max() <= 9
    assert feed["x"].dtype == np.float16
    assert np.all(np.abs(feed["x"]) <= 1.0)
    assert feed["mask"].dtype == np.bool_
    assert 0 < feed["mask"].sum() < 64


def test_make_inputs_is_deterministic():
    a = make_inputs(SPECS, DIMS, seed=7, count=3)
    b = make_inputs(SPECS, DIMS, seed=7, count=3)
    c = make_inputs(SPECS, DIMS, seed=8, count=1)
    assert len(a) == 3
    for fa, fb in zip(a, b, strict=True):
        for k in fa:
            np.testing.assert_array_equal(fa[k], fb[k])
    np.testing.assert_array_equal(make_inputs(SPECS, DIMS, seed=7)[0]["pts"], a[0]["pts"])
    assert not np.array_equal(a[0]["pts"], a[1]["pts"])
    assert not np.array_equal(a[0]["pts"], c[0]["pts"])


def test_make_inputs_missing_dim_and_empty_int_range():
    with pytest.raises(CatalogError, match="'P'"):
        make_inputs(SPECS, {"B": 1}, seed=0)
    with pytest.raises(ValueError, match="empty integer range"):
        make_inputs([TensorSpec("i", "int64", (2,), range=(3, 3))], {}, seed=0)


def test_specs_from_model():
    model = float_model()
    model.graph.input.append(_vi("shp", TensorProto.INT64, [2]))  # an initializer: not an input
    model.graph.input.append(_vi("tok", TensorProto.INT64, ["N", None]))
    specs, dims = specs_from_model(model)
    assert specs == [
        TensorSpec("x", "float32", ("N", 8, 4, 4), range=(-1.0, 1.0)),
        TensorSpec("tok", "int64", ("N", "tok_dim1"), range=(0, 10)),
    ]
    assert dims == {"N": 1, "tok_dim1": 1}
    feed = make_inputs(specs, dims, seed=0)[0]
    assert feed["x"].shape == (1, 8, 4, 4)
    assert feed["tok"].shape == (1, 1)


# ---------------------------------------------------------------- metrics


def test_compare_identical_is_finite_cap():
    ref = {"y": np.arange(6, dtype=np.float32).reshape(2, 3)}
    m = compare_outputs(ref, {"y": ref["y"].copy()})["y"]
    assert m == {
        "max_abs": 0.0,
        "mean_abs": 0.0,
        "cosine": 1.0,
        "sqnr_db": SQNR_CAP_DB,
        "nonfinite": 0.0,
        "ref_min": 0.0,  # np.arange(6): 0..5
        "ref_max": 5.0,
        "decision_iou": 1.0,  # the same elements (1..5) above 0.5 on both sides
    }
    json.dumps(m, allow_nan=False)


def test_compare_known_values():
    m = compare_outputs(
        {"y": np.array([1.0, 2.0, 3.0, 4.0])}, {"y": np.array([1.0, 2.0, 3.0, 5.0])}
    )["y"]
    assert m["max_abs"] == 1.0
    assert m["mean_abs"] == 0.25
    assert m["sqnr_db"] == pytest.approx(10 * math.log10(30.0))
    assert m["cosine"] == pytest.approx(34.0 / math.sqrt(30.0 * 39.0))


def test_compare_runs_accumulates_over_batches():
    rng = np.random.default_rng(3)
    refs = [{"y": rng.standard_normal((4, 5)).astype(np.float32)} for _ in range(3)]
    cands = [{"y": r["y"] + 0.01 * rng.standard_normal((4, 5))} for r in refs]
    got = compare_runs(refs, cands)["y"]
    whole = compare_outputs(
        {"y": np.concatenate([r["y"] for r in refs])},
        {"y": np.concatenate([c["y"] for c in cands])},
    )["y"]
    for key in whole:
        assert got[key] == pytest.approx(whole[key], rel=1e-12)
    assert 30.0 < got["sqnr_db"] < 50.0


def test_compare_zero_reference_and_nonfinite():
    zeros = {"y": np.zeros(4)}
    assert compare_outputs(zeros, {"y": np.zeros(4)})["y"]["sqnr_db"] == SQNR_CAP_DB
    off = compare_outputs(zeros, {"y": np.array([0.0, 0.0, 0.5, 0.0])})["y"]
    assert off["sqnr_db"] == -SQNR_CAP_DB
    assert off["cosine"] == 0.0
    bad = compare_outputs({"y": np.ones(4)}, {"y": np.array([1.0, np.nan, 1.0, np.inf])})["y"]
    assert bad["nonfinite"] == 2.0
    assert bad["sqnr_db"] == -SQNR_CAP_DB
    json.dumps(bad, allow_nan=False)


def test_compare_errors_name_the_output():
    with pytest.raises(ValueError, match=r"'masks'.*shape"):
        compare_outputs({"masks": np.zeros((1, 3))}, {"masks": np.zeros((1, 4))})
    with pytest.raises(ValueError, match=r"'iou'.*missing"):
        compare_outputs({"iou": np.zeros(2)}, {"other": np.zeros(2)})
    with pytest.raises(ValueError, match="2 reference runs but 1"):
        compare_runs([{}, {}], [{}])


# ---------------------------------------------------------------- runtime


def test_run_model_matches_numpy(tmp_path):
    model = _model(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Relu", ["y"], ["r"])],
        [_vi("x", TensorProto.FLOAT, ["N", 3])],
        [_vi("r", TensorProto.FLOAT, ["N", 2]), _vi("y", TensorProto.FLOAT, ["N", 2])],
        [_t("w", np.array([[1, -1], [2, 0], [0, 3]], dtype=np.float32))],
    )
    onnx.save(model, tmp_path / "m.onnx")
    specs, dims = specs_from_model(model)
    feeds = make_inputs(specs, {**dims, "N": 4}, seed=0, count=2)
    outs = run_model(tmp_path / "m.onnx", feeds)
    assert len(outs) == 2
    assert list(outs[0]) == ["r", "y"]
    w = numpy_helper.to_array(model.graph.initializer[0])
    for feed, out in zip(feeds, outs, strict=True):
        np.testing.assert_allclose(out["y"], feed["x"] @ w, rtol=1e-6)
        np.testing.assert_allclose(out["r"], np.maximum(feed["x"] @ w, 0), rtol=1e-6)


def test_session_options_are_fixed():
    import onnxruntime as ort

    so = session_options()
    assert so.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert so.intra_op_num_threads == 2
    assert so.log_severity_level == 3


def test_run_model_errors(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage" * 10)
    with pytest.raises(ModelFileError) as info:
        run_model(bad, [{}])
    assert info.value.where == str(bad)
    assert "\n" not in str(info.value)
    with pytest.raises(ModelFileError, match="not found"):
        run_model(tmp_path / "missing.onnx", [{}])
    onnx.save(float_model(), tmp_path / "f.onnx")
    with pytest.raises(ModelFileError, match="input set 0"):
        run_model(tmp_path / "f.onnx", [{"x": np.zeros((1, 3), dtype=np.float32)}])


def test_quantized_models_run_close_to_float(qdir):
    specs, dims = specs_from_model(onnx.load(qdir / "float.onnx"))
    feeds = make_inputs(specs, {**dims, "N": 2}, seed=0, count=2)
    ref = run_model(qdir / "float.onnx", feeds)
    for name in ("dynamic", "qdq_s8_pc"):
        metrics = compare_runs(ref, run_model(qdir / f"{name}.onnx", feeds))["y"]
        assert 10.0 < metrics["sqnr_db"] < SQNR_CAP_DB, name
        assert metrics["cosine"] > 0.9, name
