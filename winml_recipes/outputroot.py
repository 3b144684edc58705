"""The output root (`-o`) checked before any step runs: a folder (or one that can be made),
writable, with room. A build that fails after minutes of steps on `.staging-...: Not a
directory` or `No space left on device` should have failed in the first second."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from winml_recipes.sdk.errors import RecipeError
from winml_recipes.untrusted import printable

MIN_FREE_BYTES = 256 * 2**20  # a build writes its models, the staging copy and the report


def check_output_root(
    root: Path | str,
    need_bytes: int = 0,
    *,
    least_bytes: int = MIN_FREE_BYTES,
    label: str = "-o",
) -> None:
    """Refuse, in one line, an output root that is a file (or under one), that cannot be
    written, or whose disk has less than max(least_bytes, need_bytes) free. Nothing is
    created: the probe is a temporary file in the nearest folder that exists. `label`
    names the folder in the error (the flag that gave it)."""
    root = Path(root)
    shown = f"{label} {printable(root)}"
    if root.exists() and not root.is_dir():
        raise RecipeError(f"{shown}: is a file, not a folder; give a folder")
    existing = root
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        raise RecipeError(
            f"{shown}: {printable(existing)} is a file, so no folder can be made under it; "
            "give another folder"
        )
    try:
        fd, probe = tempfile.mkstemp(prefix=".winml-write-probe-", dir=existing)
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(probe)
    except OSError as exc:
        raise RecipeError(
            f"{shown}: cannot write in {printable(existing)} ({exc.strerror}); give a "
            "writable folder"
        ) from None
    free = shutil.disk_usage(existing).free
    need = max(least_bytes, need_bytes)
    if free < need:
        raise RecipeError(
            f"{shown}: {free / 2**20:,.0f} MB free on its disk, this needs about "
            f"{need / 2**20:,.0f} MB; free space or give a folder on another disk"
        )


def check_output_file(path: Path | str, need_bytes: int, label: str = "-o") -> None:
    """Refuse, in one line, an output file that is a folder, or whose folder is a file,
    cannot be written, or has less than `need_bytes` free (the checks of check_output_root
    on the folder it goes in)."""
    path = Path(path)
    if path.is_dir():
        raise RecipeError(f"{label} {printable(path)}: is a folder; give a file name")
    check_output_root(
        path.parent, least_bytes=need_bytes, label=f"{label} {printable(path)}: its folder"
    )
