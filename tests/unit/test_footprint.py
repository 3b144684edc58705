"""Memory estimates: weights and activation liveness read from the graph, and the budget."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from winml_recipes.engine.budget import check_fits, parse_budget, resolve_budget
from winml_recipes.onnx.footprint import footprint
from winml_recipes.sdk.errors import MemoryBudgetError, RecipeError
from winml_recipes.sdk.estimates import MemoryEstimate


def _chain(path: Path, width: int = 1000) -> Path:
    """x -> Relu a -> Relu b -> Add(a, b) + w -> y; `a` is read twice, so it lives longest."""
    w = numpy_helper.from_array(np.ones(width, np.float32), "w")
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["a"]),
            helper.make_node("Relu", ["a"], ["b"]),
            helper.make_node("Add", ["a", "b"], ["c"]),
            helper.make_node("Add", ["c", "w"], ["y"]),
        ],
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", width])],
        initializer=[w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return path


def test_activation_peak_follows_liveness(tmp_path: Path) -> None:
    # Per row of 1000 float32 (4,000 bytes): x is freed after the first Relu; while
    # Add(a, b) runs, a, b and c are alive together: 3 tensors.
    fp = footprint(_chain(tmp_path / "m.onnx"), {"x": (1, 1000)})
    assert fp.weight_bytes == 4000
    assert fp.activation_peak_bytes == 3 * 4000
    assert fp.unknown_tensors == 0


def test_activation_peak_scales_with_the_given_shapes(tmp_path: Path) -> None:
    path = _chain(tmp_path / "m.onnx")
    assert footprint(path, {"x": (8, 1000)}).activation_peak_bytes == 8 * 3 * 4000
    # Without a value for the dynamic dim nothing can be sized: counted, not guessed.
    assert footprint(path, {}).unknown_tensors == 4


def test_external_weights_are_counted_without_being_read(tmp_path: Path) -> None:
    model = onnx.load(str(_chain(tmp_path / "m.onnx", width=4096)))
    onnx.save_model(
        model, str(tmp_path / "ext.onnx"), save_as_external_data=True, location="ext.onnx_data"
    )
    (tmp_path / "ext.onnx_data").write_bytes(b"\0" * 16384)  # same size, other content
    assert footprint(tmp_path / "ext.onnx", {"x": (1, 4096)}).weight_bytes == 16384


@pytest.mark.parametrize(
    ("text", "mb"), [("12GB", 12288), ("12g", 12288), ("9000MB", 9000), ("512", 512)]
)
def test_budget_sizes(text: str, mb: float) -> None:
    assert parse_budget(text) == mb


@pytest.mark.parametrize("text", ["abc", "12TB", "-1GB", "10MB"])
def test_bad_budget_is_one_line(text: str) -> None:
    with pytest.raises(RecipeError) as err:
        parse_budget(text)
    assert "\n" not in str(err.value) and "--memory-budget" in str(err.value)


def test_budget_from_environment_and_default(monkeypatch) -> None:
    monkeypatch.setenv("WINML_RECIPES_MEMORY_BUDGET", "3GB")
    assert resolve_budget(None) == 3072
    assert resolve_budget("1GB") == 1024
    monkeypatch.delenv("WINML_RECIPES_MEMORY_BUDGET")
    import psutil

    total = psutil.virtual_memory().total / 2**20
    assert total - max(2048, 0.15 * total) == pytest.approx(resolve_budget(None))


def test_over_budget_says_what_and_how_much() -> None:
    estimate = MemoryEstimate(20480, "calibration forward: weights ...", "use fewer pixels")
    check_fits(estimate, 20480, "enc/quantize")
    with pytest.raises(MemoryBudgetError) as err:
        check_fits(estimate, 16384, "enc/quantize")
    text = str(err.value)
    assert text.startswith("enc/quantize: needs about 20.0 GB")
    assert "budget of 16.0 GB" in text and "use fewer pixels" in text


def test_largest_activation_at_the_given_shapes(tmp_path: Path) -> None:
    from winml_recipes.onnx.footprint import largest_activation

    model = _chain(tmp_path / "chain.onnx")
    assert largest_activation(model, {"x": (3, 1000)}) in {("a", 3000), ("b", 3000),
                                                          ("c", 3000), ("x", 3000)}  # fmt: skip
    assert largest_activation(model, {"x": (7, 1000)})[1] == 7000


def test_htp_preparation_is_estimated_from_the_largest_tensor(tmp_path: Path) -> None:
    """The QNN plugin's fitted cost: its base, its MB per million elements of the largest
    activation and its factor on the weights; a step over the budget says what to change."""
    from winml_recipes.engine.budget import preparation_estimate
    from winml_recipes.eps.cpu import PLUGIN as CPU
    from winml_recipes.eps.qnn import PLUGIN as QNN
    from winml_recipes.sdk.contract import IOContract, TensorSpec

    model = _chain(tmp_path / "chain.onnx")
    cost = QNN.preparation_cost()
    small = IOContract((TensorSpec("x", "float32", ("n", 1000)),), (), {"n": 1000})
    large = IOContract((TensorSpec("x", "float32", ("n", 1000)),), (), {"n": 400_000})
    weights_mb = 4000 / 2**20
    got = preparation_estimate(model, small, QNN)
    assert got is not None
    assert got.mb == pytest.approx(
        cost.base_mb + cost.mb_per_million * 1.0 + cost.weight_factor * weights_mb
    )
    bigger = preparation_estimate(model, large, QNN)
    assert bigger is not None and bigger.mb - got.mb == pytest.approx(cost.mb_per_million * 399)
    assert "largest tensor" in bigger.made_of and "qnn-htp" in bigger.made_of
    with pytest.raises(MemoryBudgetError, match="query chunks"):
        check_fits(bigger, 1024, "enc/verify")
    assert preparation_estimate(model, small, CPU) is None


def test_npu_verify_and_compile_estimate_htp_preparation(tmp_path: Path) -> None:
    """On the NPU's EP, verify (on the target) and compile include graph preparation; on the
    CPU, and with verify off the target, they do not."""
    from winml_recipes.passes.compile import CompileConfig, CompilePass
    from winml_recipes.passes.verify import VerifyConfig, VerifyPass
    from winml_recipes.sdk.contract import IOContract, TensorSpec
    from winml_recipes.sdk.estimates import EstimateInputs
    from winml_recipes.sdk.target import Target

    model = _chain(tmp_path / "chain.onnx")
    contract = IOContract((TensorSpec("x", "float32", ("n", 1000)),), (), {"n": 4})
    npu = EstimateInputs(Target("npu", "fp16"), contract)  # a float graph is what HTP gets
    cpu = EstimateInputs(Target("cpu", "int8"), contract)
    on = VerifyPass().estimate_memory(model, VerifyConfig(), npu)
    assert on is not None and "candidate session for qnn-htp" in on.made_of
    off = VerifyPass().estimate_memory(model, VerifyConfig(on_target=False), npu)
    assert off is not None and "qnn-htp" not in off.made_of and off.mb < on.mb
    assert "qnn-htp" not in VerifyPass().estimate_memory(model, VerifyConfig(), cpu).made_of
    compiled = CompilePass().estimate_memory(model, CompileConfig(), npu)
    assert compiled is not None and compiled.made_of.startswith("compile for qnn-htp")
    # a float source a w8a16 build quantizes first does not stand in for the QDQ graph's
    # preparation (4x its weights' bytes, no Q/DQ cut points): estimated when the step runs
    later = EstimateInputs(Target("npu", "w8a16"), contract)
    assert CompilePass().estimate_memory(model, CompileConfig(), later) is None
    before = VerifyPass().estimate_memory(model, VerifyConfig(), later)
    assert before is not None and "qnn-htp" not in before.made_of
