"""Calibration and held-out data from Hugging Face `datasets` splits saved with save_to_disk.

`tests/data/hf_split` was written by the real `datasets` library (make_hf_split.py beside
it); the other splits here are written with pyarrow in the same layout, to vary them.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from tests.conftest import cli, make_mlp_onnx
from winml_recipes.hfdata import check_split, open_split, samples
from winml_recipes.sdk.contract import ImagePreprocess, IOContract, TensorSpec
from winml_recipes.sdk.errors import PlanError

SAVED = Path(__file__).parents[1] / "data" / "hf_split"
BUILD = ("build", "--device", "cpu", "--precision", "int8", "--shape", "x=2x4", "--json")


def save_split(folder: Path, table: pa.Table, features: dict | None = None) -> Path:
    """A split in the layout `Dataset.save_to_disk` writes (one Arrow stream file)."""
    folder.mkdir(parents=True)
    path = folder / "data-00000-of-00001.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=5)  # several record batches
    state = {"_data_files": [{"filename": "data-00000-of-00001.arrow"}], "_split": None}
    (folder / "state.json").write_text(json.dumps(state))
    (folder / "dataset_info.json").write_text(json.dumps({"features": features or {}}))
    return folder


def float_rows(n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    x = rng.uniform(100, 200, (n, 8))  # float64: converted to the input's float32
    return pa.table({"x": x.tolist(), "text": [f"row {i}" for i in range(n)]})


def steps(done) -> dict[str, dict]:
    assert done.exit_code == 0, done.stderr
    return {s["pass"]: s for s in json.loads(done.stdout)["components"]["model"]["steps"]}


def test_build_onnx_calibrates_and_verifies_on_saved_splits(tmp_path: Path) -> None:
    """The data lives in [100, 200]: ranges from synthetic [-1, 1] inputs fail on it, so the
    noise build failing verification shows verify read the held-out split."""
    model = make_mlp_onnx(tmp_path / "mlp.onnx")
    done = cli(*BUILD, "--onnx", model, "-o", tmp_path / "o",
               "--calibration-data", f"{SAVED}:train", "--eval-data", f"{SAVED}:test")  # fmt: skip
    got = steps(done)
    quantize, verify = got["quantize"]["metrics"], got["verify"]["metrics"]
    assert quantize["calibration_source"] == f"dataset: {SAVED.resolve()}:train"
    assert quantize["calibration_samples"] == 16  # the train split's rows
    assert verify["data_source"] == f"dataset: {SAVED.resolve()}:test"
    assert verify["data_samples"] == 4  # every row of the test split
    assert verify["outputs"]["y"]["sqnr_db"] > 25
    noise = cli(*BUILD, "--onnx", model, "-o", tmp_path / "n", "--no-cache",
                "--eval-data", f"{SAVED}:test")  # fmt: skip
    # calibrated on synthetic inputs, judged on the test split: the static model misses
    # verify's gates there, so mode auto keeps dynamic quantization, which holds them
    choice = steps(noise)["quantize"]["metrics"]["format_choice"]
    assert any(m.startswith("y: sqnr_db") for m in choice["tried"][0]["missed"]), choice
    assert choice["kept"].startswith("dynamic")


def test_a_recipe_reads_fewer_rows_than_samples(tmp_path: Path) -> None:
    """12 rows where calibration asks for 16: the count shows the rows came from the split;
    the extra `text` column is ignored."""
    model = make_mlp_onnx(tmp_path / "mlp.onnx")
    data = save_split(tmp_path / "calib", float_rows(12, 1))
    held = save_split(tmp_path / "held", float_rows(3, 2))
    got = steps(cli(*BUILD, "--onnx", model, "-o", tmp_path / "o",
                    "--calibration-data", data, "--eval-data", held))  # fmt: skip
    assert got["quantize"]["metrics"]["calibration_samples"] == 12
    assert got["verify"]["metrics"]["data_source"] == f"dataset: {held.resolve()}"


def _refused(tmp_path: Path, data: Path | str) -> str:
    model = make_mlp_onnx(tmp_path / "mlp.onnx")
    done = cli(*BUILD, "--onnx", model, "-o", tmp_path / "o", "--calibration-data", data)
    assert done.exit_code == 2, done.stderr
    assert not (tmp_path / "o").exists()
    return done.stderr


def test_a_datasetdict_needs_a_split(tmp_path: Path) -> None:
    message = _refused(tmp_path, SAVED)
    assert "is a DatasetDict and no split was given" in message
    assert "one of: train, test" in message


def test_a_missing_input_column_is_named(tmp_path: Path) -> None:
    data = save_split(tmp_path / "d", pa.table({"ids": [[1] * 8], "mask": [[1] * 8]}))
    message = _refused(tmp_path, data)
    assert f"{data} has no column 'x'" in message and "its columns: ids, mask" in message


def test_an_arrow_file_linked_from_outside_is_refused(tmp_path: Path) -> None:
    data = save_split(tmp_path / "d", float_rows(4, 0))
    arrow = data / "data-00000-of-00001.arrow"
    elsewhere = tmp_path / "elsewhere.arrow"
    shutil.move(arrow, elsewhere)
    arrow.symlink_to(elsewhere)
    assert "points outside" in _refused(tmp_path, data)


def test_a_state_file_naming_a_path_is_refused(tmp_path: Path) -> None:
    data = save_split(tmp_path / "d", float_rows(4, 0))
    state = {"_data_files": [{"filename": "../d/data-00000-of-00001.arrow"}]}
    (data / "state.json").write_text(json.dumps(state))
    with pytest.raises(PlanError, match=r"not a plain \.arrow file name"):
        open_split(str(data), tmp_path)


def test_a_row_of_the_wrong_size_is_refused(tmp_path: Path) -> None:
    data = save_split(tmp_path / "d", pa.table({"x": [[1.0] * 8, [1.0] * 7]}))
    contract = IOContract((TensorSpec("x", "float32", ("batch", 4)),), (), {"batch": 2})
    split = open_split(str(data), tmp_path)
    assert check_split(split, contract) == 2
    with pytest.raises(PlanError, match=r"row 1 column 'x' has 7 values; .* needs 8"):
        list(samples(split, contract, 2))


def test_floats_are_not_cast_to_token_ids(tmp_path: Path) -> None:
    data = save_split(tmp_path / "d", pa.table({"ids": [[0.5, 1.5]]}))
    contract = IOContract((TensorSpec("ids", "int64", (1, 2)),), (), {})
    with pytest.raises(PlanError, match="holds floats; the input needs int64"):
        list(samples(open_split(str(data), tmp_path), contract, 1))


def test_image_columns_are_preprocessed_like_image_folders() -> None:
    """6x6 images at size 6x6 (no resize), mean 0 and std 1: the input is the pixels / 255,
    channels first; the held-out rows start after `skip`."""
    pre = ImagePreprocess(size=(6, 6), mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
    spec = TensorSpec("image", "float32", (1, 3, 6, 6), image=pre)
    contract = IOContract((spec,), (), {})
    split = open_split(f"{SAVED}:test", Path("."))
    feeds = list(samples(split, contract, 3, skip=1))
    assert len(feeds) == 3
    table = pa.ipc.open_stream(pa.memory_map(str(split.arrow_files[0]))).read_all()
    png = table.column("image")[1].as_py()["bytes"]
    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), np.float32) / 255
    np.testing.assert_allclose(feeds[0]["image"][0], pixels.transpose(2, 0, 1), atol=1e-6)


def test_pyarrow_missing_names_the_extra(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "pyarrow", None)
    split = open_split(f"{SAVED}:train", tmp_path)
    contract = IOContract((TensorSpec("x", "float32", (2, 4)),), (), {})
    with pytest.raises(PlanError, match=r"pip install 'winml-recipes\[datasets\]'"):
        check_split(split, contract)


def test_the_cache_key_follows_the_rows(tmp_path: Path) -> None:
    """Same folder, same file names: rewritten rows calibrate again; unchanged ones do not."""
    model = make_mlp_onnx(tmp_path / "mlp.onnx")
    data = save_split(tmp_path / "d", float_rows(6, 1))
    held = save_split(tmp_path / "h", float_rows(3, 9))

    def quantize_status(out: str) -> str:
        done = cli(*BUILD, "--onnx", model, "-o", tmp_path / out,
                   "--calibration-data", data, "--eval-data", held)  # fmt: skip
        return steps(done)["quantize"]["status"]

    assert quantize_status("a") == "ran"
    assert quantize_status("b") == "cached"
    shutil.rmtree(data)
    save_split(data, float_rows(6, 2))
    assert quantize_status("c") == "ran"


def test_a_recipe_names_splits_relative_to_itself(tmp_path: Path) -> None:
    """`calibration: {dataset: data:train}` and `verify: {dataset: data:test}` beside the
    recipe; held-out metrics on the real split, recorded as such."""
    from winml_recipes import api

    model = make_mlp_onnx(tmp_path / "mlp.onnx")
    project = tmp_path / "p"
    done = cli("init", model, "--name", "m", "--catalog", project / "catalog",
               "--recipes", project / "recipes")  # fmt: skip
    assert done.exit_code == 0, done.stderr
    shutil.copytree(SAVED, project / "recipes" / "data")
    recipe = project / "recipes" / "m.yaml"
    recipe.write_text(
        "schema_version: 1\nname: m\nmodel: m\ntargets: [{device: cpu, precision: int8}]\n"
        "dims: {batch: 2}\nsteps:\n"
        "  - quantize: {calibration: {dataset: 'data:train', samples: 10}}\n"
        "  - verify: {dataset: 'data:test', samples: 4}\n"
    )
    result = api.build(recipe, output_root=tmp_path / "o")
    got = {s["pass"]: s for s in result.manifest["components"]["model"]["steps"]}
    assert got["quantize"]["metrics"]["calibration_source"] == "dataset: data:train"
    assert got["quantize"]["metrics"]["calibration_samples"] == 10
    assert got["verify"]["metrics"]["data_samples"] == 4
    assert got["verify"]["metrics"]["outputs"]["y"]["sqnr_db"] > 25
