"""`winml-recipes dequantize` and `inspect` on real quantized files."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import cli, make_mlp_onnx
from winml_recipes.onnx.quant import detect_quantization


@pytest.fixture
def mlp_pair(tmp_path):
    from onnxruntime.quantization import QuantType, quantize_dynamic

    float_path = make_mlp_onnx(tmp_path / "mlp.onnx")
    q_path = tmp_path / "mlp_int8.onnx"
    quantize_dynamic(str(float_path), str(q_path), weight_type=QuantType.QInt8)
    return float_path, q_path


def test_inspect_reports_format_counts_and_dtypes(mlp_pair) -> None:
    _, q_path = mlp_pair
    text = cli("inspect", q_path)
    assert text.exit_code == 0
    first = text.stdout.splitlines()[0]
    assert first.startswith(f"{q_path}: quantized (") and "MatMulInteger x2" in first
    data = json.loads(cli("inspect", q_path, "--json").stdout)["quantization"]
    assert data["quantized"] is True and "dynamic" in data["formats"]
    assert data["op_counts"]["MatMulInteger"] == 2 and "int8" in data["weight_dtypes"]
    assert cli("inspect", mlp_pair[0]).stdout.splitlines()[0].endswith(": float")


def test_dequantize_writes_a_float_model_and_reports(mlp_pair, tmp_path) -> None:
    _, q_path = mlp_pair
    out = tmp_path / "back.onnx"
    result = cli("dequantize", q_path, "-o", out, "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["changed"] is True and report["counts"]["matmul_integer_replaced"] == 2
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    assert not detect_quantization(model).quantized
    again = cli("dequantize", out, "--check")
    assert again.exit_code == 0 and "already float" in again.stdout


def test_check_mode_writes_nothing_and_exits_3(mlp_pair, tmp_path) -> None:
    _, q_path = mlp_pair
    before = sorted(p.name for p in tmp_path.iterdir())
    result = cli("dequantize", q_path, "--check")
    assert result.exit_code == 3
    assert "replaced 2 MatMulInteger" in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_float_model_is_a_noop_with_exit_0(mlp_pair, tmp_path) -> None:
    """Nothing is rewritten; -o still gets the (unchanged) model, so `&& use OUT` works."""
    float_path, _ = mlp_pair
    out = tmp_path / "out.onnx"
    result = cli("dequantize", float_path, "-o", out)
    assert result.exit_code == 0
    assert result.stdout.splitlines() == [
        f"{float_path}: already float: nothing to do",
        f"wrote {out} (an unchanged copy)",
    ]
    original, copy = onnx.load(str(float_path)), onnx.load(str(out))
    assert copy.graph.SerializeToString() == original.graph.SerializeToString()


def test_not_onnx_is_one_line_exit_2(tmp_path) -> None:
    bad = tmp_path / "notes.onnx"
    bad.write_text("this is not a model\n")
    result = cli("dequantize", bad, "-o", tmp_path / "o.onnx")
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1 and str(bad) in result.stderr


def test_scale_that_is_not_constant_names_the_node(tmp_path) -> None:
    w = numpy_helper.from_array(np.arange(8, dtype=np.int8).reshape(2, 4), "w_q")
    graph = helper.make_graph(
        [
            helper.make_node("DequantizeLinear", ["w_q", "s"], ["w"], name="dq_weight"),
            helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
        ],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2]),
            helper.make_tensor_value_info("s", TensorProto.FLOAT, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        initializer=[w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    path = tmp_path / "dyn_scale.onnx"
    onnx.save(model, str(path))
    result = cli("dequantize", path, "-o", tmp_path / "o.onnx")
    assert result.exit_code == 2
    assert "dq_weight" in result.stderr and "not a constant" in result.stderr
    assert not (tmp_path / "o.onnx").exists()


def test_usage_errors(mlp_pair, tmp_path) -> None:
    _, q_path = mlp_pair
    assert cli("dequantize", q_path).exit_code == 2
    assert cli("dequantize", q_path, "-o", q_path).exit_code == 2
    assert cli("dequantize", q_path, "--check", "-o", tmp_path / "x.onnx").exit_code == 2
