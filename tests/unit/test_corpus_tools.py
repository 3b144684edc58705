"""The corpus's own machinery, without models: the wheel fetch and the task metrics."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest

from tests.corpus import fetch, metrics
from winml_recipes.metrics.text import CharacterAgreement


def _wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


@pytest.mark.parametrize("name", ["../evil.onnx", "/abs/evil.onnx", "pkg/../../evil.onnx",
                                  "C:/evil.onnx", "pkg\\..\\evil.onnx"])  # fmt: skip
def test_extract_refuses_path_traversal(tmp_path: Path, name: str) -> None:
    wheel = _wheel(tmp_path / "w.whl", {name: b"x"})
    with pytest.raises(RuntimeError, match="path traversal"):
        fetch.extract(wheel, (name,), tmp_path / "out")
    assert not (tmp_path / "evil.onnx").exists()


def test_extract_only_named_members_and_keeps_complete_files(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path / "w.whl", {"pkg/m.onnx": b"model", "pkg/code.py": b"print()"})
    out = fetch.extract(wheel, ("pkg/m.onnx",), tmp_path / "out")
    assert out["pkg/m.onnx"].read_bytes() == b"model"
    assert not (tmp_path / "out" / "pkg" / "code.py").exists()
    stamp = out["pkg/m.onnx"].stat().st_mtime_ns
    fetch.extract(wheel, ("pkg/m.onnx",), tmp_path / "out")
    assert out["pkg/m.onnx"].stat().st_mtime_ns == stamp  # not rewritten


def test_cached_fetch_downloads_nothing(tmp_path: Path, monkeypatch) -> None:
    """A fetched wheel's files are served from the cache: pip is not run again."""
    wheel = fetch.WHEELS["facenet-pytorch"]
    root = tmp_path / "corpus"
    first = fetch.fetch(wheel.project, root)  # downloads (the pinned 1.9 MB wheel)
    assert {p.name for p in first.values()} == {"pnet.pt", "onet.pt"}

    def no_pip(*args, **kwargs):
        raise AssertionError("a cached fetch ran pip")

    monkeypatch.setattr(fetch.subprocess, "run", no_pip)
    assert fetch.fetch(wheel.project, root) == first
    (root / "files" / f"{wheel.project}-{wheel.version}" / ".complete").unlink()
    assert fetch.fetch(wheel.project, root) == first  # re-extracted from the cached wheel


def test_corpus_dir_follows_the_environment(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv(fetch.CORPUS_ENV, str(tmp_path))
    assert fetch.corpus_dir() == tmp_path
    monkeypatch.delenv(fetch.CORPUS_ENV)
    assert fetch.corpus_dir().parts[-2:] == ("winml-recipes", "corpus") or (
        fetch.corpus_dir().parts[-3:] == ("winml-recipes", "Cache", "corpus")
    )


def test_character_agreement_and_mask_iou() -> None:
    def logits(ids):
        x = np.zeros((len(ids), 5))
        x[np.arange(len(ids)), ids] = 1
        return {"y": x[None]}  # [1, T, classes]

    chars = metrics.plugin(CharacterAgreement(), "character_agreement")
    want = logits([1, 1, 0, 2, 0, 3])  # reads 1 2 3
    assert chars([want], [want]) == 1.0
    assert chars([want], [logits([1, 1, 0, 2, 0, 4])]) == pytest.approx(2 / 3)
    a = {"m": np.array([0.9, 0.9, 0.1, 0.1])}
    b = {"m": np.array([0.9, 0.1, 0.9, 0.1])}
    assert metrics.mask_iou("m", 0.5)([a], [b]) == pytest.approx(1 / 3)
    assert metrics.within("m", 0.1)([a], [b]) == pytest.approx(0.5)
