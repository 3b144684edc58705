"""The float values of chosen tensors on a few calibration samples: one tapped run of the
float model, shared by the precision choices that need a tensor's spread rather than its
calibrated range (narrow_rows.py: LayerNorm rows; selection_keys.py: TopK keys)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import onnx

SAMPLES = 4  # calibration samples the spreads are measured on
MAX_MODEL_BYTES = 1 << 30  # the taps copy the model in memory: larger ones are not measured


def tapped_values(
    model: onnx.ModelProto,
    names: Iterable[str],
    feeds: Callable[[], Iterable[dict[str, np.ndarray]]],
    work_dir: Path,
) -> list[dict[str, np.ndarray]]:
    """Per sample (the first SAMPLES of `feeds()`), the tensors `names` from one run of the
    float model with them made outputs; nothing when there is no name or the model is over
    MAX_MODEL_BYTES."""
    wanted = sorted(set(names))
    if not wanted or model.ByteSize() > MAX_MODEL_BYTES:
        return []
    from winml_recipes.onnx.io import save_model
    from winml_recipes.quant.divergence import _with_outputs
    from winml_recipes.runtime.sessions import run_model

    tapped = onnx.ModelProto()
    tapped.CopyFrom(model)
    path = save_model(_with_outputs(tapped, wanted), work_dir / "calibration-taps" / "model.onnx")
    del tapped
    batch = [feed for _, feed in zip(range(SAMPLES), feeds(), strict=False)]
    return [{name: outputs[name] for name in wanted} for outputs in run_model(path, batch)]
