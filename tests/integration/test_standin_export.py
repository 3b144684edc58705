"""bench/sam3_full.py's stand-in, exported by a plain `torch.onnx.export(dynamo=True)` script
(not this tool's exporter) at sam3-tiny's config: laid out as onnx-community publishes it,
and the same model as the tool's own sam3-tiny export (same seeded weights, another graph)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_dynamo_script_standin_matches_the_tools_export(tmp_path) -> None:
    sys.path.insert(0, str(REPO / "bench"))
    import sam3_full

    from winml_recipes import api

    sam3_full.make_standin(tmp_path, exporter="dynamo", size="tiny")
    files = sorted(p.name for p in (tmp_path / "onnx").iterdir())
    assert files == [
        "prompt_encoder_mask_decoder.onnx", "prompt_encoder_mask_decoder.onnx_data",
        "prompt_encoder_mask_decoder_int8.onnx", "vision_encoder.onnx",
        "vision_encoder.onnx_data", "vision_encoder_int8.onnx",
    ]  # fmt: skip
    ours = api.build(REPO / "recipes" / "sam3-tiny.yaml", device="cpu", precision="fp32",
                     output_root=tmp_path / "out")  # fmt: skip
    theirs = tmp_path / "onnx" / "vision_encoder.onnx"
    x = np.random.default_rng(0).uniform(-1, 1, (1, 3, 112, 112)).astype(np.float32)
    a = ort.InferenceSession(str(theirs)).run(None, {"pixel_values": x})
    b = ort.InferenceSession(str(ours.models["vision_encoder"])).run(None, {"pixel_values": x})
    assert [v.shape for v in a] == [(1, 4, 32, 32), (1, 8, 16, 16), (1, 32, 8, 8)]
    for got, want in zip(a, b, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        assert np.abs(want).max() > 1e-2  # not all zeros
    decoder = ort.InferenceSession(str(tmp_path / "onnx" / "prompt_encoder_mask_decoder.onnx"))
    feeds = {
        "input_points": np.array([[[[30.0, 40.0], [60.0, 50.0]]]], np.float32),
        "input_labels": np.array([[[1, -1]]], np.int64),
        "input_boxes": np.array([[[10.0, 20.0, 80.0, 90.0]]], np.float32),
        **dict(zip([f"image_embeddings.{i}" for i in range(3)], a, strict=True)),
    }
    theirs_out = decoder.run(None, feeds)
    ours_out = ort.InferenceSession(str(ours.models["prompt_encoder_mask_decoder"])).run(
        None, feeds
    )
    np.testing.assert_allclose(theirs_out[1], ours_out[1], rtol=1e-3, atol=1e-3)  # pred_masks
