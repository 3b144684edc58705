"""Checks on data files a recipe or the command line names (calibration and evaluation
npz, images, dataset shards), shared by the readers in feeds.py and hfdata.py."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from winml_recipes.sdk.errors import PlanError
from winml_recipes.untrusted import printable


def require_regular_file(path: Path, what: str) -> None:
    """Refuse pipes, devices and folders (reading a FIFO blocks forever), with a one-line
    error naming `what` and the path."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise PlanError(f"{what}: cannot read {printable(path)}: {exc.strerror}") from None
    if not stat.S_ISREG(mode):
        raise PlanError(f"{what}: {printable(path)} is not a regular file")


def regular_file_inside(folder: Path, name: str, what: str) -> Path:
    """`folder/name` if it resolves inside `folder` and is a regular file there (a symlink
    to a file elsewhere is refused, never opened: the data must be what was given).

    Where the link points is checked first, so a link to `/proc/self/environ` or a FIFO
    outside is refused by its path alone."""
    path = folder / name
    try:
        target = path.resolve()
    except (OSError, RuntimeError) as exc:  # a link loop
        raise PlanError(f"{what}: cannot resolve {printable(path)}: {printable(exc)}") from None
    if not target.is_relative_to(folder.resolve()):
        raise PlanError(
            f"{what}: {printable(path)} points outside {printable(folder)}; "
            "copy the file there instead"
        )
    require_regular_file(path, what)
    return path


def require_size_at_most(path: Path, limit: int, what: str, hint: str) -> int:
    """The size of `path`, refused above `limit` bytes (checked before anything is read)."""
    try:
        size = os.stat(path).st_size
    except OSError as exc:
        raise PlanError(f"{what}: cannot read {printable(path)}: {exc.strerror}") from None
    if size > limit:
        raise PlanError(
            f"{what}: {printable(path)} is {size:,} bytes, more than the {limit:,} this tool "
            f"reads; {hint}"
        )
    return size
