"""Run Python code in a fresh interpreter under a memory cap: its JSON line, its peak RSS.

Used by bench/algorithm_memory.py (a `make bench` case) and the one-off measurements in
experiments/ (HTP graph preparation, split compiles).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def capped_python(code: str, *args: str, cap_mb: float | None = None) -> dict:
    """Run `code` in a fresh interpreter (under `cap_mb` of RSS when given); its JSON line,
    or {"stopped": ...} when the watchdog killed it, with the peak RSS it reached."""
    import psutil

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-c", code, *args]
    limit = None
    if cap_mb is not None and sys.platform != "win32":
        # a backstop beside the watchdog: address space, generous (libraries map a lot)
        limit = int((cap_mb + 8192) * 1024 * 1024)
    proc = subprocess.Popen(
        cmd,
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=(lambda: _set_as_limit(limit)) if limit else None,
    )
    watched = psutil.Process(proc.pid)
    peak, stopped = 0.0, None
    started = time.perf_counter()
    while proc.poll() is None:
        try:
            rss = watched.memory_info().rss / 2**20
        except psutil.NoSuchProcess:
            break
        peak = max(peak, rss)
        if cap_mb is not None and rss > cap_mb:
            proc.kill()
            stopped = f"stopped at {rss / 1024:.1f} GB RSS (cap {cap_mb / 1024:.0f} GB)"
            break
        time.sleep(0.2)
    out, err = proc.communicate()
    if stopped:
        return {"stopped": stopped, "seconds": round(time.perf_counter() - started, 1),
                "peak_rss_mb": round(peak)}  # fmt: skip
    if proc.returncode != 0:
        tail = " ".join(err.split())[-400:]
        return {"error": f"exit {proc.returncode}: {tail}", "peak_rss_mb": round(peak),
                "seconds": round(time.perf_counter() - started, 1)}  # fmt: skip
    line = [s for s in out.splitlines() if s.startswith("{")][-1]
    return json.loads(line)


def _set_as_limit(limit: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
