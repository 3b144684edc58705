"""Keep what native EP libraries print out of our stdout (it would corrupt `--json`)."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator


@contextlib.contextmanager
def native_output_captured() -> Iterator[list[str]]:
    """Capture what native code writes to fds 1 and 2 (EP libraries print there directly).

    Yields a list that holds the captured text once the block exits. os.dup/dup2 exist on
    Windows too.
    """
    captured: list[str] = []
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile(mode="w+b") as sink:
        try:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            yield captured
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            sink.seek(0)
            captured.append(sink.read().decode("utf-8", "replace"))
