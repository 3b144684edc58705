"""Sentinel activations (float32-min attention masks): ranges of the other values, widened
by SENTINEL_DEPTH, and constants that take the clamped value."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from winml_recipes.quant.calibrate import (
    SENTINEL_DEPTH,
    CalibrationSettings,
    calibrate,
    replace_sentinel_constants,
)

F = TensorProto.FLOAT
LOW = float(np.finfo(np.float32).min)


def _masked_scores(path: Path) -> Path:
    """scores + Where(mask, 0, finfo.min) -> Softmax, as BERT's eager attention does."""
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["mask"], ["keep"], to=TensorProto.BOOL),
            helper.make_node("Where", ["keep", "zero", "low"], ["bias"]),
            helper.make_node("Add", ["scores", "bias"], ["masked"]),
            helper.make_node("Softmax", ["masked"], ["p"], axis=-1),
        ],
        "attn",
        [
            helper.make_tensor_value_info("scores", F, [1, 8]),
            helper.make_tensor_value_info("mask", TensorProto.INT64, [1, 8]),
        ],
        [helper.make_tensor_value_info("p", F, [1, 8])],
        [
            numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
            numpy_helper.from_array(np.array(LOW, np.float32), "low"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.save(model, str(path))
    return path


def _feeds() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    out = []
    for n in (3, 5, 8):
        mask = (np.arange(8) < n).astype(np.int64)[None]
        out.append({"scores": rng.uniform(-4, 6, (1, 8)).astype(np.float32), "mask": mask})
    return out


def test_sentinels_get_the_range_of_the_other_values(tmp_path: Path) -> None:
    path = _masked_scores(tmp_path / "m.onnx")
    feeds = _feeds()
    sentinels: dict = {}
    ranges = calibrate(path, lambda: iter(feeds), CalibrationSettings(), sentinels=sentinels)
    assert set(sentinels) == {"bias", "masked"}
    assert sentinels["bias"]["observed"][0] == LOW
    assert ranges["bias"] == (-SENTINEL_DEPTH, 0.0)
    unmasked = [f["scores"][f["mask"] == 1] for f in feeds]
    low = min(float(u.min()) for u in unmasked)
    high = max(float(u.max()) for u in unmasked)
    assert ranges["masked"] == (low - SENTINEL_DEPTH, high)  # the scores keep their range
    plain = calibrate(path, lambda: iter(feeds), CalibrationSettings())  # not asked: as seen
    assert plain["masked"][0] == LOW

    model = onnx.load(str(path))
    assert replace_sentinel_constants(model, sentinels) == ["low"]
    low_value = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "low"))
    assert float(low_value) == -SENTINEL_DEPTH
