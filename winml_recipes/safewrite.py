"""Writing into a folder that came from outside (a build folder read back) without following
a link someone planted there.

Every file is created fresh: a temporary name made with exclusive create (and no-follow where
the OS has it) in the target's folder, written, then renamed over the target with
`os.replace`, which replaces a link itself rather than the file it points to. A target folder
that is a link is refused, and a folder the tool makes is made fresh too. The same code runs
on Windows (no `O_NOFOLLOW` there; the exclusive create still never opens an existing file).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from winml_recipes.sdk.errors import ModelFileError
from winml_recipes.untrusted import printable

_FLAGS = (
    os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
)


def fresh_folder(folder: Path) -> Path:
    """`folder`, made when missing; a folder that is a link (or not a folder) is refused."""
    folder = Path(folder)
    _not_a_link(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        pass
    except OSError as exc:
        raise ModelFileError(f"cannot make the folder: {exc.strerror}", where=str(folder)) from None
    _not_a_link(folder)  # made by someone else between the check and mkdir
    if not folder.is_dir():
        raise ModelFileError(
            "exists and is not a folder; move it away or pass another one", where=str(folder)
        )
    return folder


def _not_a_link(folder: Path) -> None:
    if folder.is_symlink() or _is_junction(folder):
        raise ModelFileError(
            f"{printable(folder.name)} is a link; the tool never writes through a link "
            "(remove it, or pass a real folder)",
            where=printable(folder),
        )


def _is_junction(path: Path) -> bool:
    """A Windows directory junction (a link `is_symlink` does not report before 3.12)."""
    check = getattr(os.path, "isjunction", None)
    return bool(check and check(path))


@contextlib.contextmanager
def open_fresh(path: Path) -> Iterator[BinaryIO]:
    """A binary file object that becomes `path` when the block ends without an error.

    It is created under a random name with exclusive create in `path`'s folder (a link
    planted as `path` or as the temporary name is never opened); `os.replace` then puts it in
    place. On an error the temporary file is removed and `path` is left as it was."""
    path = Path(path)
    folder = path.parent
    _not_a_link(folder)
    tmp = folder / f".{secrets.token_hex(8)}.tmp"
    try:
        fd = os.open(tmp, _FLAGS, 0o644)
    except OSError as exc:
        raise ModelFileError(f"cannot write here: {exc.strerror}", where=str(path)) from None
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_fresh(path: Path, data: bytes | str) -> Path:
    """Write `data` (text: UTF-8) as a fresh `path` (see `open_fresh`)."""
    with open_fresh(path) as handle:
        handle.write(data.encode("utf-8") if isinstance(data, str) else data)
    return Path(path)


def save_fresh(path: Path, save: Callable[[BinaryIO], object]) -> Path:
    """`save(handle)` (np.savez, PIL's Image.save, ...) into a fresh `path`."""
    with open_fresh(path) as handle:
        save(handle)
    return Path(path)
