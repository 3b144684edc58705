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


# A folder of data files with empty ones among them stops at this many, named in one line:
# a folder of 100,000 empty files is refused in a second, never read file by file.
MAX_BAD_FILES = 5


def folder_files(folder: Path, suffixes: set[str], what: str, limit: int, hint: str) -> list[Path]:
    """The files of `folder` whose suffix is one of `suffixes`, sorted by name, each a
    regular file inside it (links are resolved and checked; plain files need one lstat from
    the listing), none larger than `limit` bytes and none empty. Empty files are refused in
    one line naming the first ones (the listing stops at MAX_BAD_FILES)."""
    with os.scandir(folder) as listing:
        entries = sorted(
            (e for e in listing if Path(e.name).suffix.lower() in suffixes), key=lambda e: e.name
        )
    files: list[Path] = []
    empty: list[str] = []
    for entry in entries:
        path = folder / entry.name
        if entry.is_symlink():
            regular_file_inside(folder, entry.name, what)  # refused by where it points
            size = require_size_at_most(path, limit, what, hint)
        else:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError as exc:
                raise PlanError(f"{what}: cannot read {printable(path)}: {exc.strerror}") from None
            if not stat.S_ISREG(info.st_mode):
                raise PlanError(f"{what}: {printable(path)} is not a regular file")
            size = info.st_size
            if size > limit:
                raise PlanError(
                    f"{what}: {printable(path)} is {size:,} bytes, more than the {limit:,} "
                    f"this tool reads; {hint}"
                )
        if size == 0:
            empty.append(entry.name)
            if len(empty) == MAX_BAD_FILES:
                break
        files.append(path)
    if empty:
        more = ", ... (stopped looking at the first five)" if len(empty) == MAX_BAD_FILES else ""
        raise PlanError(
            f"{what}: empty files in {printable(folder)}: {', '.join(map(printable, empty))}"
            f"{more}; a data file cannot be empty: remove them or fix the folder"
        )
    return files
