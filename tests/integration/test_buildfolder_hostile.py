"""A build folder an attacker made (zipped into a bug report, downloaded with its `.failed/`
evidence): `run`, `compare`, `report` and `perf` refuse it in one line (exit 2), or write
only fresh files; nothing outside the folder is written, opened or run.

One real cpu/uint8 build of a small MLP (quantized, with its float reference shipped) is
made once; each test copies it and plants one hostile thing. `BASHRC` stands in for a file
of the user's (~/.bashrc) that a planted link points at.
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import cli, make_mlp_onnx, make_mlp_project
from winml_recipes import api

BASHRC = "export PATH=$HOME/bin:$PATH  # the user's own file\n"
STEPS = "[normalize, quantize, {verify: {min_sqnr_db: 10}}]"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """build/mlp/cpu-uint8 of the MLP project: model.onnx (QDQ) and float-reference/."""
    root = tmp_path_factory.mktemp("hostile-build")
    recipe = make_mlp_project(root / "p", steps=STEPS)
    recipe.write_text(recipe.read_text().replace("precision: fp32}", "precision: uint8}", 1))
    result = api.build(recipe, device="cpu", precision="uint8", output_root=root / "build")
    assert (result.output_dir / "float-reference" / "model" / "model.onnx").is_file()
    return result.output_dir


@pytest.fixture
def folder(built: Path, tmp_path: Path) -> Path:
    """A private copy of the build (tmp_path/builds/mlp/cpu-uint8) to plant things in."""
    copy = tmp_path / "builds" / "mlp" / "cpu-uint8"
    shutil.copytree(built, copy)
    shutil.rmtree(copy / "run", ignore_errors=True)
    return copy


@pytest.fixture
def bashrc(tmp_path: Path) -> Path:
    path = tmp_path / "home" / ".bashrc"
    path.parent.mkdir()
    path.write_text(BASHRC)
    return path


@pytest.fixture
def npz(tmp_path: Path) -> Path:
    path = tmp_path / "x.npz"
    np.savez(path, x=np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4))
    return path


def plant_link(link: Path, target: Path) -> None:
    """A symbolic link, as an archive or a copy brings one; on a host where this user may
    not create one (Windows without developer mode), the attack cannot be planted there."""
    try:
        os.symlink(target, link, target_is_directory=target.is_dir())
    except (NotImplementedError, PermissionError) as exc:  # Windows: WinError 1314
        pytest.skip(f"this host cannot create symbolic links ({exc})")
    except OSError as exc:
        if getattr(exc, "winerror", None) != 1314:  # "a required privilege is not held"
            raise
        pytest.skip(f"this host cannot create symbolic links ({exc})")


def edit_manifest(folder: Path, change) -> None:
    path = folder / "manifest.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def refused(result, *words: str) -> None:
    """Exit 2, one line of stderr (no traceback) holding `words`."""
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2, (result.exit_code, result.stderr, result.stdout)
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for word in words:
        assert word in result.stderr, (word, result.stderr)


# --- nothing written through a link -------------------------------------------------------


def test_run_replaces_a_planted_summary_link_and_leaves_its_target(folder, bashrc, npz):
    (folder / "run").mkdir()
    plant_link(folder / "run" / "summary.json", bashrc)
    plant_link(folder / "run" / "outputs.npz", bashrc)
    done = cli("run", folder, "--npz", npz)
    assert done.exit_code == 0, done.output
    assert bashrc.read_text() == BASHRC
    for name in ("summary.json", "outputs.npz"):
        assert not (folder / "run" / name).is_symlink()
    assert json.loads((folder / "run" / "summary.json").read_text())["build"] == str(folder)
    assert np.load(folder / "run" / "outputs.npz").files  # the real outputs


def test_run_refuses_a_run_folder_that_is_a_link(folder, tmp_path, npz):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    plant_link(folder / "run", elsewhere)
    refused(cli("run", folder, "--npz", npz), "is a link")
    assert list(elsewhere.iterdir()) == []


def test_report_replaces_a_planted_temporary_link(folder, bashrc):
    plant_link(folder / ".report.html.tmp", bashrc)
    (folder / "report.html").unlink(missing_ok=True)
    plant_link(folder / "report.html", bashrc)
    done = cli("report", folder)
    assert done.exit_code == 0, done.output
    assert bashrc.read_text() == BASHRC
    assert not (folder / "report.html").is_symlink()
    assert "<html" in (folder / "report.html").read_text().lower()


def test_report_never_embeds_a_picture_linked_out_of_the_folder(folder, tmp_path):
    """run/summary.json names a picture that is a link to a file of the user's: the
    report (a page people share) must not carry that file's bytes."""
    import base64

    secret = tmp_path / "home" / "private.png"
    secret.parent.mkdir()
    secret.write_bytes(b"\x89PNG\r\n\x1a\n a private picture of the user's")
    _image(folder)  # an image model: its report shows the last run's picture
    (folder / "run").mkdir()
    (folder / "run" / "summary.json").write_text(json.dumps({"picture": "p.png"}))
    plant_link(folder / "run" / "p.png", secret)
    done = cli("report", folder, "--no-layers")
    assert done.exit_code == 0, done.output
    page = (folder / "report.html").read_text()
    assert base64.b64encode(secret.read_bytes()).decode() not in page
    assert "winml-recipes run" in page  # says how to make the picture instead


# --- nothing loaded from outside the folder -------------------------------------------------


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A model outside the build folder (where `../../outside/model` leads from it)."""
    model = tmp_path / "builds" / "outside" / "model" / "model.onnx"
    model.parent.mkdir(parents=True)
    make_mlp_onnx(model, seed=7)
    return model


def _rename_component(data: dict, name: str) -> None:
    data["components"] = {name: data["components"]["model"]}


@pytest.mark.parametrize("name", ["../../outside/model", "ABSOLUTE"])
def test_a_component_named_outside_the_folder_is_refused(folder, outside, npz, name):
    name = str(outside.parent) if name == "ABSOLUTE" else name
    edit_manifest(folder, lambda d: _rename_component(d, name))
    refused(cli("run", folder, "--npz", npz), "components")
    refused(cli("compare", folder, "--component", name, "--device", "cpu"), "components")


def test_a_model_linked_out_of_the_folder_is_refused(folder, outside, npz):
    (folder / "model" / "model.onnx").unlink()
    plant_link(folder / "model" / "model.onnx", outside)
    refused(cli("run", folder, "--npz", npz), "outside the build folder")
    refused(cli("compare", folder, "--device", "cpu"), "outside the build folder")


@pytest.mark.parametrize("where", ["ABSOLUTE", "../../outside/model/model.onnx", "LINK"])
def test_a_reference_outside_the_folder_is_refused(folder, outside, npz, where):
    ref = folder / "float-reference" / "model" / "model.onnx"
    if where == "LINK":
        ref.unlink()
        plant_link(ref, outside)
        path = "float-reference/model/model.onnx"
    else:
        path = str(outside) if where == "ABSOLUTE" else where
    edit_manifest(folder, lambda d: d["components"]["model"]["reference"].update(path=path))
    refused(cli("run", folder, "--npz", npz), "reference.path")
    refused(cli("compare", folder, "--device", "cpu"), "reference.path")


def test_a_context_binary_outside_the_folder_is_refused(folder, tmp_path):
    """An EPContext model whose node names `../../secret.bin` (embed mode 0)."""
    import onnx
    from onnx import TensorProto, helper

    (tmp_path / "builds" / "secret.bin").write_bytes(b"not yours")
    node = helper.make_node(
        "EPContext", ["x"], ["y"], domain="com.microsoft", embed_mode=0,
        ep_cache_context="../../../secret.bin", source="QNN",
    )  # fmt: skip
    graph = helper.make_graph(
        [node], "ctx",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("com.microsoft", 1)])
    onnx.save(model, folder / "model" / "model_ctx.onnx")
    refused(cli("perf", folder, "--ep", "cpu", "--iterations", "1"), "secret.bin", "outside")


def test_perf_refuses_a_component_name_that_would_become_a_path(folder, outside, tmp_path):
    """`../../outside/model` names a real model; perf pasted it into its feed's path."""
    edit_manifest(folder, lambda d: _rename_component(d, "../../outside/model"))
    refused(cli("perf", folder, "--ep", "cpu", "--iterations", "1"), "components")
    assert sorted(p.name for p in outside.parent.iterdir()) == ["model.onnx"]


# --- bounded and checked reads ---------------------------------------------------------------


def test_a_manifest_nested_200000_deep_is_one_line(folder, npz):
    (folder / "manifest.json").write_text("[" * 200_000 + "]" * 200_000)
    refused(cli("run", folder, "--npz", npz), "nested more than")


def test_a_300_mb_manifest_is_refused_before_it_is_read(folder, npz):
    with (folder / "manifest.json").open("r+b") as handle:
        handle.truncate(300 << 20)  # sparse: no 300 MB written
    refused(cli("report", folder), "bytes")


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda d: d.pop("recipe"), "'recipe' is required"),
        (lambda d: d.update(components=[d["components"]["model"]]), "$.components"),
        (lambda d: d["target"].update(device=["npu"]), "$.target.device"),
        (lambda d: d["catalog"].update(components=[]), "$.catalog.components"),
        (lambda d: d["recipe"].update(name="mlp\x1b[2J"), "$.recipe.name"),
    ],
    ids=["no-recipe", "components-list", "device-list", "catalog-components-list", "escape"],
)
def test_a_manifest_off_its_schema_names_the_field(folder, npz, change, says):
    edit_manifest(folder, change)
    done = cli("run", folder, "--npz", npz)
    refused(done, says)
    assert "\x1b" not in done.stderr


def _image(folder: Path, **image) -> None:
    def change(d: dict) -> None:
        spec = d["components"]["model"]["contract"]["inputs"]["x"]
        spec["image"] = {"size": [8, 8], "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]}
        spec["image"].update(image)

    edit_manifest(folder, change)


@pytest.mark.parametrize(
    ("image", "says"),
    [
        ({"size": 5}, "image.size"),
        ({"size": [100_000, 100_000]}, "image.size"),
        ({"size": [0, 8]}, "image.size"),
        ({"mean": "abc"}, "image.mean"),
        ({"mean": [0.5, 0.5]}, "image.mean"),
        ({"std": [0.5, 0.0, 0.5]}, "image.std"),
    ],
    ids=["int", "huge", "zero", "text", "two-means", "zero-std"],
)
def test_bad_preprocessing_values_name_the_field(folder, image, says):
    _image(folder, **image)
    refused(cli("run", folder), says)


def _npy_header(shape: tuple[int, ...]) -> bytes:
    import io

    buffer = io.BytesIO()
    header = {"descr": "<f4", "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(buffer, header)
    return buffer.getvalue()


def test_run_npz_declaring_a_huge_array_is_refused_from_its_header(folder, tmp_path):
    path = tmp_path / "huge.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("x.npy", _npy_header((200_000, 200_000)) + b"\0" * 64)
    refused(cli("run", folder, "--npz", path), "--npz")


def test_run_npz_with_a_large_compressed_member_is_refused_before_allocation(folder, tmp_path):
    """A small file holding a 64 MB member (zeros compress 1000:1): its header shape is not
    the build's input, refused before numpy inflates it."""
    path = tmp_path / "bomb.npz"
    shape = (2048, 2048, 4)
    chunk = b"\0" * (16 << 20)
    with (
        zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive,
        archive.open("x.npy", "w", force_zip64=True) as member,
    ):
        member.write(_npy_header(shape))
        for _ in range(int(np.prod(shape)) * 4 // len(chunk)):
            member.write(chunk)
    assert path.stat().st_size < 1 << 20
    refused(cli("run", folder, "--npz", path), "shape [2048, 2048, 4]")


# --- outputs share no inode -------------------------------------------------------------------


def test_editing_one_build_in_place_changes_no_other_build_nor_the_source(tmp_path):
    """Two builds of the same target (one step cache), and a recipe that ships the source
    unchanged: an `onnx.save` over one build's model leaves the other build, the cache and
    the source as they were, and every manifest hash still matches its file."""
    import onnx

    from winml_recipes.onnx.io import file_sha256

    recipe = make_mlp_project(tmp_path / "p", steps="[verify]")
    source = tmp_path / "p" / "catalog" / "mlp.onnx"
    before = source.read_bytes()
    outs = [
        api.build(recipe, device="cpu", precision="fp32", output_root=tmp_path / f"o{i}")
        for i in range(2)
    ]
    edited, other = (r.output_dir / "model" / "model.onnx" for r in outs)
    kept = other.read_bytes()
    model = onnx.load(edited)
    model.graph.doc_string = "edited in place"
    onnx.save(model, edited)

    assert source.read_bytes() == before
    assert other.read_bytes() == kept
    assert os.stat(edited).st_ino not in {os.stat(other).st_ino, os.stat(source).st_ino}
    manifest = json.loads((outs[1].output_dir / "manifest.json").read_text())
    for record in manifest["components"]["model"]["artifact"]["files"]:
        path = outs[1].output_dir / record["path"]
        assert file_sha256(path) == record["sha256"], path
