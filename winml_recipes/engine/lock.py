"""An exclusive lock per build output directory (two builds of one target never interleave).

filelock (already installed with huggingface_hub) locks with fcntl on POSIX and msvcrt on
Windows; the holder's pid is kept in a file beside the lock, for the waiting message.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from filelock import FileLock, Timeout

from winml_recipes.sdk.errors import BuildLockedError

POLL_SECONDS = 0.2


@contextmanager
def exclusive(
    lock_path: Path,
    guarded: Path,
    *,
    wait_seconds: float,
    on_wait: Callable[[str], None] | None = None,
) -> Iterator[None]:
    """Hold `lock_path` (guarding `guarded`); wait up to `wait_seconds`, then fail clearly."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    holder_file = lock_path.with_name(lock_path.name + ".pid")
    lock = FileLock(str(lock_path))
    deadline = time.monotonic() + wait_seconds
    announced = False
    while True:
        try:
            lock.acquire(timeout=POLL_SECONDS)
            break
        except Timeout:
            holder = _read(holder_file)
            if time.monotonic() >= deadline:
                raise BuildLockedError(
                    f"another build (pid {holder}) is writing this output; wait for it "
                    "to finish or raise --wait",
                    where=str(guarded),
                ) from None
            if not announced and on_wait:
                on_wait(f"waiting for another build (pid {holder}) of {guarded}")
                announced = True
    try:
        holder_file.write_text(str(os.getpid()))
        yield
    finally:
        with suppress(OSError):
            holder_file.unlink()
        lock.release()


def _read(path: Path) -> str:
    try:
        return path.read_text().strip() or "?"
    except OSError:
        return "?"


@contextmanager
def held_folder(parent: Path, prefix: str, sweep: str) -> Iterator[Path]:
    """A new folder `parent/<prefix><random>`, held by a lock file beside it while in use
    and removed on exit. Folders matching `sweep` whose lock is free (their process died
    without removing them) are removed first; one in use is never touched."""
    import shutil
    import uuid

    parent.mkdir(parents=True, exist_ok=True)
    for stale in parent.glob(f"{sweep}.lock"):
        abandoned = FileLock(str(stale))
        try:
            abandoned.acquire(timeout=0)
        except Timeout:
            continue  # in use
        try:
            shutil.rmtree(stale.with_suffix(""), ignore_errors=True)
        finally:
            abandoned.release()
        with suppress(OSError):
            stale.unlink()
    folder = parent / f"{prefix}{uuid.uuid4().hex[:8]}"
    lock = FileLock(str(folder) + ".lock")
    lock.acquire()
    folder.mkdir()
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        lock.release()
        with suppress(OSError):
            Path(str(folder) + ".lock").unlink()
