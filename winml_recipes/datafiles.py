"""Checks on data files a recipe or the command line names (calibration and evaluation
npz, images, dataset shards), shared by the readers in feeds.py and hfdata.py."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from winml_recipes.sdk.errors import PlanError


def require_regular_file(path: Path, what: str) -> None:
    """Refuse pipes, devices and folders (reading a FIFO blocks forever), with a one-line
    error naming `what` and the path."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise PlanError(f"{what}: cannot read {path}: {exc.strerror}") from None
    if not stat.S_ISREG(mode):
        raise PlanError(f"{what}: {path} is not a regular file")


def regular_file_inside(folder: Path, name: str, what: str) -> Path:
    """`folder/name` if it is a regular file that resolves inside `folder` (a symlink to a
    file elsewhere is refused: the data must be what was given)."""
    path = folder / name
    require_regular_file(path, what)
    if not path.resolve().is_relative_to(folder.resolve()):
        raise PlanError(f"{what}: {path} points outside {folder}; copy the file there instead")
    return path
