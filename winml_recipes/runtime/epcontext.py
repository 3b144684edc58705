"""EPContext generation in a fresh process, so the compiled bytes depend on the model alone.

Two things in an EP (the NPU's, measured) make a compiled context depend on where and after what
it was made: partitions are named with a hash of the model's path (loading from bytes
avoids it, see `open_session(path_independent=True)`), and the EP graph's tensors are
numbered by counters that live as long as the process (a second compile of the same
model in one process gives other numbers in the binary). A fresh interpreter per compile
gives the same bytes on any executor, after any earlier build.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from winml_recipes.sdk.errors import ExecutionProviderError

TIMEOUT_SECONDS = 3600.0


def compile_epcontext(
    src: Path,
    out: Path,
    ep_key: str,
    *,
    embed: bool,
    provider_options: Mapping[str, str],
    device: str | None = None,
) -> dict[str, float | None]:
    """Write the EPContext model `out` for `src` on the EP `ep_key` (a child process); the
    child's wall seconds and peak RSS (MB) while it prepared the graph."""
    spec = {
        "src": str(src),
        "out": str(out),
        "ep": ep_key,
        "embed": embed,
        "provider_options": dict(provider_options),
        "device": device,
    }
    done = subprocess.run(
        [sys.executable, "-m", "winml_recipes.runtime.epcontext", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_SECONDS,
    )
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit code {done.returncode}"]
        raise ExecutionProviderError(lines[-1].removeprefix("error: "), where=str(src))
    measured = [s for s in done.stdout.splitlines() if s.startswith("{")]
    return json.loads(measured[-1]) if measured else {"seconds": None, "peak_rss_mb": None}


def _main(argv: list[str]) -> int:
    from winml_recipes.runtime.memory import own_peak_rss_mb
    from winml_recipes.runtime.sessions import open_session
    from winml_recipes.sdk.errors import WinmlError

    spec = json.loads(argv[0])

    def configure(so) -> None:
        so.add_session_config_entry("ep.context_enable", "1")
        so.add_session_config_entry("ep.context_file_path", spec["out"])
        so.add_session_config_entry("ep.context_embed_mode", "1" if spec["embed"] else "0")

    started = time.perf_counter()
    try:
        open_session(
            Path(spec["src"]),
            spec["ep"],
            fallback=False,
            configure=configure,
            provider_options=spec["provider_options"],
            path_independent=True,
            device=spec.get("device"),
        )
    except WinmlError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    seconds = round(time.perf_counter() - started, 1)
    print(json.dumps({"seconds": seconds, "peak_rss_mb": own_peak_rss_mb()}))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
