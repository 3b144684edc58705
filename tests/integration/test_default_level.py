"""verify on the CPU EP checks the model at onnxruntime's default optimization level too.

Every session of the tool runs BASIC; an app's plain `InferenceSession` runs ALL, whose QDQ
fusions can compute something else. Measured with onnxruntime 1.31: a quantized
AveragePool whose window covers the whole map with ceil_mode (EfficientNet's head, before
quantize rewrote it to GlobalAveragePool) gives 0 for every value at ALL and the right
average at BASIC; healthy cpu/int8 builds agree with themselves at both levels to
276-338 dB. The default level's run must be no further from float than the verified run by
more than 10 dB."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _qdq_whole_map_pool(path: Path) -> Path:
    scale = numpy_helper.from_array(np.array(0.02, np.float32), "s")
    zero = numpy_helper.from_array(np.array(0, np.uint8), "z")
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
        helper.make_node(
            "AveragePool",
            ["xd"],
            ["p"],
            kernel_shape=[32, 32],
            strides=[32, 32],
            pads=[0] * 4,
            ceil_mode=1,
            count_include_pad=1,
        ),
        helper.make_node("QuantizeLinear", ["p", "s", "z"], ["pq"]),
        helper.make_node("DequantizeLinear", ["pq", "s", "z"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "pool",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 1, 1])],
        [scale, zero],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    onnx.save(model, path)
    return path


def test_a_fusion_that_changes_the_model_fails_the_default_level_gate(tmp_path: Path) -> None:
    from winml_recipes.onnx.metrics import compare_runs
    from winml_recipes.passes import verify_float
    from winml_recipes.runtime.sessions import run_at_default_level, run_model

    model = _qdq_whole_map_pool(tmp_path / "pool.onnx")
    feeds = [{"x": np.random.default_rng(i).uniform(0, 4, (1, 4, 2, 2)).astype(np.float32)}
             for i in range(2)]  # fmt: skip
    basic, default = run_model(model, feeds), run_at_default_level(model, feeds)
    # the float model's answer: the average of each map (the window covers it)
    floats = [{"y": f["x"].mean(axis=(2, 3), keepdims=True)} for f in feeds]
    assert np.abs(basic[0]["y"] - floats[0]["y"]).max() <= 0.02  # one step of the encoding
    record = verify_float.default_level_record(
        compare_runs(floats, basic), compare_runs(floats, default)
    )
    gate = verify_float.default_level_gate(record)
    assert not gate.passed, (record, default[0]["y"].ravel())
    # the same gate between two BASIC runs of the model: nothing to report
    again = compare_runs(floats, run_model(model, feeds))
    assert verify_float.default_level_gate(
        verify_float.default_level_record(compare_runs(floats, basic), again)
    ).passed


def test_a_cpu_build_records_its_default_level_agreement(tmp_path: Path) -> None:
    from tests.integration.test_float_that_cannot_judge import _build

    done = _build(tmp_path, 1.0)
    assert done.exit_code == 0, done.stderr
    (manifest,) = (tmp_path / "out1.0").glob("*/cpu-int8/manifest.json")
    verify = next(s for s in json.loads(manifest.read_text())["components"]["model"]["steps"]
                  if s["pass"] == "verify")  # fmt: skip
    at_default = verify["metrics"]["at_default_level"]["logits"]
    assert at_default["sqnr_db"] == at_default["verified_sqnr_db"]  # the same arithmetic
    gate = next(g for g in verify["metrics"]["gates"] if g["output"].startswith("onnxruntime"))
    assert gate["passed"] and gate["threshold"] == -10.0


def test_a_loss_that_leaves_the_output_right_to_any_purpose_is_not_counted() -> None:
    """mtcnn-onet's face_prob at cpu/int8 (QLinearSoftmax at ALL): 59.5 dB verified, 48.5 dB
    at the default level, right to any purpose, so it passes. The same 11 dB loss from 35 dB
    (20 dB left) fails, and so does EfficientNet's 12 -> 0 dB."""
    from winml_recipes.passes import verify_float

    def gate(verified: float, default: float):
        record = {"y": {"verified_sqnr_db": verified, "sqnr_db": default}}
        return verify_float.default_level_gate(record)

    assert gate(59.5, 48.5).passed
    assert not gate(35.0, 24.0).passed
    assert not gate(12.0, 0.0).passed
    assert gate(30.0, 25.0).passed  # rounding moves an output a few dB
