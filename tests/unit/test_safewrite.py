"""Files written into a folder from outside are created fresh (safewrite.py), and outputs are
copies that share no inode with what they were copied from (copyfile.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from winml_recipes.copyfile import copy_unshared
from winml_recipes.safewrite import fresh_folder, open_fresh, write_fresh
from winml_recipes.sdk.errors import ModelFileError


def _link(link: Path, target: Path) -> None:
    try:
        os.symlink(target, link, target_is_directory=target.is_dir())
    except (NotImplementedError, PermissionError) as exc:
        pytest.skip(f"this host cannot create symbolic links ({exc})")
    except OSError as exc:
        if getattr(exc, "winerror", None) != 1314:
            raise
        pytest.skip(f"this host cannot create symbolic links ({exc})")


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = write_fresh(tmp_path / "summary.json", "old\n")
    with pytest.raises(RuntimeError), open_fresh(target) as handle:
        handle.write(b"half of the new")
        raise RuntimeError("the writer failed")
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


def test_a_planted_link_is_replaced_not_written_through(tmp_path: Path) -> None:
    mine = tmp_path / "bashrc"
    mine.write_text("mine\n")
    (tmp_path / "run").mkdir()
    _link(tmp_path / "run" / "summary.json", mine)
    write_fresh(tmp_path / "run" / "summary.json", "summary\n")
    assert mine.read_text() == "mine\n"
    assert not (tmp_path / "run" / "summary.json").is_symlink()
    assert (tmp_path / "run" / "summary.json").read_text() == "summary\n"


def test_a_folder_that_is_a_link_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    _link(tmp_path / "run", tmp_path / "elsewhere")
    with pytest.raises(ModelFileError, match="is a link"):
        fresh_folder(tmp_path / "run")
    with pytest.raises(ModelFileError, match="is a link"):
        write_fresh(tmp_path / "run" / "outputs.npz", b"x")
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_a_copy_shares_no_inode(tmp_path: Path) -> None:
    src = tmp_path / "model.onnx"
    src.write_bytes(b"\x08\x07" * 1000)
    copy_unshared(src, tmp_path / "copy.onnx")
    assert (tmp_path / "copy.onnx").read_bytes() == src.read_bytes()
    assert os.stat(src).st_nlink == 1
    with (tmp_path / "copy.onnx").open("r+b") as handle:  # an edit in place
        handle.write(b"edited")
    assert src.read_bytes() == b"\x08\x07" * 1000
