"""Feeds for calibration and verification: synthetic, .npz, image folders, upstream models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from winml_recipes.feeds import (
    check_npz,
    data_digest,
    feeds_for,
    from_images,
    from_npz,
    from_upstream,
    image_files,
    npz_files,
    preprocess_image,
    synthetic,
    take,
)
from winml_recipes.sdk.contract import ImagePreprocess, IOContract, TensorSpec
from winml_recipes.sdk.errors import PassError, PlanError
from winml_recipes.sdk.types import UpstreamComponent

X = TensorSpec("x", "float32", ("batch", 4), (-1.0, 1.0))
MASK = TensorSpec("mask", "int64", ("batch", 3), values=(0.0, 1.0))
CONTRACT = IOContract((X, MASK), (TensorSpec("y", "float32", ("batch", 3)),), {"batch": 2})


def _images_contract(size=(8, 8), mean=(0.5, 0.4, 0.3), std=(0.5, 0.25, 0.2), layout="NCHW"):
    shape = (1, 3, *size) if layout == "NCHW" else (1, *size, 3)
    image = ImagePreprocess(size=size, mean=mean, std=std, layout=layout)
    pixels = TensorSpec("pixels", "float32", shape, (-1.0, 1.0), image=image)
    scale = TensorSpec("scale", "float32", (1,), (0.0, 2.0))
    return IOContract((pixels, scale), (), {})


# --------------------------------------------------------------------------- synthetic


def test_synthetic_is_seeded_and_follows_the_contract() -> None:
    feeds = take(synthetic(CONTRACT, 5, seed=3), 5)
    assert len(feeds) == 5
    for f in feeds:
        assert f["x"].shape == (2, 4) and f["x"].dtype == np.float32
        assert f["x"].min() >= -1.0 and f["x"].max() < 1.0
        assert f["mask"].dtype == np.int64 and set(np.unique(f["mask"])) <= {0, 1}
    again = take(synthetic(CONTRACT, 5, seed=3), 5)
    assert all(np.array_equal(a["x"], b["x"]) for a, b in zip(feeds, again, strict=True))
    # sample i does not depend on how many samples are asked for
    assert np.array_equal(take(synthetic(CONTRACT, 2, seed=3), 2)[1]["x"], feeds[1]["x"])
    other = take(synthetic(CONTRACT, 1, seed=4), 1)[0]
    assert not np.array_equal(other["x"], feeds[0]["x"])
    assert not np.array_equal(feeds[0]["x"], feeds[1]["x"])


def test_factory_is_reiterable() -> None:
    factory = synthetic(CONTRACT, 3, seed=0)
    first = [f["x"] for f in factory()]
    second = [f["x"] for f in factory()]
    assert len(first) == 3
    assert all(np.array_equal(a, b) for a, b in zip(first, second, strict=True))


def test_take_stops_and_refuses_nothing() -> None:
    assert len(take(synthetic(CONTRACT, 10, seed=0), 4)) == 4
    with pytest.raises(PassError, match="no input samples were produced"):
        take(lambda: iter(()), 3)


# --------------------------------------------------------------------------- npz


def _npz(path: Path, **arrays) -> Path:
    np.savez(path, **arrays)
    return path


def _sample(rng, n: int | None = None) -> dict[str, np.ndarray]:
    lead = () if n is None else (n,)
    return {
        "x": rng.standard_normal((*lead, 2, 4)).astype(np.float32),
        "mask": rng.integers(0, 2, size=(*lead, 2, 3)).astype(np.int64),
    }


def test_npz_one_sample_per_file_and_stacked(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    singles = [_sample(rng) for _ in range(3)]
    for i, s in enumerate(singles):
        _npz(tmp_path / f"a{i}.npz", **s)
    stacked = _sample(rng, 4)
    _npz(tmp_path / "b.npz", **stacked)
    files = npz_files("*.npz", tmp_path)
    assert [f.name for f in files] == ["a0.npz", "a1.npz", "a2.npz", "b.npz"]
    assert check_npz(files, CONTRACT) == 7
    feeds = take(from_npz(files, CONTRACT, 100), 100)
    assert len(feeds) == 7
    expected = [s["x"] for s in singles] + list(stacked["x"])
    for f, want in zip(feeds, expected, strict=True):
        assert f["x"].shape == (2, 4)
        assert np.array_equal(f["x"], want)
    assert np.array_equal(feeds[5]["mask"], stacked["mask"][2])
    # `samples` caps what is read
    assert len(take(from_npz(files, CONTRACT, 5), 100)) == 5
    # relative to the recipe directory, or absolute
    assert npz_files(str(tmp_path / "b.npz"), Path("/nonexistent")) == [tmp_path / "b.npz"]


def test_npz_named_dims_take_any_value(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    data = {
        "x": rng.standard_normal((5, 4)).astype(np.float32),  # batch 5, not the default 2
        "mask": np.zeros((5, 3), np.int64),
    }
    files = [_npz(tmp_path / "d.npz", **data)]
    assert check_npz(files, CONTRACT) == 1
    static = IOContract((TensorSpec("x", "float32", (2, 4)),), (), {})
    with pytest.raises(PlanError, match=r"has shape \[5, 4\], expected float32\[2, 4\]"):
        check_npz([_npz(tmp_path / "s.npz", x=data["x"])], static)


def test_npz_errors_name_the_input_and_the_expected_spec(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    good = _sample(rng)
    missing = _npz(tmp_path / "missing.npz", x=good["x"])
    with pytest.raises(PlanError) as exc:
        check_npz([missing], CONTRACT)
    assert str(exc.value) == (
        "calibration.npz: missing.npz has no input 'mask' (expected int64[2, 3]; it has: x)"
    )
    shape = _npz(tmp_path / "shape.npz", x=np.zeros((2, 5), np.float32), mask=good["mask"])
    with pytest.raises(PlanError) as exc:
        check_npz([shape], CONTRACT)
    assert str(exc.value) == (
        "calibration.npz: shape.npz: input 'x' has shape [2, 5], expected float32[2, 4] "
        "(optionally with a leading sample axis of at most 4096)"
    )
    dtype = _npz(tmp_path / "dtype.npz", x=good["x"].astype(np.float64), mask=good["mask"])
    with pytest.raises(PlanError) as exc:
        check_npz([dtype], CONTRACT)
    assert str(exc.value) == (
        "calibration.npz: dtype.npz: input 'x' is float64, expected float32[2, 4]"
    )
    uneven = _npz(
        tmp_path / "uneven.npz",
        x=np.zeros((3, 2, 4), np.float32),
        mask=np.zeros((2, 2, 3), np.int64),
    )
    with pytest.raises(PlanError, match="inputs have different sample counts"):
        check_npz([uneven], CONTRACT)
    garbage = tmp_path / "garbage.npz"
    garbage.write_text("not a zip")
    with pytest.raises(PlanError, match=r"^calibration\.npz: cannot read .*garbage\.npz"):
        check_npz([garbage], CONTRACT)


def test_npz_glob_matching_nothing(tmp_path: Path) -> None:
    with pytest.raises(PlanError) as exc:
        npz_files("data/*.npz", tmp_path)
    assert str(exc.value) == (
        f"calibration.npz: no file matches 'data/*.npz' (relative to {tmp_path})"
    )


def test_feeds_for_checks_npz_before_reading(tmp_path: Path) -> None:
    _npz(tmp_path / "bad.npz", x=np.zeros((2, 4), np.float64), mask=np.zeros((2, 3), np.int64))
    with pytest.raises(PlanError, match="input 'x' is float64"):
        feeds_for({"npz": "bad.npz"}, CONTRACT, tmp_path, {}, 4, 0)


def test_data_digest_follows_file_content(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    _npz(tmp_path / "a.npz", **_sample(rng))
    first = data_digest({"npz": "*.npz"}, tmp_path)
    assert list(first) == ["a.npz"] and len(first["a.npz"]) == 64
    assert data_digest({"npz": "*.npz"}, tmp_path) == first
    _npz(tmp_path / "a.npz", **_sample(rng))
    assert data_digest({"npz": "*.npz"}, tmp_path) != first
    assert data_digest({"samples": 3}, tmp_path) == {}
    assert data_digest(None, tmp_path) == {}


# --------------------------------------------------------------------------- images


def _png(path: Path, pixels: np.ndarray) -> Path:
    from PIL import Image

    Image.fromarray(pixels.astype(np.uint8), "RGB").save(path)
    return path


def test_preprocess_image_values_and_layout(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    pixels = rng.integers(0, 256, size=(8, 8, 3))
    pixels[2, 5] = (255, 0, 128)
    path = _png(tmp_path / "img.png", pixels)
    contract = _images_contract()
    spec = contract.inputs[0]
    x = preprocess_image(path, spec)
    assert x.shape == (1, 3, 8, 8) and x.dtype == np.float32
    mean, std = np.array([0.5, 0.4, 0.3]), np.array([0.5, 0.25, 0.2])
    # pixel (row 2, column 5): channel c lands at [0, c, 2, 5]
    for c, v in enumerate((255, 0, 128)):
        assert x[0, c, 2, 5] == pytest.approx((v / 255 - mean[c]) / std[c], abs=1e-6)
    expected = ((pixels / 255.0 - mean) / std).transpose(2, 0, 1)[None]
    np.testing.assert_allclose(x, expected, atol=1e-5)

    nhwc = preprocess_image(path, _images_contract(layout="NHWC").inputs[0])
    assert nhwc.shape == (1, 8, 8, 3)
    np.testing.assert_allclose(nhwc, expected.transpose(0, 2, 3, 1), atol=1e-5)


def test_preprocess_image_resizes_to_height_width(tmp_path: Path) -> None:
    flat = np.zeros((20, 30, 3))
    flat[...] = (51, 102, 204)
    path = _png(tmp_path / "flat.png", flat)
    spec = _images_contract(size=(4, 6), mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)).inputs[0]
    x = preprocess_image(path, spec)
    assert x.shape == (1, 3, 4, 6)
    for c, v in enumerate((51, 102, 204)):
        np.testing.assert_allclose(x[0, c], (v / 255 - 0.5) / 0.5, atol=1e-6)


def test_from_images_feeds_the_image_input_and_synthesizes_the_rest(tmp_path: Path) -> None:
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i in range(3):
        _png(folder / f"{i}.png", np.full((8, 8, 3), 40 * i))
    (folder / "notes.txt").write_text("not an image")
    files = image_files("imgs", tmp_path)
    assert [f.name for f in files] == ["0.png", "1.png", "2.png"]
    contract = _images_contract(mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
    feeds = take(from_images(files, contract, 10, seed=0), 10)
    assert len(feeds) == 3
    for i, f in enumerate(feeds):
        np.testing.assert_allclose(f["pixels"], 40 * i / 255, atol=1e-6)
        assert f["scale"].shape == (1,) and 0.0 <= f["scale"][0] < 2.0
    assert len(take(from_images(files, contract, 2, seed=0), 10)) == 2
    assert feeds_for({"images": "imgs"}, contract, tmp_path, {}, 10, 0)().__next__()[
        "pixels"
    ].shape == (1, 3, 8, 8)


def test_image_folder_errors(tmp_path: Path) -> None:
    with pytest.raises(PlanError) as exc:
        image_files("nope", tmp_path)
    assert str(exc.value) == f"calibration.images: folder not found: {tmp_path / 'nope'}"
    (tmp_path / "empty").mkdir()
    with pytest.raises(PlanError) as exc:
        image_files("empty", tmp_path)
    assert str(exc.value) == f"calibration.images: no image files in {tmp_path / 'empty'}"
    _png(tmp_path / "empty" / "a.png", np.zeros((2, 2, 3)))
    with pytest.raises(PlanError, match=r"exactly one input with an 'image' .*\(found 0\)"):
        from_images(image_files("empty", tmp_path), CONTRACT, 1, 0)


# --------------------------------------------------------------------------- upstream


def _upstream_model(path: Path) -> Path:
    """x[batch,4] -> h = 10 * x, and g = x + 1 (an output nobody reads)."""
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "ten"], ["h"]),
            helper.make_node("Add", ["x", "one"], ["g"]),
        ],
        "up",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [
            helper.make_tensor_value_info("h", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("g", TensorProto.FLOAT, ["batch", 4]),
        ],
        [
            numpy_helper.from_array(np.array(10.0, np.float32), "ten"),
            numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.save(model, str(path))
    return path


def _upstream(tmp_path: Path, calibration=None) -> UpstreamComponent:
    up_contract = IOContract(
        (X,), (TensorSpec("h", "float32", ("batch", 4)), TensorSpec("g")), {"batch": 2}
    )
    model = _upstream_model(tmp_path / "up.onnx")
    return UpstreamComponent("encoder", model, "digest", up_contract, calibration)


DOWN = IOContract(
    (TensorSpec("h", "float32", ("batch", 4), (-1.0, 1.0)), TensorSpec("z", "float32", (3,))),
    (),
    {"batch": 2},
)


def test_from_upstream_feeds_its_outputs(tmp_path: Path) -> None:
    up = _upstream(tmp_path)
    feeds = take(feeds_for({"inputs_from": "encoder"}, DOWN, tmp_path, {"encoder": up}, 4, 5), 9)
    assert len(feeds) == 4
    up_inputs = take(synthetic(up.contract, 4, 5), 4)
    for f, upstream_feed in zip(feeds, up_inputs, strict=True):
        assert sorted(f) == ["h", "z"]
        np.testing.assert_allclose(f["h"], 10 * upstream_feed["x"], rtol=1e-6)
        assert f["z"].shape == (3,)
    # the range comes from the upstream model, not from the contract's [-1, 1]
    assert max(np.abs(f["h"]).max() for f in feeds) > 5


def test_from_upstream_uses_the_upstream_calibration_source(tmp_path: Path) -> None:
    data = np.full((3, 2, 4), 0.25, np.float32)
    np.savez(tmp_path / "enc.npz", x=data)
    up = _upstream(tmp_path, calibration={"npz": "enc.npz"})
    feeds = take(feeds_for({"inputs_from": "encoder"}, DOWN, tmp_path, {"encoder": up}, 8, 0), 9)
    assert len(feeds) == 3
    for f in feeds:
        np.testing.assert_allclose(f["h"], 2.5, rtol=1e-6)


def test_from_upstream_errors(tmp_path: Path) -> None:
    up = _upstream(tmp_path)
    unrelated = IOContract((TensorSpec("q", "float32", (2,)),), (), {})
    with pytest.raises(PlanError) as exc:
        from_upstream(up, synthetic(up.contract, 1, 0), unrelated, 1, 0)
    assert str(exc.value) == (
        "inputs_from encoder: none of its outputs (g, h) is an input of this component (q)"
    )
    chained = _upstream(tmp_path, calibration={"inputs_from": "other"})
    with pytest.raises(PlanError, match="chains of inputs_from are not supported"):
        feeds_for({"inputs_from": "encoder"}, DOWN, tmp_path, {"encoder": chained}, 1, 0)


def test_upstream_outputs_are_shared_by_prompts_and_stored_once(tmp_path: Path) -> None:
    """8 samples, 4 per upstream output: 2 upstream runs, each output stored by content;
    a second pass reads the store (the upstream model is gone by then)."""
    up = _upstream(tmp_path)
    store = tmp_path / "store"
    options = {"inputs_from": "encoder", "samples_per_upstream": 4}
    feeds = take(feeds_for(options, DOWN, tmp_path, {"encoder": up}, 8, 5, store), 9)
    assert len(feeds) == 8
    up_inputs = take(synthetic(up.contract, 2, 5), 2)
    for i, f in enumerate(feeds):
        np.testing.assert_allclose(f["h"], 10 * up_inputs[i // 4]["x"], rtol=1e-6)
    assert not np.array_equal(feeds[0]["z"], feeds[1]["z"])  # prompts differ per sample
    stored = sorted(store.rglob("*.npz"))
    assert len(stored) == 2
    up.model.unlink()  # from now on only the store can answer
    again = take(feeds_for(options, DOWN, tmp_path, {"encoder": up}, 8, 5, store), 9)
    assert all(np.array_equal(a["h"], b["h"]) for a, b in zip(feeds, again, strict=True))
    assert sorted(store.rglob("*.npz")) == stored


# --------------------------------------------------------------------------- hostile npz


def _npz_with_member(path: Path, name: str, header: dict, payload: bytes) -> Path:
    """An .npz whose member's .npy header says `header` and whose data is `payload`."""
    import io
    import zipfile

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, header)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}.npy", buf.getvalue() + payload)
    return path


def test_npz_declaring_a_huge_array_is_refused_from_its_header(tmp_path: Path) -> None:
    header = {"descr": "<f4", "fortran_order": False, "shape": (10**6, 10**6)}
    path = _npz_with_member(tmp_path / "bomb.npz", "x", header, b"\0" * 64)
    with pytest.raises(PlanError, match=r"'x' declares 4000000000000 bytes but holds"):
        check_npz([path], CONTRACT)


def test_npz_object_array_is_refused_unloaded(tmp_path: Path) -> None:
    header = {"descr": "|O", "fortran_order": False, "shape": (2, 4)}
    path = _npz_with_member(tmp_path / "obj.npz", "x", header, b"\x80\x04N.")
    with pytest.raises(PlanError, match=r"'x' is an object array \(pickled data is never"):
        check_npz([path], CONTRACT)


def test_npz_sample_axis_and_dynamic_dims_are_bounded(tmp_path: Path) -> None:
    many = {"x": np.zeros((5000, 2, 4), np.float32), "mask": np.zeros((5000, 2, 3), np.int64)}
    _npz(tmp_path / "many.npz", **many)
    with pytest.raises(PlanError, match="leading sample axis of at most 4096"):
        check_npz([tmp_path / "many.npz"], CONTRACT)
    wide = {"x": np.zeros((2000, 4), np.float32), "mask": np.zeros((2000, 3), np.int64)}
    _npz(tmp_path / "wide.npz", **wide)  # batch 2000 where the catalog says 2: 1000x
    with pytest.raises(PlanError, match="has shape \\[2000, 4\\]"):
        check_npz([tmp_path / "wide.npz"], CONTRACT)


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="needs POSIX FIFOs")
def test_pipes_are_refused_as_npz_and_images(tmp_path: Path) -> None:
    import os

    os.mkfifo(tmp_path / "a.npz")
    with pytest.raises(PlanError, match=r"a\.npz is not a regular file"):
        npz_files("*.npz", tmp_path)
    (tmp_path / "imgs").mkdir()
    os.mkfifo(tmp_path / "imgs" / "cat.png")
    with pytest.raises(PlanError, match=r"cat\.png is not a regular file"):
        image_files("imgs", tmp_path)


def test_npz_batch_1_filled_with_more_rows_is_ambiguous(tmp_path: Path) -> None:
    """[batch=1, 32] and an (8, 32) array: 8 samples without their batch axis, or one
    batch of 8? It used to pass planning, then fail on npu and calibrate one batch-8 sample
    on cpu; now it asks."""
    contract = IOContract((TensorSpec("ids", "int64", ("batch", 32), (0, 100)),), (), {"batch": 1})
    flat = _npz(tmp_path / "flat.npz", ids=np.zeros((8, 32), np.int64))
    with pytest.raises(PlanError) as err:
        check_npz([flat], contract)
    assert "one sample of batch 8, or 8 samples? Stack samples on a new leading axis" in str(
        err.value
    )
    stacked = _npz(tmp_path / "stacked.npz", ids=np.zeros((8, 1, 32), np.int64))
    assert check_npz([stacked], contract) == 8
