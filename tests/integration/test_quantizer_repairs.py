"""What onnxruntime's QDQ quantizer (1.31) gets wrong on Keras/TensorFlow graphs (tf2onnx),
each reproduced in a hand-built graph and quantized the way the quantize step does (the
npu presets, the QNN rules, real calibration ranges): the written graph must run on the CPU
EP and on QNN HTP (CPU fallback off) and match the float model; a graph that cannot be
repaired is the quantize step's one-line error naming the node.

- A Gemm bias [1, N] (tf2onnx's `Dense/Reshape:0` constant once normalize fused MatMul +
  Add): per-channel weights give it a [N] int32 scale on axis 0, whose size is 1 (magika).
- A Conv bias shared by several Convs, one of whose outputs is named like onnxruntime's
  copies of the bias (`b2`): the copy took the activation's quantized name and a Transpose
  after it met the bias's shape {36} (basic-pitch's CQT).
"""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT
QNN_WHEELS = platform.system() == "Windows" or (
    platform.system() == "Linux" and platform.machine() == "x86_64"
)


def _save(path: Path, nodes, inputs, outputs, inits) -> Path:
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def _quantize(src: Path, out: Path, feeds: list[dict], precision: str) -> list[dict]:
    """The quantize step's path for npu/PRECISION: presets, calibration, the QNN rules."""
    from winml_recipes.presets import resolve_target
    from winml_recipes.quant.calibrate import (
        CalibrationSettings,
        calibrate,
        tensors_to_calibrate,
        write_ort_cache,
    )
    from winml_recipes.quant.config import QuantizeOptions, quant_rules, resolve
    from winml_recipes.quant.ort import quantize_static_qdq

    cfg = resolve(QuantizeOptions(), resolve_target("npu", precision))
    model = onnx.load(str(src))
    tensors = tensors_to_calibrate(model)
    ranges = calibrate(src, lambda: iter(feeds), CalibrationSettings(), tensors=tensors,
                       work_dir=out.parent)  # fmt: skip
    rules = quant_rules(cfg)
    if rules is not None:
        ranges, _ = rules.adjust_ranges(model, ranges, tensors)
    write_ort_cache(ranges, out.parent / "ranges.json")
    # the nodes the EP needs in float, as the quantize step excludes them
    exclude = list(rules.float_nodes(model)) if rules is not None else []
    return quantize_static_qdq(src, out, cfg, out.parent / "ranges.json", {}, exclude, rules)


def _sqnr(want: np.ndarray, got: np.ndarray) -> float:
    noise = float(np.sum((want - got) ** 2))
    return 10 * np.log10(float(np.sum(want**2)) / max(noise, 1e-30))


def _runs_right(src: Path, out: Path, feeds: list[dict], min_db: float) -> None:
    """The quantized model runs on the CPU EP and on QNN HTP (fallback off) and matches the
    float model on every output."""
    from winml_recipes.runtime.sessions import run_model
    from winml_recipes.runtime.target import run_on_target

    want = run_model(src, feeds)
    got_cpu = run_model(out, feeds)
    for w, g in zip(want, got_cpu, strict=True):
        assert all(_sqnr(w[k], g[k]) > min_db for k in w), "CPU EP"
    if not QNN_WHEELS:
        return
    run = run_on_target(out, feeds, "npu")
    assert run.verified_on == "qnn-htp"
    for w, g in zip(want, run.outputs, strict=True):
        assert all(_sqnr(w[k], g[k]) > min_db for k in w), "QNN HTP"


def _dense_with_row_bias(tmp_path: Path) -> Path:
    """x[1, 32] -> Gemm(W [32, 24], C [1, 24]) -> Tanh: a Keras Dense as tf2onnx and
    onnxruntime's MatMul + Add fusion leave it."""
    rng = np.random.default_rng(0)
    w = (rng.normal(size=(32, 24)) * 0.2).astype(np.float32)
    c = (rng.normal(size=(1, 24)) * 0.5).astype(np.float32)
    return _save(
        tmp_path / "dense.onnx",
        [helper.make_node("Gemm", ["x", "w", "dense/Reshape:0"], ["h"], name="dense"),
         helper.make_node("Tanh", ["h"], ["y"], name="act")],
        [helper.make_tensor_value_info("x", F, [1, 32])],
        [helper.make_tensor_value_info("y", F, [1, 24])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(c, "dense/Reshape:0")],
    )  # fmt: skip


def test_row_bias_of_a_dense_layer(tmp_path: Path) -> None:
    """(At w8a16 onnxruntime's QNN config leaves this bias alone: uint8 is the case.) The
    quantizer is handed the bias as the vector it broadcasts as (graph/gemm_bias.py), so
    the written graph needs no repair; the repair of what onnxruntime writes for a [1, N]
    bias is checked on onnxruntime's own output below."""
    model = _dense_with_row_bias(tmp_path)
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.normal(size=(1, 32)).astype(np.float32)} for _ in range(8)]
    repairs = _quantize(model, tmp_path / "q.onnx", feeds, "uint8")
    _runs_right(model, tmp_path / "q.onnx", feeds, 20)
    assert [(r["node"], r["tensor"], r["repair"]) for r in repairs] == [
        ("dense", "dense/Reshape:0", "C [1, N] given to the quantizer as [N]")
    ]  # and nothing repaired after the quantizer
    written = onnx.load(str(tmp_path / "q.onnx"))
    bias = next(t for t in written.graph.initializer if t.name == "dense/Reshape:0_quantized")
    assert list(bias.dims) == [24]


def test_row_bias_as_onnxruntime_writes_it_is_repaired(tmp_path: Path) -> None:
    """onnxruntime's quantize_static on the [1, 24] bias itself (per-channel uint8 QDQ, 16
    calibration samples): a [24] int32 scale on axis 0, whose size is 1, which the CPU EP
    refuses to run; repair moves it to axis 1."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    from winml_recipes.quant.validity import repair

    model = _dense_with_row_bias(tmp_path)
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.normal(size=(1, 32)).astype(np.float32)} for _ in range(16)]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.left = iter(feeds)

        def get_next(self) -> dict | None:
            return next(self.left, None)

    out = tmp_path / "ort.onnx"
    quantize_static(str(model), str(out), Reader(), quant_format=QuantFormat.QDQ,
                    per_channel=True, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QUInt8)  # fmt: skip
    repairs = repair(out, model)
    assert [(r["tensor"], r["repair"]) for r in repairs] == [
        ("dense/Reshape:0_quantized", "axis 0 -> 1")
    ]
    _runs_right(model, out, feeds, 20)


def _shared_bias(tmp_path: Path) -> Path:
    """Four Convs share one bias `b`; the third's output is named `b2` and read by a Neg
    and a Transpose (tf2onnx's names: `conv1d_25;conv1d_25` bias, `...conv1d_252` output)."""
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array((rng.normal(size=(6,)) * 0.1).astype(np.float32), "b")]
    nodes, outputs = [], []
    for k in range(4):
        w = f"w{k}"
        inits.append(numpy_helper.from_array((rng.normal(size=(6, 3, 3)) * 0.3)
                                             .astype(np.float32), w))  # fmt: skip
        out = "b2" if k == 2 else f"c{k}"
        nodes.append(helper.make_node("Conv", ["x", w, "b"], [out], name=f"conv{k}",
                                      pads=[1, 1]))  # fmt: skip
        outputs.append(out)
    nodes += [
        helper.make_node("Neg", ["b2"], ["n"], name="neg"),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n4"], name="unsq"),
        helper.make_node("Transpose", ["n4"], ["t"], name="transpose", perm=[0, 2, 3, 1]),
        helper.make_node("Concat", ["c0", "c1", "c3"], ["cat"], name="cat", axis=1),
    ]
    inits.append(numpy_helper.from_array(np.array([2], np.int64), "axes"))
    return _save(
        tmp_path / "shared.onnx",
        nodes,
        [helper.make_tensor_value_info("x", F, [1, 3, 16])],
        [helper.make_tensor_value_info("t", F, [1, 1, 16, 6]),
         helper.make_tensor_value_info("cat", F, [1, 18, 16])],
        inits,
    )  # fmt: skip


@pytest.mark.parametrize("precision", ["uint8", "w8a16"])
def test_copies_of_a_shared_bias_take_no_tensor_name(tmp_path: Path, precision: str) -> None:
    model = _shared_bias(tmp_path)
    rng = np.random.default_rng(3)
    feeds = [{"x": rng.normal(size=(1, 3, 16)).astype(np.float32)} for _ in range(8)]
    _quantize(model, tmp_path / "q.onnx", feeds, precision)
    quantized = onnx.load(str(tmp_path / "q.onnx"))
    readers = [n for n in quantized.graph.node if n.op_type == "Neg"]
    producer = {o: n for n in quantized.graph.node for o in n.output}
    dq = producer[readers[0].input[0]]
    assert producer[dq.input[0]].op_type == "QuantizeLinear"  # the Conv output, not a bias
    _runs_right(model, tmp_path / "q.onnx", feeds, 25)


def test_an_invalid_graph_is_a_quantize_error_naming_the_node(tmp_path: Path) -> None:
    """What the repairs cannot fix never reaches a target: onnx's checker or the CPU run
    fails inside quantize, naming the node."""
    from winml_recipes.quant.validity import check
    from winml_recipes.sdk.errors import PassError

    model = _shared_bias(tmp_path)
    broken = onnx.load(str(model))
    for node in broken.graph.node:  # the Transpose now reads the bias, as it did
        if node.op_type == "Neg":
            node.input[0] = "b"
    bad = tmp_path / "bad.onnx"
    onnx.save(broken, str(bad))
    feed = {"x": np.zeros((1, 3, 16), np.float32)}
    with pytest.raises(PassError) as caught:
        check(bad, model, feed)
    assert "invalid graph" in caught.value.message
    assert "unsq" in caught.value.message or "transpose" in caught.value.message
    check(model, model, feed)  # the float model itself passes


def test_degenerate_scales_are_kept_float_with_the_reason(tmp_path: Path) -> None:
    """A NaN weight scale and a zero activation scale (what onnxruntime's quant_utils makes
    of degenerate ranges, warning "invalid value encountered in divide"): the weight comes
    back as the float model's constant, the activation's Q/DQ is bypassed, and the graph
    computes the float model's values there."""
    from winml_recipes.quant.validity import check, repair

    w = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    float_model = _save(
        tmp_path / "float.onnx",
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
         helper.make_node("Relu", ["y"], ["z"], name="relu")],
        [helper.make_tensor_value_info("x", F, [1, 4])],
        [helper.make_tensor_value_info("z", F, [1, 3])],
        [numpy_helper.from_array(w, "w")],
    )  # fmt: skip
    u8 = TensorProto.UINT8
    qdq = _save(
        tmp_path / "q.onnx",
        [helper.make_node("DequantizeLinear", ["w_quantized", "w_scale", "zp"], ["w_dq"],
                          name="w_DequantizeLinear"),
         helper.make_node("MatMul", ["x", "w_dq"], ["y"], name="mm"),
         helper.make_node("QuantizeLinear", ["y", "y_scale", "zp"], ["y_q"],
                          name="y_QuantizeLinear"),
         helper.make_node("DequantizeLinear", ["y_q", "y_scale", "zp"], ["y_dq"],
                          name="y_DequantizeLinear"),
         helper.make_node("Relu", ["y_dq"], ["z"], name="relu")],
        [helper.make_tensor_value_info("x", F, [1, 4])],
        [helper.make_tensor_value_info("z", F, [1, 3])],
        [numpy_helper.from_array(np.full((4, 3), 7, np.uint8), "w_quantized"),
         numpy_helper.from_array(np.array(np.nan, np.float32), "w_scale"),
         numpy_helper.from_array(np.array(0.0, np.float32), "y_scale"),
         helper.make_tensor("zp", u8, [], [0])],
    )  # fmt: skip
    repairs = repair(qdq, float_model)
    assert {r["node"]: r["repair"].split(" (")[0] for r in repairs} == {
        "w_DequantizeLinear": "kept float",
        "y_QuantizeLinear": "kept float",
        "y_DequantizeLinear": "kept float",
    }
    assert all("scale" in r["why"] for r in repairs)
    feed = {"x": np.array([[1.0, -2.0, 3.0, 0.5]], np.float32)}
    check(qdq, float_model, feed)
    from winml_recipes.runtime.sessions import run_model

    (want,), (got,) = run_model(float_model, [feed]), run_model(qdq, [feed])
    np.testing.assert_allclose(got["z"], want["z"], rtol=1e-6)


def test_reciprocal_of_a_layer_norm_stays_float_on_htp(tmp_path: Path) -> None:
    """x * Reciprocal(Sqrt(mean(x) + eps)), as tf2onnx writes a Keras LayerNorm's rsqrt
    (magika): quantized, HTP's Reciprocal gave 4.1 dB (the CPU EP 55 dB; magika's top-1
    0.125); kept float by the QNN rules, HTP matches the CPU EP."""
    model = _save(
        tmp_path / "norm.onnx",
        [helper.make_node("ReduceMean", ["x"], ["var"], name="mean", axes=[1], keepdims=1),
         helper.make_node("Add", ["var", "eps"], ["ve"], name="add"),
         helper.make_node("Sqrt", ["ve"], ["s"], name="sqrt"),
         helper.make_node("Reciprocal", ["s"], ["r"], name="rsqrt"),
         helper.make_node("Mul", ["x", "r"], ["y"], name="scale")],
        [helper.make_tensor_value_info("x", F, [1, 16, 8])],
        [helper.make_tensor_value_info("y", F, [1, 16, 8])],
        [numpy_helper.from_array(np.array(1e-5, np.float32), "eps")],
    )  # fmt: skip
    rng = np.random.default_rng(0)
    feeds = [{"x": (rng.random((1, 16, 8)) * rng.choice([0.001, 0.01, 0.03, 0.2]))
              .astype(np.float32)} for _ in range(8)]  # fmt: skip
    _quantize(model, tmp_path / "q.onnx", feeds, "w8a16")
    _runs_right(model, tmp_path / "q.onnx", feeds, 40)


def test_nodes_out_of_order_inside_a_subgraph_are_sorted(tmp_path: Path) -> None:
    """An If's then-branch whose Relu reads a value its Neg makes after it: the checker
    refuses the graph; repair sorts the branch (the pass's own `modified` looks at the main
    graph only) and records the node it moved."""
    from winml_recipes.quant.validity import repair
    from winml_recipes.runtime.sessions import run_model

    then = helper.make_graph(
        [helper.make_node("Relu", ["n"], ["t"], name="relu"),
         helper.make_node("Neg", ["x"], ["n"], name="neg")],
        "then", [], [helper.make_tensor_value_info("t", F, [2])],
    )  # fmt: skip
    other = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["e"], name="same")],
        "else", [], [helper.make_tensor_value_info("e", F, [2])],
    )  # fmt: skip
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], name="if", then_branch=then, else_branch=other)],
        "g",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x", F, [2])],
        [helper.make_tensor_value_info("y", F, [2])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(str(path))
    done = repair(path, path)
    assert [(r["node"], r["repair"]) for r in done] == [("relu", "nodes sorted topologically")]
    onnx.checker.check_model(str(path), full_check=True)
    feeds = [{"c": np.array(True), "x": np.array([1.0, -2.0], np.float32)}]
    np.testing.assert_array_equal(run_model(path, feeds)[0]["y"], [0.0, 2.0])
