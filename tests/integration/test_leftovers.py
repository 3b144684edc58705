"""Older leftovers of issue 36 (item 6): `-o` problems of `run` in one line before any
progress line, a model file named `.hidden.onnx`, `inspect` of a model whose external data
is missing, and a calibration folder of empty image files refused fast."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.conftest import cli, make_mlp_onnx
from tests.integration.test_data_hostile import image_model, png


def _one_error_line(result, code: int = 2) -> str:
    assert result.exit_code == code, (result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert result.stdout == "", result.stdout  # no progress line before it
    return lines[0]


def test_a_model_file_named_dot_hidden_is_built(tmp_path: Path) -> None:
    """The hidden-file rule is for folder scans; a file named on the command line is the
    user's choice (refused before as the entry name `.hidden`)."""
    model = make_mlp_onnx(tmp_path / ".hidden.onnx")
    done = cli("build", "--onnx", model, "--device", "cpu", "--precision", "fp32",
               "--shape", "x=2x4", "-o", tmp_path / "out")  # fmt: skip
    assert done.exit_code == 0, done.stderr
    assert (tmp_path / "out" / "hidden" / "cpu-fp32" / "model" / "model.onnx").is_file()


def test_inspect_of_a_model_whose_external_data_is_missing(tmp_path: Path) -> None:
    model = onnx.load(make_mlp_onnx(tmp_path / "m.onnx"))
    onnx.save(model, tmp_path / "w.onnx", save_as_external_data=True,
              location="w.onnx.data", size_threshold=0)  # fmt: skip
    assert cli("inspect", tmp_path / "w.onnx").exit_code == 0  # whole: described
    (tmp_path / "w.onnx.data").unlink()
    line = _one_error_line(cli("inspect", tmp_path / "w.onnx"))
    assert str(tmp_path / "w.onnx") in line and "'w.onnx.data' is missing" in line, line


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """An MLP built for cpu/fp32 and an npz of its input."""
    root = tmp_path_factory.mktemp("leftover-run")
    model = make_mlp_onnx(root / "m.onnx")
    done = cli("build", "--onnx", model, "--device", "cpu", "--precision", "fp32",
               "--shape", "x=2x4", "-o", root / "out")  # fmt: skip
    assert done.exit_code == 0, done.stderr
    np.savez(root / "in.npz", x=np.ones((2, 4), np.float32))
    return root / "out" / "m" / "cpu-fp32", root / "in.npz"


def test_run_output_that_is_a_file_is_one_line(built, tmp_path: Path) -> None:
    """Before: click's four-line usage error."""
    folder, npz = built
    (tmp_path / "afile").write_text("mine")
    line = _one_error_line(cli("run", folder, "--npz", npz, "-o", tmp_path / "afile"))
    assert "is a file, not a folder" in line, line
    assert (tmp_path / "afile").read_text() == "mine"


def _output_command(command: str, built, out: Path) -> list:
    folder, npz = built
    if command == "run":
        return ["run", folder, "--npz", npz, "-o", out]
    return ["dequantize", folder / "model" / "model.onnx", "-o", out / "d.onnx"]


@pytest.mark.parametrize("command", ["run", "dequantize"])
@pytest.mark.parametrize(
    ("options", "said"),
    [("size=1m", "MB free on its disk"), ("size=1m,ro", "cannot write in")],
    ids=["full", "read-only"],
)
def test_output_on_a_full_or_read_only_disk_is_one_line(
    built, tmp_path: Path, options: str, said: str, command: str
) -> None:
    """Before: a progress line first (run's cost, dequantize's summary), then `No space left
    on device` naming no file. A tmpfs mount, which needs root (root writes through a
    chmod), as test_trust does; a 1 MB disk holds 1 MB - a little, under what either needs."""
    small = tmp_path / "small"
    small.mkdir()
    if options == "size=1m":
        options = "size=64k"  # dequantize needs about 1 MB: leave less
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(small)],
                             capture_output=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here: {mounted.stderr.decode()[:80]}")
    try:
        args = _output_command(command, built, small / "r")
        line = _one_error_line(cli(*args))
        assert said in line and f"-o {args[-1]}" in line, line
        assert os.listdir(small) == []
    finally:
        subprocess.run(["umount", str(small)], check=True)


def test_dequantize_output_that_is_a_folder_is_one_line(built, tmp_path: Path) -> None:
    folder, _ = built
    line = _one_error_line(cli("dequantize", folder / "model" / "model.onnx", "-o", tmp_path))
    assert f"-o {tmp_path}: is a folder; give a file name" in line, line


def _empty_pngs(folder: Path, count: int) -> None:
    folder.mkdir()
    (folder / "000000-good.png").write_bytes(png(20, 20))  # one real photo first
    for i in range(1, count + 1):
        os.close(os.open(folder / f"{i:06d}.png", os.O_CREAT | os.O_WRONLY, 0o644))


def _build_on(tmp_path: Path, folder: Path):
    model = image_model(tmp_path / "img.onnx")
    return cli("build", "--onnx", model, "--device", "cpu", "--precision", "int8",
               "-o", tmp_path / "out", "--calibration-data", folder)  # fmt: skip


def test_empty_image_files_are_refused_up_front(tmp_path: Path) -> None:
    """Before: listed, resolved and hashed one by one, then the first one sampled failed to
    decode after the build had started."""
    folder = tmp_path / "images"
    _empty_pngs(folder, 2000)
    line = _one_error_line(_build_on(tmp_path, folder))
    names = ", ".join(f"{i:06d}.png" for i in range(1, 6))  # the first five, then it stops
    assert f"calibration.images: empty files in {folder}: {names}, ..." in line, line
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # writing 100,000 files takes about 10 s on a busy disk
def test_100000_empty_image_files_fail_in_seconds(tmp_path: Path) -> None:
    """Before: over 60 s (100 s measured) before the first error."""
    folder = tmp_path / "images"
    _empty_pngs(folder, 100_000)
    try:
        start = time.monotonic()
        line = _one_error_line(_build_on(tmp_path, folder))
        seconds = time.monotonic() - start
        assert "calibration.images: empty files in" in line, line
        assert seconds < 10, f"{seconds:.1f} s"
    finally:
        shutil.rmtree(folder, ignore_errors=True)
