"""Image preprocessing as a catalog input's `image:` block says (image folders, datasets)."""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

import numpy as np

from winml_recipes.sdk.contract import TensorSpec


def preprocess_image(path: Path | BinaryIO, spec: TensorSpec) -> np.ndarray:
    """Decode, resize (bilinear), scale to [0, 1], normalize, lay out, add a batch axis.

    `path` is an image file or its bytes (a `datasets` Image column)."""
    from PIL import Image

    assert spec.image is not None
    pre = spec.image
    with Image.open(path) as img:
        rgb = img.convert("RGB").resize((pre.size[1], pre.size[0]), Image.Resampling.BILINEAR)
    x = np.asarray(rgb, dtype=np.float32) / 255.0
    x = (x - np.asarray(pre.mean, np.float32)) / np.asarray(pre.std, np.float32)
    if pre.layout == "NCHW":
        x = x.transpose(2, 0, 1)
    return x[None].astype(np.dtype(spec.dtype))
