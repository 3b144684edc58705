"""The real photographs shipped with the package (winml_recipes/data/images).

Image inputs without data of the user's calibrate on the `calibration` set and verify on
the `heldout` set (other photographs: no scene in both). Every file is checked against
the sha256 that ATTRIBUTION.yaml records (with its source and licence) before use.
"""

from __future__ import annotations

import functools
import hashlib
from importlib import resources
from pathlib import Path

import yaml

from winml_recipes.datafiles import require_regular_file
from winml_recipes.sdk.errors import InternalError

SPLITS = ("calibration", "heldout")


def images_dir() -> Path:
    return Path(str(resources.files("winml_recipes.data") / "images"))


@functools.cache
def attribution() -> tuple[dict[str, str], ...]:
    """Every bundled image's record: file, source, license, sha256."""
    text = (images_dir() / "ATTRIBUTION.yaml").read_text(encoding="utf-8")
    return tuple(yaml.safe_load(text)["images"])


@functools.cache
def bundle_digest() -> str:
    """The bundle's identity: the sha256 of its ATTRIBUTION.yaml (which holds every file's)."""
    return hashlib.sha256((images_dir() / "ATTRIBUTION.yaml").read_bytes()).hexdigest()


@functools.cache
def bundled_images(split: str) -> tuple[Path, ...]:
    """The checked image files of `split` (calibration or heldout), in a stable order."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
    root = images_dir()
    out = []
    for record in attribution():
        if not record["file"].startswith(f"{split}/"):
            continue
        path = root / record["file"]
        require_regular_file(path, "bundled images")
        if hashlib.sha256(path.read_bytes()).hexdigest() != record["sha256"]:
            raise InternalError(
                f"bundled image {record['file']} does not match its recorded sha256; "
                "reinstall winml-recipes"
            )
        out.append(path)
    return tuple(out)
