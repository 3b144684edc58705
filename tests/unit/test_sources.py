"""winml_recipes.sources.classify: one classifier for every model reference (no network)."""

from __future__ import annotations

from pathlib import Path

import pytest

from winml_recipes.sdk.errors import SourceError
from winml_recipes.sources import (
    CatalogName,
    HfModelId,
    HubOnnx,
    LocalHfDir,
    LocalOnnx,
    classify,
    is_onnx_name,
)

BASE = Path("/work/base")


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ("./model.onnx", LocalOnnx(BASE / "model.onnx")),
        ("./sub/Model.ONNX", LocalOnnx(BASE / "sub" / "Model.ONNX")),
        ("../up/model.onnx", LocalOnnx(BASE.parent / "up" / "model.onnx")),
        ("/abs/dir/model.onnx", LocalOnnx(Path("/abs/dir/model.onnx"))),
        ("./hf-checkpoint", LocalHfDir(BASE / "hf-checkpoint")),
        ("/abs/hf-checkpoint", LocalHfDir(Path("/abs/hf-checkpoint"))),
        (".", LocalHfDir(BASE)),
        ("..", LocalHfDir(BASE.parent)),
    ],
)
def test_local_paths(ref: str, expected) -> None:
    assert classify(ref, base=BASE) == expected


def test_home_path_is_expanded() -> None:
    got = classify("~/models/m.onnx", base=BASE)
    assert got == LocalOnnx(Path.home().resolve() / "models" / "m.onnx")


@pytest.mark.parametrize("ref", ["C:\\models\\m.onnx", "C:/models/m.onnx", "d:\\m.onnx"])
def test_windows_drive_paths_are_local_onnx(ref: str) -> None:
    got = classify(ref, base=BASE)
    assert isinstance(got, LocalOnnx)
    assert is_onnx_name(got.path.name)


@pytest.mark.parametrize("ref", [".\\m.onnx", "..\\m.onnx"])
def test_windows_relative_prefixes_are_local(ref: str) -> None:
    assert isinstance(classify(ref, base=BASE), LocalOnnx)


def test_existing_bare_name_is_local(tmp_path: Path) -> None:
    (tmp_path / "model.onnx").write_bytes(b"x")
    (tmp_path / "checkpoint").mkdir()
    assert classify("model.onnx", base=tmp_path) == LocalOnnx(tmp_path / "model.onnx")
    assert classify("checkpoint", base=tmp_path) == LocalHfDir(tmp_path / "checkpoint")


def test_existing_file_without_onnx_suffix_is_local_onnx(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"x")
    assert classify("./weights.bin", base=tmp_path) == LocalOnnx(tmp_path / "weights.bin")


def test_relative_paths_resolve_against_base_not_cwd(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert classify("./m.onnx", base=BASE) == LocalOnnx(BASE / "m.onnx")
    assert classify("./m.onnx") == LocalOnnx(tmp_path.resolve() / "m.onnx")


@pytest.mark.parametrize(
    ("ref", "repo", "filename", "revision"),
    [
        (
            "onnx-community/sam3-tracker-ONNX/onnx/vision_encoder_int8.onnx",
            "onnx-community/sam3-tracker-ONNX",
            "onnx/vision_encoder_int8.onnx",
            None,
        ),
        ("org/repo/model.onnx", "org/repo", "model.onnx", None),
        ("org/repo/onnx/Model.ONNX", "org/repo", "onnx/Model.ONNX", None),
        ("org/repo/a/b/m.Onnx", "org/repo", "a/b/m.Onnx", None),
        ("org/repo@v1.2/onnx/m.onnx", "org/repo", "onnx/m.onnx", "v1.2"),
        ("org/repo@0123abcd/m.onnx", "org/repo", "m.onnx", "0123abcd"),
        ("org/repo/onnx\\m.onnx", "org/repo", "onnx/m.onnx", None),
    ],
)
def test_hub_onnx(ref: str, repo: str, filename: str, revision: str | None) -> None:
    got = classify(ref, base=BASE)
    assert got == HubOnnx(repo, filename, revision)
    assert str(got) == (f"{repo}@{revision}/{filename}" if revision else f"{repo}/{filename}")


def test_hub_onnx_revision_argument() -> None:
    assert classify("org/repo/m.onnx", revision="main", base=BASE) == HubOnnx(
        "org/repo", "m.onnx", "main"
    )
    # the same revision twice is fine
    assert classify("org/repo@main/m.onnx", revision="main", base=BASE).revision == "main"


def test_hub_onnx_conflicting_revisions() -> None:
    with pytest.raises(SourceError) as exc:
        classify("org/repo@v1/m.onnx", revision="v2", base=BASE)
    assert str(exc.value) == "'org/repo@v1/m.onnx' names revision 'v1' but revision is 'v2'"


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ("facebook/sam3", HfModelId("facebook/sam3", None)),
        ("google-bert/bert-base-uncased", HfModelId("google-bert/bert-base-uncased", None)),
        ("org/model@refs-pr-1", HfModelId("org/model", "refs-pr-1")),
        ("org/model.v2", HfModelId("org/model.v2", None)),
    ],
)
def test_hf_model_id(ref: str, expected: HfModelId) -> None:
    assert classify(ref, base=BASE) == expected


def test_hf_model_id_with_revision_argument() -> None:
    assert classify("org/model", revision="abc", base=BASE) == HfModelId("org/model", "abc")


@pytest.mark.parametrize("ref", ["sam3", "sam3-tiny", "bert.base"])
def test_catalog_name(ref: str) -> None:
    assert classify(ref, base=BASE) == CatalogName(ref)


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("", "empty model reference"),
        ("   ", "empty model reference"),
        (
            "org/repo/a/../m.onnx",
            "invalid path inside Hub ref 'org/repo/a/../m.onnx': empty, '.' or '..' segment",
        ),
        (
            "org/repo/../m.onnx",
            "invalid path inside Hub ref 'org/repo/../m.onnx': empty, '.' or '..' segment",
        ),
        (
            "org/repo//m.onnx",
            "invalid path inside Hub ref 'org/repo//m.onnx': empty, '.' or '..' segment",
        ),
        (
            "org/repo/./m.onnx",
            "invalid path inside Hub ref 'org/repo/./m.onnx': empty, '.' or '..' segment",
        ),
        (
            "org/repo/onnx/",
            "invalid path inside Hub ref 'org/repo/onnx/': empty, '.' or '..' segment",
        ),
        ("org/..", "invalid Hub repo id in 'org/..'; expected org/repo[/path.onnx]"),
        ("org//m.onnx", "invalid Hub repo id in 'org//m.onnx'; expected org/repo[/path.onnx]"),
        ("-org/repo", "invalid Hub repo id in '-org/repo'; expected org/repo[/path.onnx]"),
        ("org/re po", "invalid Hub repo id in 'org/re po'; expected org/repo[/path.onnx]"),
        (
            "https://huggingface.co/org/repo",
            "invalid Hub repo id in 'https://huggingface.co/org/repo'; "
            "expected org/repo[/path.onnx]",
        ),
        ("org/repo@/m.onnx", "empty revision after '@' in 'org/repo@/m.onnx'"),
        (
            "org/repo/weights.bin",
            "'org/repo/weights.bin' is neither a local path nor a Hub .onnx file; "
            "for a local path start it with ./ or use an absolute path",
        ),
        (
            "models/encoder.onnx",
            "'models/encoder.onnx' is not a file (relative to /work/base) and not a Hub ONNX "
            "file (org/repo/path.onnx); for a local path start it with ./",
        ),
    ],
)
def test_rejected(ref: str, message: str) -> None:
    with pytest.raises(SourceError) as exc:
        classify(ref, base=BASE)
    assert str(exc.value) == message
    assert exc.value.exit_code == 2


def test_existing_relative_onnx_with_slash_is_local(tmp_path: Path) -> None:
    """`models/encoder.onnx` is a local file when it exists, a clear error when it does not."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "encoder.onnx").write_bytes(b"x")
    assert classify("models/encoder.onnx", base=tmp_path) == LocalOnnx(
        tmp_path / "models" / "encoder.onnx"
    )


@pytest.mark.parametrize(
    ("name", "expected"),
    [("m.onnx", True), ("M.ONNX", True), ("m.OnNx", True), ("m.onnx_data", False), ("onnx", False)],
)
def test_is_onnx_name(name: str, expected: bool) -> None:
    assert is_onnx_name(name) is expected
