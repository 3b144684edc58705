"""The bundled photographs: every file is listed with its source and licence and matches
its recorded sha256; calibration and held-out sets share no photograph."""

from __future__ import annotations

import hashlib

from PIL import Image

from winml_recipes.bundled import attribution, bundled_images, images_dir

FREE = ("public domain", "CC0", "no known copyright restrictions")


def test_every_file_is_listed_licensed_and_matches_its_sha256() -> None:
    root = images_dir()
    listed = {r["file"] for r in attribution()}
    on_disk = {p.relative_to(root).as_posix() for p in root.rglob("*.jpg")}
    assert listed == on_disk
    for record in attribution():
        assert any(word.lower() in record["license"].lower() for word in FREE), record
        assert record["source"].startswith("scikit-image==0.26.0 skimage/data/")
        data = (root / record["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == record["sha256"], record["file"]


def test_calibration_and_held_out_sets_are_other_photographs() -> None:
    calibration, held_out = bundled_images("calibration"), bundled_images("heldout")
    assert len(calibration) >= 16 and len(held_out) >= 8
    sources = {r["file"]: r["source"] for r in attribution()}
    cal_sources = {sources[f"calibration/{p.name}"] for p in calibration}
    held_sources = {sources[f"heldout/{p.name}"] for p in held_out}
    assert cal_sources.isdisjoint(held_sources)
    assert len(cal_sources) >= 6  # varied scenes, not crops of one photograph
    for path in (*calibration, *held_out):
        with Image.open(path) as image:
            assert image.mode == "RGB" and min(image.size) >= 256
