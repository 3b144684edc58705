"""Copying a file into a build's output without sharing it: never a hard link.

A hard-linked output shares its inode with the step cache, the source model or another
build, so an ordinary `onnx.save` over one of them silently changes the others (and their
manifest hashes no longer match). A copy-on-write clone (a reflink, where the file system
has one: btrfs, XFS on Linux) shares the blocks, not the file; elsewhere (ext4, NTFS,
Windows, macOS) the bytes are copied.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from pathlib import Path

_FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)


def copy_unshared(src: Path, dst: Path) -> None:
    """`src` copied to a new file `dst` (a reflink where possible), never linked to it."""
    if not _reflink(Path(src), Path(dst)):
        shutil.copyfile(src, dst)


def _reflink(src: Path, dst: Path) -> bool:
    """A copy-on-write clone of `src` as `dst` (Linux FICLONE); False when the platform or
    file system has none (then `dst` does not exist)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import fcntl  # POSIX only: absent on Windows
    except ImportError:
        return False
    try:
        target = open(dst, "xb")  # noqa: SIM115 (closed below, before it may be removed)
    except OSError:  # there already (then copyfile replaces it), or not writable
        return False
    try:
        with target, open(src, "rb") as source:
            fcntl.ioctl(target.fileno(), _FICLONE, source.fileno())
        return True
    except OSError:
        pass
    with contextlib.suppress(OSError):
        os.unlink(dst)  # the empty file made above
    return False
