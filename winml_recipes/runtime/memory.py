"""The process's peak resident memory so far, portably (for the manifest's per-step figures)."""

from __future__ import annotations

import sys
from pathlib import Path


def peak_rss_mb() -> float | None:
    """Peak RSS of this process in MB: getrusage on POSIX, GetProcessMemoryInfo on Windows."""
    if sys.platform == "win32":
        return _windows_peak()
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024, 1)


def _windows_peak() -> float | None:
    import ctypes
    from ctypes import wintypes

    class Counters(ctypes.Structure):
        _fields_ = [
            ("cb", wintypes.DWORD),
            ("PageFaultCount", wintypes.DWORD),
            ("PeakWorkingSetSize", ctypes.c_size_t),
            ("WorkingSetSize", ctypes.c_size_t),
            ("QuotaPeakPagedPoolUsage", ctypes.c_size_t),
            ("QuotaPagedPoolUsage", ctypes.c_size_t),
            ("QuotaPeakNonPagedPoolUsage", ctypes.c_size_t),
            ("QuotaNonPagedPoolUsage", ctypes.c_size_t),
            ("PagefileUsage", ctypes.c_size_t),
            ("PeakPagefileUsage", ctypes.c_size_t),
        ]

    counters = Counters()
    counters.cb = ctypes.sizeof(Counters)
    try:
        process = ctypes.windll.kernel32.GetCurrentProcess()
        ok = ctypes.windll.psapi.GetProcessMemoryInfo(process, ctypes.byref(counters), counters.cb)
    except (AttributeError, OSError):
        return None
    return round(counters.PeakWorkingSetSize / (1024 * 1024), 1) if ok else None


def own_peak_rss_mb() -> float | None:
    """Peak RSS of this process image alone, for a child that reports its own peak: on
    Linux getrusage's ru_maxrss carries the parent's RSS across fork and exec (every part
    of a split compile reported its parent's 3.6 GB), the kernel's VmHWM does not."""
    status = Path("/proc/self/status")
    if sys.platform.startswith("linux") and status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    return peak_rss_mb()
