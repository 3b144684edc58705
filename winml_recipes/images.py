"""Image preprocessing as a catalog input's `image:` block says (image folders, datasets).

Images come from outside (a data folder, a dataset's Image column, `run --image`): the
encoded size is bounded before anything is read, PIL's own decompression-bomb limit
(`Image.MAX_IMAGE_PIXELS`, checked on the declared size before decoding) is an error rather
than a warning, and a file PIL cannot decode is one line naming it.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from winml_recipes.sdk.contract import TensorSpec
from winml_recipes.untrusted import UntrustedInputError, printable

# A photo is a few MB encoded; 64 MB covers large TIFFs without letting a disk-sized file in.
MAX_IMAGE_BYTES = 64 << 20


def preprocess_image(
    path: Path | BinaryIO, spec: TensorSpec, name: str | Path | None = None
) -> np.ndarray:
    """Decode, resize (bilinear), scale to [0, 1], normalize, lay out, add a batch axis.

    `path` is an image file or its bytes (a `datasets` Image column; the caller bounds
    them); `name` says which in errors (default: the path)."""
    assert spec.image is not None
    label = printable(name if name is not None else path)
    _check_file(path)
    rgb = _decoded(path, (spec.image.size[1], spec.image.size[0]), label)
    pre = spec.image
    x = np.asarray(rgb, dtype=np.float32) / 255.0
    x = (x - np.asarray(pre.mean, np.float32)) / np.asarray(pre.std, np.float32)
    if pre.layout == "NCHW":
        x = x.transpose(2, 0, 1)
    return x[None].astype(np.dtype(spec.dtype))


def load_rgb(path: Path) -> Any:
    """The image file as a PIL RGB image at its own size, within the same limits."""
    _check_file(path)
    return _decoded(path, None, printable(path))


def _check_file(path: Path | BinaryIO) -> None:
    from winml_recipes.datafiles import require_regular_file, require_size_at_most

    if isinstance(path, Path):
        require_regular_file(path, "image")
        require_size_at_most(path, MAX_IMAGE_BYTES, "image", "use a smaller image")


def _decoded(source: Path | BinaryIO, size_wh: tuple[int, int] | None, label: str) -> Any:
    """The image as RGB (at `size_wh`, if given), or one line naming `label`."""
    from PIL import Image

    try:
        with warnings.catch_warnings():
            # PIL warns above MAX_IMAGE_PIXELS and raises above twice that; both refuse here,
            # from the header, before a pixel is decoded.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(source) as img:
                rgb = img.convert("RGB")
                return rgb if size_wh is None else rgb.resize(size_wh, Image.Resampling.BILINEAR)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise UntrustedInputError(
            f"{label}: declares more than {Image.MAX_IMAGE_PIXELS:,} pixels (PIL's "
            "decompression-bomb limit); refused before decoding, use a smaller image"
        ) from None
    except Exception as exc:
        # PIL's decoders fail on a damaged file with OSError, SyntaxError, ValueError,
        # EOFError, struct.error, IndexError, ... depending on the format
        detail = printable(str(exc) or type(exc).__name__)[:200]
        raise UntrustedInputError(
            f"{label}: cannot decode the image ({detail}); replace or remove the file"
        ) from None
