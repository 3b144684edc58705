"""Writes winml_recipes/data/images: the real photographs builds calibrate and verify on.

Source: scikit-image 0.26.0's wheel (PyPI), whose `skimage/data` ships photographs whose
licences its docstrings state (public domain or CC0; each recorded in ATTRIBUTION.yaml).
Calibration and held-out images come from different photographs (no scene in both).
Each photograph gives several square crops (seeded), resized to SIDE px, saved as JPEG.

    python tests/data/make_images.py  # downloads the wheel with pip into a temp folder

`tests/unit/test_bundled_images.py` checks every file against its recorded sha256.
"""

from __future__ import annotations

import io
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import yaml
from PIL import Image

WHEEL = "scikit-image==0.26.0"
SIDE = 384
OUT = Path(__file__).resolve().parents[2] / "winml_recipes" / "data" / "images"
NASA = "NASA, public domain (no known copyright restrictions)"
# file in skimage/data -> (licence as skimage's docstring states it, crops, split)
PHOTOS = {
    "astronaut.png": (f"{NASA}; Eileen Collins, NASA Great Images database", 4, "calibration"),
    "chelsea.png": ("CC0, Stefan van der Walt (the cat Chelsea)", 4, "calibration"),
    "coffee.png": ("CC0, Rachel Michetti; courtesy of Pikolo Espresso Bar", 4, "calibration"),
    "hubble_deep_field.jpg": (f"{NASA}; Hubble deep field", 4, "calibration"),
    "ihc.png": ("no known copyright restrictions; immunohistochemistry stain", 4, "calibration"),
    "camera.png": ("CC0, Lav Varshney (cameraman, grayscale)", 4, "calibration"),
    "rocket.jpg": ("public domain, SpaceX (Falcon 9 launch)", 2, "heldout"),
    "retina.jpg": ("CC0 1.0, Häggström, Mikael (retina fundus)", 2, "heldout"),
    "coins.png": ("no known copyright restrictions; Greek coins, Brooklyn Museum", 2, "heldout"),
    "text.png": ("public domain; text on a photographed sign, grayscale", 2, "heldout"),
}


def _wheel(folder: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(folder), WHEEL],
        check=True,
    )
    return next(folder.glob("scikit_image-*.whl"))


def _crops(image: Image.Image, count: int, rng: np.random.Generator) -> list[Image.Image]:
    rgb = image.convert("RGB")
    w, h = rgb.size
    out = []
    for i in range(count):
        side = int(min(w, h) * (1.0 if i == 0 else rng.uniform(0.55, 0.85)))
        x = int(rng.integers(0, w - side + 1))
        y = int(rng.integers(0, h - side + 1))
        out.append(rgb.crop((x, y, x + side, y + side)).resize((SIDE, SIDE), Image.BICUBIC))
    return out


def main() -> None:
    import hashlib

    rng = np.random.default_rng(2026)
    records = []
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(_wheel(Path(tmp))) as wheel:
        for name, (licence, count, split) in PHOTOS.items():
            photo = Image.open(io.BytesIO(wheel.read(f"skimage/data/{name}")))
            for i, crop in enumerate(_crops(photo, count, rng)):
                target = OUT / split / f"{Path(name).stem}_{i}.jpg"
                target.parent.mkdir(parents=True, exist_ok=True)
                crop.save(target, "JPEG", quality=88)
                records.append(
                    {
                        "file": f"{split}/{target.name}",
                        "source": f"{WHEEL} skimage/data/{name}",
                        "license": licence,
                        "sha256": hashlib.sha256(target.read_bytes()).hexdigest(),
                    }
                )
    header = (
        "# Real photographs bundled for calibration and held-out verification of image\n"
        "# inputs. Written by tests/data/make_images.py; checked by\n"
        "# tests/unit/test_bundled_images.py. Crops of the photographs named by `source`.\n"
    )
    text = yaml.safe_dump({"images": records}, sort_keys=False, allow_unicode=True)
    (OUT / "ATTRIBUTION.yaml").write_text(header + text, encoding="utf-8")


if __name__ == "__main__":
    main()
