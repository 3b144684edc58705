"""Synthetic inputs from what the graph tells: ids below the table they index, masks in
{0, 1}, image inputs recognised from their shape."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import cli
from winml_recipes.onnx.inputs import image_preprocess, integer_values, specs_from_model

I64, F = TensorProto.INT64, TensorProto.FLOAT


def _embedder(segments: int = 3) -> onnx.ModelProto:
    """ids -> Gather(word table of 300 rows); segment ids (a name nothing knows) ->
    Reshape -> Gather(3 rows); a mask -> Cast(bool) -> Where; summed."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((300, 8)).astype(np.float32), "words"),
        numpy_helper.from_array(rng.standard_normal((segments, 8)).astype(np.float32), "segs"),
        numpy_helper.from_array(np.array([1, 6], np.int64), "flat"),
        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
    ]
    nodes = [
        helper.make_node("Gather", ["words", "input_ids"], ["w"]),
        helper.make_node("Reshape", ["segment_ids", "flat"], ["s_flat"]),
        helper.make_node("Gather", ["segs", "s_flat"], ["s"]),
        helper.make_node("Add", ["w", "s"], ["ws"]),
        helper.make_node("Cast", ["keep"], ["keep_b"], to=TensorProto.BOOL),
        helper.make_node("Unsqueeze", ["keep_b", "axis"], ["keep_3d"]),
        helper.make_node("Where", ["keep_3d", "ws", "zero"], ["y"]),
    ]
    inits.append(numpy_helper.from_array(np.array([2], np.int64), "axis"))
    graph = helper.make_graph(
        nodes,
        "embedder",
        [
            helper.make_tensor_value_info("input_ids", I64, [1, 6]),
            helper.make_tensor_value_info("segment_ids", I64, [1, 6]),
            helper.make_tensor_value_info("keep", I64, [1, 6]),
        ],
        [helper.make_tensor_value_info("y", F, [1, 6, 8])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_integer_inputs_take_their_range_from_the_graph() -> None:
    model = _embedder()
    assert integer_values(model, "input_ids") == ((0, 300), None)
    assert integer_values(model, "segment_ids") == ((0, 3), None)  # through the Reshape
    assert integer_values(model, "keep") == (None, (0, 1))
    specs = {s.name: s for s in specs_from_model(model)[0]}
    assert specs["input_ids"].range == (0, 300)
    assert (specs["keep"].range, specs["keep"].values) == (None, (0, 1))


def test_build_without_data_draws_ids_the_tables_have(tmp_path: Path) -> None:
    """Ids drawn from [0, 10) (the old default) index past a 3-row table: onnxruntime's
    'indices element out of data bounds' in the first forward pass."""
    path = tmp_path / "embedder.onnx"
    onnx.save(_embedder(segments=3), str(path))
    done = cli("build", "--onnx", path, "--device", "cpu", "--precision", "uint8",
               "-o", tmp_path / "o")  # fmt: skip
    assert done.exit_code == 0, done.stderr


def test_image_inputs_are_recognised_from_their_shape() -> None:
    nchw = image_preprocess(["batch", 3, 224, 192])
    assert nchw is not None and (nchw.size, nchw.layout) == ((224, 192), "NCHW")
    nhwc = image_preprocess([1, 64, 64, 3])
    assert nhwc is not None and nhwc.layout == "NHWC"
    assert image_preprocess([1, 3, 8, 8]) is None  # too small to be an image
    assert image_preprocess([1, 3, "H", "W"]) is None  # sides unknown: no resize target
    assert image_preprocess([1, 4, 32, 32]) is None
    graph = helper.make_graph(
        [helper.make_node("Relu", ["pixel_values"], ["y"])],
        "img",
        [helper.make_tensor_value_info("pixel_values", F, ["batch", 3, 32, 32])],
        [helper.make_tensor_value_info("y", F, ["batch", 3, 32, 32])],
    )
    spec = specs_from_model(helper.make_model(graph, ir_version=10))[0][0]
    assert spec.image is not None and spec.image.size == (32, 32)
    low, high = spec.range
    assert low < -2 and high > 2.5  # ImageNet-normalized [0, 1] pixels


def test_masks_are_drawn_as_padding() -> None:
    """All-ones masks left the mask path a range of 0: the quantized model ignored masks."""
    from winml_recipes.onnx.inputs import make_inputs
    from winml_recipes.sdk.contract import TensorSpec

    graph = helper.make_graph(
        [helper.make_node("Cast", ["attention_mask"], ["y"], to=F)],
        "m",
        [helper.make_tensor_value_info("attention_mask", I64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("y", F, ["batch", "sequence"])],
    )
    spec = specs_from_model(helper.make_model(graph, ir_version=10))[0][0]
    assert spec.values == (0, 1)
    masks = [f["attention_mask"] for f in make_inputs([spec], {"batch": 4, "sequence": 16}, 0, 8)]
    rows = np.concatenate(masks)
    assert (rows[:, 0] == 1).all()  # never fully masked
    assert (np.diff(rows, axis=1) <= 0).all()  # ones, then zeros
    assert (rows == 0).any()  # some padding to calibrate the mask path on
    other = TensorSpec("flags", "int64", (2, 8), values=(0, 1))  # not a mask: uniform
    drawn = make_inputs([other], {}, 0, 4)
    assert any((np.diff(f["flags"], axis=1) > 0).any() for f in drawn)


def test_labels_offset_or_clipped_into_a_table_stay_in_its_rows() -> None:
    """SAM's point labels reach a 4-row embedding as `label + 1` (one export) or
    `clamp(label, 0)` (another): drawn within what the table holds, never row 8."""
    table = numpy_helper.from_array(np.zeros((4, 8), np.float32), "point_embed")
    one = numpy_helper.from_array(np.array(1, np.int64), "one")
    zero = numpy_helper.from_array(np.array(0, np.int64), "zero")
    nodes = [
        helper.make_node("Add", ["labels", "one"], ["shifted"]),
        helper.make_node("Gather", ["point_embed", "shifted"], ["a"]),
        helper.make_node("Clip", ["other", "zero"], ["clipped"]),
        helper.make_node("Gather", ["point_embed", "clipped"], ["b"]),
        helper.make_node("Sub", ["third", "one"], ["lowered"]),
        helper.make_node("Gather", ["point_embed", "lowered"], ["c"]),
    ]
    inputs = [helper.make_tensor_value_info(n, I64, [1, 3]) for n in ("labels", "other", "third")]
    outputs = [helper.make_tensor_value_info(n, F, [1, 3, 8]) for n in "abc"]
    graph = helper.make_graph(nodes, "labels", inputs, outputs, [table, one, zero])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert integer_values(model, "labels") == ((-1, 3), None)
    assert integer_values(model, "other") == ((0, 4), None)
    assert integer_values(model, "third") == ((1, 5), None)


def test_sam_prompts_are_placed_as_people_prompt() -> None:
    """Uniform noise gave boxes with x2 < x1 and prompts of padding only; synthetic SAM
    prompts put a foreground click on a grid cell (another per sample), a background click
    or padding, and a box around the click, inside the frame."""
    from winml_recipes.catalog import load_entry
    from winml_recipes.feeds import describe_source, synthetic, take

    contract = load_entry("sam3-tiny").components["prompt_encoder_mask_decoder"].contract
    feeds = take(synthetic(contract, 16, seed=3), 16)
    firsts = set()
    for feed in feeds:
        points, labels, boxes = feed["input_points"], feed["input_labels"], feed["input_boxes"]
        assert labels[0, 0, 0] == 1 and labels[0, 0, 1] in (0, -1)
        x1, y1, x2, y2 = boxes[0, 0]
        assert 0 <= x1 < x2 <= 112 and 0 <= y1 < y2 <= 112
        fx, fy = points[0, 0, 0]
        assert x1 <= fx <= x2 and y1 <= fy <= y2  # the box is around the foreground click
        firsts.add((int(fx // 28), int(fy // 28)))  # its grid cell
    assert len(firsts) == 16  # every cell of the 4x4 grid, once
    assert {int(f["input_labels"][0, 0, 1]) for f in feeds} == {0, -1}
    assert "grid prompts" in describe_source(None, contract, held_out=False)
