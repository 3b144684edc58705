"""Hostile data folders, as an attacker hands them to a user: a saved `datasets` split with
lying Arrow offsets, JSON bombs and wrong types in its state files, one Arrow file listed
20,000 times, image folders with links out of the folder, decompression bombs and truncated
images.

Each runs the real CLI in a process of its own and must end with exit 2 (never a signal),
at most 3 lines on stderr naming the file, no traceback, within 60 s and 2 GB. The memory
is the CLI process's own peak, taken by a small launcher that forks it and reads os.wait4:
a child forked from this pytest process would start at pytest's own size (ru_maxrss counts
the pages it shared before exec), and getrusage(RUSAGE_CHILDREN) would count every earlier
child too.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
import subprocess
import sys
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pyarrow as pa
import pytest
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

from tests.conftest import REPO, make_mlp_onnx

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="the process limits are measured with os.wait4 and /proc"
)

SAVED = REPO / "tests" / "data" / "hf_split"
ARROW = "data-00000-of-00001.arrow"
LIMIT_S = 60
LIMIT_KB = 2 << 20  # ru_maxrss is in kB on Linux


@dataclass
class Run:
    code: int  # negative: killed by that signal
    stdout: str
    stderr: str
    seconds: float
    maxrss_kb: int


# Forks the CLI from a fresh, small interpreter and writes "exit-code maxrss-kB" to argv[1].
_LAUNCHER = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.executable, [sys.executable, "-m", "winml_recipes", *sys.argv[2:]])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(f"{os.waitstatus_to_exitcode(status)} {usage.ru_maxrss}")
"""


def run_cli(tmp_path: Path, *args: str | Path) -> Run:
    """`python -m winml_recipes ARGS` in its own process, killed after LIMIT_S."""
    out, err = tmp_path / "cli.stdout", tmp_path / "cli.stderr"
    result = tmp_path / "cli.result"
    result.unlink(missing_ok=True)
    env = {**os.environ, "WINML_RECIPES_CACHE": str(tmp_path / "cache"), "SECRET_TOKEN": CANARY}
    start = time.monotonic()
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-c", _LAUNCHER, str(result), *map(str, args)],
            cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
            start_new_session=True,
        )  # fmt: skip
        timer = threading.Timer(LIMIT_S, lambda: os.killpg(proc.pid, 9))
        timer.start()
        try:
            proc.wait()
        finally:
            timer.cancel()
    # killed at the time limit: the launcher wrote nothing
    code, maxrss = (int(v) for v in result.read_text().split()) if result.exists() else (-9, 0)
    return Run(
        code,
        out.read_text(errors="replace"),
        err.read_text(errors="replace"),
        time.monotonic() - start,
        maxrss,
    )


CANARY = "canary-7f3e9a-not-for-output"


def assert_refused(run: Run, *needles: str) -> None:
    """Exit 2 with one short message holding every needle, within the time and memory."""
    assert run.code >= 0, f"killed by signal {-run.code}: {run.stderr[-2000:]}"
    assert run.seconds < LIMIT_S, f"{run.seconds:.0f} s"
    assert run.maxrss_kb < LIMIT_KB, f"{run.maxrss_kb / 1024:.0f} MB"
    assert run.code == 2, run.stdout[-1000:] + run.stderr[-2000:]
    assert "Traceback" not in run.stderr, run.stderr
    assert len(run.stderr.splitlines()) <= 3, run.stderr
    assert CANARY not in run.stdout + run.stderr
    for needle in needles:
        assert needle in run.stderr, run.stderr


def image_model(path: Path) -> Path:
    """A 1x1 Conv over a [1, 3, 16, 16] input named `image` (an image input to the presets)."""
    w = numpy_helper.from_array(np.full((2, 3, 1, 1), 0.1, np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["image", "w"], ["y"], name="conv")],
        "img",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 16, 16])],
        initializer=[w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, str(path))
    return path


def build_images(tmp_path: Path, data: Path) -> Run:
    """Quantize the image model calibrating on `data` (a split or an image folder)."""
    model = image_model(tmp_path / "img.onnx")
    return run_cli(tmp_path, "build", "--onnx", model, "--device", "cpu", "--precision",
                   "int8", "-o", tmp_path / "out", "--calibration-data", data)  # fmt: skip


def build_x(tmp_path: Path, data: Path) -> Run:
    """Quantize an MLP whose input `x` [2, 4] reads the split's list column `x` (8 floats)."""
    model = make_mlp_onnx(tmp_path / "mlp.onnx")
    return run_cli(tmp_path, "build", "--onnx", model, "--device", "cpu", "--precision",
                   "int8", "--shape", "x=2x4", "-o", tmp_path / "out",
                   "--calibration-data", data)  # fmt: skip


def saved_split(tmp_path: Path) -> Path:
    """The train split `datasets` saved (16 rows: x, label, image), copied to be tampered."""
    folder = tmp_path / "split"
    shutil.copytree(SAVED / "train", folder)
    return folder


def patch_offsets(arrow: Path, column: str, slot: int, value: int) -> None:
    """Overwrite one int32 offset of `column` (the image bytes of an Image column, the list
    offsets of a list column) in the file, as a hand-edited file would carry it."""
    table = pa.ipc.open_stream(pa.memory_map(str(arrow))).read_all()
    array = table.column(column).chunk(0)
    if pa.types.is_struct(array.type):
        array = array.field("bytes")
    offsets = array.buffers()[1].to_pybytes()[: 4 * (len(array) + 1)]
    data = bytearray(arrow.read_bytes())
    at = data.find(offsets)
    assert at >= 0 and data.find(offsets, at + 1) < 0, "the offsets are not unique in the file"
    data[at + 4 * slot : at + 4 * slot + 4] = struct.pack("<i", value)
    arrow.write_bytes(bytes(data))


# --- Arrow splits with lying offsets --------------------------------------------------------


@pytest.mark.parametrize(
    ("slot", "value"),
    [(2, 0x7FFF0000), (16, 1 << 30), (3, -4096)],
    ids=["far-past-the-bytes", "last-past-the-bytes", "negative"],
)
def test_image_bytes_offsets_that_lie(tmp_path: Path, slot: int, value: int) -> None:
    """Before: SIGBUS/SIGSEGV reading image bytes out of the mapped file."""
    split = saved_split(tmp_path)
    patch_offsets(split / ARROW, "image", slot, value)
    assert_refused(build_images(tmp_path, split), f"{split / ARROW} record batch 0",
                   "corrupt")  # fmt: skip


@pytest.mark.parametrize(
    ("slot", "value"), [(16, 1000), (2, 4), (1, 1 << 28)], ids=["past-child", "backwards", "huge"]
)
def test_list_offsets_that_lie(tmp_path: Path, slot: int, value: int) -> None:
    """Before: rows read past the child array (abort, garbage rows or a SystemError)."""
    split = saved_split(tmp_path)
    patch_offsets(split / ARROW, "x", slot, value)
    assert_refused(build_x(tmp_path, split), f"{split / ARROW} record batch 0", "corrupt")


def test_a_truncated_arrow_file(tmp_path: Path) -> None:
    split = saved_split(tmp_path)
    arrow = split / ARROW
    arrow.write_bytes(arrow.read_bytes()[: arrow.stat().st_size // 2])
    assert_refused(build_x(tmp_path, split), str(arrow))


# --- state.json, dataset_info.json, dataset_dict.json -------------------------------------


@pytest.mark.parametrize(
    ("state", "field"),
    [
        ({"_data_files": ARROW}, "'_data_files' is a string"),
        ({"_data_files": {"filename": ARROW}}, "'_data_files' is an object"),
        ({"_data_files": [42]}, "'_data_files'[0] is a number"),
        ({"_data_files": [{"filename": ["a.arrow"]}]}, "'_data_files'[0] is an object"),
        ({"_data_files": [{"filename": "x\x1b[2J.arrow"}]}, "'x\\x1b[2J.arrow'"),
        ([ARROW], "expected a JSON object"),
    ],
    ids=["string", "object", "number", "list-name", "escape-codes", "top-list"],
)
def test_state_files_of_the_wrong_type(tmp_path: Path, state, field: str) -> None:
    """Before: AttributeError tracebacks (exit 1) naming no file."""
    split = saved_split(tmp_path)
    (split / "state.json").write_text(json.dumps(state))
    run = build_x(tmp_path, split)
    assert_refused(run, str(split / "state.json"), field)
    assert "\x1b" not in run.stderr


@pytest.mark.parametrize("name", ["state.json", "dataset_info.json", "dataset_dict.json"])
def test_json_nested_200k_deep(tmp_path: Path, name: str) -> None:
    """Before: RecursionError tracebacks."""
    split = saved_split(tmp_path) if name != "dataset_dict.json" else tmp_path / "dict"
    if name == "dataset_dict.json":
        shutil.copytree(SAVED, split)
    (split / name).write_text('{"splits": ' + "[" * 200_000 + "]" * 200_000 + "}")
    data = f"{split}:train" if name == "dataset_dict.json" else split
    assert_refused(build_x(tmp_path, data), str(split / name), "nested more than")


@pytest.mark.parametrize(
    ("features", "field"),
    [
        (["x", "label", "image"], "'features' is a list"),
        ("Image", "'features' is a string"),
        ({"image": "Image", "x": {}}, "'features'.image is a string"),
    ],
    ids=["list", "string", "column-string"],
)
def test_dataset_info_features_of_the_wrong_type(tmp_path: Path, features, field) -> None:
    """Before: `AttributeError: 'list' object has no attribute 'get'`, no file named."""
    split = saved_split(tmp_path)
    info = json.loads((split / "dataset_info.json").read_text())
    (split / "dataset_info.json").write_text(json.dumps({**info, "features": features}))
    assert_refused(build_images(tmp_path, split), str(split / "dataset_info.json"), field)


def test_dataset_dict_splits_of_the_wrong_type(tmp_path: Path) -> None:
    folder = tmp_path / "dict"
    shutil.copytree(SAVED, folder)
    (folder / "dataset_dict.json").write_text(json.dumps({"splits": {"train": 1}}))
    assert_refused(build_x(tmp_path, f"{folder}:train"), "'splits' is not a list of names")


def test_a_300_mb_state_file_is_not_read(tmp_path: Path) -> None:
    """Before: 1.5 GB to parse it. Refused by its size: the process stays near its baseline
    (~140 MB), far below what reading it would take."""
    split = saved_split(tmp_path)
    state = split / "state.json"
    pad = "a" * (1 << 20)
    with state.open("w") as f:
        f.write('{"_data_files": [{"filename": "' + ARROW + '"}], "pad": "')
        for _ in range(300):
            f.write(pad)
        f.write('"}')
    try:
        run = build_x(tmp_path, split)
    finally:
        state.unlink()
    assert_refused(run, str(state), "more than the 16,777,216")
    assert run.maxrss_kb < 400 << 10, f"{run.maxrss_kb / 1024:.0f} MB"


# --- duplicate data files ---------------------------------------------------------------------


def test_one_arrow_file_listed_20000_times(tmp_path: Path) -> None:
    """Before: the file read 20,000 times over (the calibration data 20,000 copies of it)."""
    split = saved_split(tmp_path)
    state = {"_data_files": [{"filename": ARROW}] * 20_000}
    (split / "state.json").write_text(json.dumps(state))
    run = build_x(tmp_path, split)
    assert_refused(run, "'_data_files'[1] lists", "already listed as")
    assert run.seconds < 20


def test_one_arrow_file_under_two_names(tmp_path: Path) -> None:
    """A link inside the folder (or a hard link) is the same file under another name."""
    split = saved_split(tmp_path)
    os.link(split / ARROW, split / "copy.arrow")
    (split / "alias.arrow").symlink_to(ARROW)
    for other in ("copy.arrow", "alias.arrow"):
        state = {"_data_files": [{"filename": ARROW}, {"filename": other}]}
        (split / "state.json").write_text(json.dumps(state))
        assert_refused(build_x(tmp_path, split), f"lists {other}, the file already listed")


# --- images ------------------------------------------------------------------------------------


def png(width: int, height: int, seed: int = 0) -> bytes:
    """A real PNG of random pixels (hard to compress: truncating it cuts pixel data)."""
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def bomb_png(width: int, height: int) -> bytes:
    """A 100-byte PNG whose header declares `width` x `height` pixels (one zlib stream of
    zeros follows): decoding it would take width * height * 3 bytes."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\0" * 4096, 9)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels)
        + chunk(b"IEND", b"")
    )  # fmt: skip


def image_folder(tmp_path: Path) -> Path:
    """Three good 20x20 photos; the hostile file goes first (`0.*`), so calibration reads it."""
    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(1, 4):
        (folder / f"{i}.png").write_bytes(png(20, 20, i))
    return folder


def test_a_link_to_proc_self_environ(tmp_path: Path) -> None:
    """Before: the link was followed, the process environment (tokens) read and hashed."""
    folder = image_folder(tmp_path)
    (folder / "0.png").symlink_to("/proc/self/environ")
    assert_refused(build_images(tmp_path, folder), f"{folder / '0.png'} points outside")


def test_links_out_of_the_folder(tmp_path: Path) -> None:
    """A good image outside, by absolute and by relative link: refused, not read. A FIFO
    outside would block the process forever if it were opened."""
    folder = image_folder(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "photo.png").write_bytes(png(20, 20, 9))
    os.mkfifo(outside / "pipe")
    for target in (outside / "photo.png", Path("../outside/photo.png"), outside / "pipe"):
        link = folder / "0.png"
        link.unlink(missing_ok=True)
        link.symlink_to(target)
        assert_refused(build_images(tmp_path, folder), f"{link} points outside")


@pytest.mark.parametrize(
    ("size", "needle"),
    [((100_000, 100_000), "declares more than"), ((10_000, 10_000), "declares more than")],
    ids=["10g-pixels-error", "100m-pixels-warning"],
)
def test_decompression_bombs_in_a_folder(tmp_path: Path, size, needle: str) -> None:
    """Above twice PIL's MAX_IMAGE_PIXELS it raises; between once and twice it only warned
    (and decoded 300 MB of pixels): both are one line naming the file."""
    folder = image_folder(tmp_path)
    (folder / "0.png").write_bytes(bomb_png(*size))
    run = build_images(tmp_path, folder)
    assert_refused(run, str(folder / "0.png"), needle)
    assert "DecompressionBomb" not in run.stderr


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (png(64, 64)[:3000], "cannot decode the image"),
        (b"\x89PNG\r\n\x1a\n" + b"\xff" * 64, "cannot decode the image"),
        (b"GIF89a" + b"\0" * 4, "cannot decode the image"),
    ],
    ids=["truncated-png", "garbage-after-signature", "cut-gif"],
)
def test_damaged_images_in_a_folder(tmp_path: Path, content: bytes, needle: str) -> None:
    folder = image_folder(tmp_path)
    (folder / "0.png").write_bytes(content)
    assert_refused(build_images(tmp_path, folder), str(folder / "0.png"), needle)


def test_an_image_file_too_large_to_read(tmp_path: Path) -> None:
    """Refused by its size (sparse: no disk used) before it is hashed or decoded."""
    folder = image_folder(tmp_path)
    with (folder / "0.png").open("wb") as f:
        f.truncate(1 << 30)
    run = build_images(tmp_path, folder)
    assert_refused(run, str(folder / "0.png"), "1,073,741,824 bytes")
    assert run.seconds < 20


def image_split(tmp_path: Path, cell: bytes) -> Path:
    """A split whose Image column's first row holds `cell`, then good photos."""
    folder = tmp_path / "isplit"
    folder.mkdir()
    rows = [{"bytes": cell, "path": None}] + [
        {"bytes": png(8, 8, i), "path": None} for i in range(3)
    ]
    table = pa.table({"image": rows})
    with pa.OSFile(str(folder / ARROW), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": ARROW}]}))
    info = {"features": {"image": {"_type": "Image"}}}
    (folder / "dataset_info.json").write_text(json.dumps(info))
    return folder


@pytest.mark.parametrize(
    ("cell", "needle"),
    [(bomb_png(100_000, 100_000), "declares more than"), (png(64, 64)[:3000], "cannot decode")],
    ids=["bomb", "truncated"],
)
def test_hostile_images_in_a_split(tmp_path: Path, cell: bytes, needle: str) -> None:
    split = image_split(tmp_path, cell)
    assert_refused(build_images(tmp_path, split), f"{split} row 0 column 'image'", needle)
