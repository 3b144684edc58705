"""An exclusive lock per build output directory (two builds of one target never interleave)."""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from winml_recipes.errors import BuildLockedError


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
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait_seconds
        announced = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
                if time.monotonic() >= deadline:
                    raise BuildLockedError(
                        f"another build (pid {holder}) is writing this output; wait for it "
                        "to finish or raise --wait",
                        where=str(guarded),
                    ) from None
                if not announced and on_wait:
                    on_wait(f"waiting for another build (pid {holder}) of {guarded}")
                    announced = True
                time.sleep(0.2)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)
