"""The light view: graph tools given a model without its weights' bytes answer as they do
on the whole model, and the weights come back intact."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper, version_converter

from winml_recipes.onnx.lightview import LIMIT_BYTES, light_view, with_weights


def _model() -> onnx.ModelProto:
    """MatMul by a 16 KB weight, a Reshape whose shape is a small constant, a Softmax and a
    Clip with min/max inputs (opset 13: the converter has adapters to run up to 21)."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "w")
    shape = numpy_helper.from_array(np.array([2, 8, 8 * 64 // 8], dtype=np.int64), "shape")
    lo = numpy_helper.from_array(np.array(-1.0, dtype=np.float32), "lo")
    hi = numpy_helper.from_array(np.array(1.0, dtype=np.float32), "hi")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Reshape", ["h", "shape"], ["r"]),
        helper.make_node("Softmax", ["r"], ["s"], axis=-1),
        helper.make_node("Clip", ["s", "lo", "hi"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [weight, shape, lo, hi],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_the_view_holds_no_large_bytes_and_infers_the_same_shapes() -> None:
    model = _model()
    view = light_view(model)
    assert view.ByteSize() < model.ByteSize() - 64 * 64 * 4 + LIMIT_BYTES
    (w,) = [t for t in view.graph.initializer if t.name == "w"]
    assert (w.raw_data, list(w.dims)) == (b"", [64, 64])
    full = onnx.shape_inference.infer_shapes(model)
    light = onnx.shape_inference.infer_shapes(view)
    assert list(light.graph.value_info) == list(full.graph.value_info)
    assert list(light.graph.output) == list(full.graph.output)
    assert light.graph.output[0].type.tensor_type.shape.dim[2].dim_value == 64  # the shape
    assert model.graph.initializer[0].raw_data  # the model itself is untouched


def test_a_converted_view_with_the_weights_is_the_converted_model() -> None:
    whole = version_converter.convert_version(_model(), 21)
    source = _model()
    converted = with_weights(version_converter.convert_version(light_view(source), 21), source)
    assert converted.SerializeToString() == whole.SerializeToString()
    assert source.graph.initializer[0].raw_data == b""  # moved, not copied
    onnx.checker.check_model(converted, full_check=True)


def test_a_model_saved_with_external_data_keeps_its_weights(tmp_path, monkeypatch) -> None:
    """onnx.save_model moves the bytes it writes out of the proto; our save brings them
    back, so a pass can go on with the model it saved (the full-size opset upgrade did)."""
    from winml_recipes.onnx import io

    monkeypatch.setattr(io, "EXTERNAL_DATA_THRESHOLD_BYTES", 1)  # every model goes external
    model = _model()
    before = model.SerializeToString()
    io.save_model(model, tmp_path / "model.onnx")
    assert (tmp_path / "model.onnx_data").stat().st_size == 64 * 64 * 4
    assert model.SerializeToString() == before
    again = io.load_model(tmp_path / "model.onnx")
    assert again.graph.initializer[0].raw_data == model.graph.initializer[0].raw_data
