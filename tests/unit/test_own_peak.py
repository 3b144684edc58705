"""A child process's own peak RSS (what a split compile's part reports) is not its parent's:
getrusage's ru_maxrss carries the parent's peak across the spawn on Linux."""

from __future__ import annotations

import subprocess
import sys

import numpy as np


def test_a_child_reports_its_own_peak_not_its_parents() -> None:
    held = np.ones(300 * 2**20 // 8)  # 300 MB resident in this (parent) process
    code = "from winml_recipes.runtime.memory import own_peak_rss_mb; print(own_peak_rss_mb())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert float(out.stdout) < 250, out.stdout  # the interpreter alone: tens of MB
    assert held.sum() > 0
