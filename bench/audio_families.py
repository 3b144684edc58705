"""The audio families' table: each tiny `save_pretrained` folder through `init` and `build`.

    python -m bench.audio_families OUT_DIR [ARCH ...]

Per architecture and target: init ok, task, build ok, the task metric on the target and on
the CPU simulation of the same QDQ model, wall seconds and peak RSS of the build process.
The folders are made by tests/audio_models.py (random weights, seed 0).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from tests.audio_models import ARCHITECTURES, saved

TARGETS = (("npu", "w8a16"), ("cpu", "int8"))


def _cli(args: list[str], cwd: Path) -> tuple[int, str, float, float]:
    start = time.time()
    command = ["/usr/bin/time", "-f", "PEAK %M", sys.executable, "-m", "winml_recipes", *args]
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    peak = next((float(x.split()[1]) / 1024 for x in done.stderr.splitlines()
                 if x.startswith("PEAK ")), 0.0)  # fmt: skip
    text = (done.stdout + done.stderr).strip().splitlines()
    last = [x for x in text if x.startswith(("error", "task:"))]
    return done.returncode, (last or text or [""])[-1], time.time() - start, peak


def _metric(manifest: Path) -> tuple[str, str]:
    if not manifest.is_file():
        return "-", "-"
    data = json.loads(manifest.read_text())
    steps = data["components"]["model"]["steps"]
    verify = next((s for s in steps if s["pass"] == "verify"), {})
    metrics = verify.get("metrics") or {}
    on = (metrics.get("task_metric") or {}).get("values", {})
    sim = (metrics.get("cpu_simulation") or {}).get("task_metric", {})
    keys = [k for k in on if k in ("top1_agreement", "sequence_agreement", "character_agreement",
                                   "cosine_mean", "cosine_worst")]  # fmt: skip

    def show(v: dict) -> str:
        return ", ".join(f"{k} {v[k]:.3f}" for k in keys if k in v) or "-"

    return show(on), show(sim)


def main() -> None:
    out = Path(sys.argv[1]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    archs = sys.argv[2:] or list(ARCHITECTURES)
    print(
        "| architecture | init | task | target | build | metric on target | CPU simulation "
        "| seconds | peak MB |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for arch in archs:
        folder = saved(arch, out / "models")
        code, line, _, _ = _cli(["init", str(folder), "--name", arch], out)
        task = line.split("(")[0].removeprefix("task: ").strip() if code == 0 else "-"
        init = "ok" if code == 0 else f"refused: {line[:80]}"
        for device, precision in TARGETS if code == 0 else ():
            rc, msg, secs, peak = _cli(["build", f"recipes/{arch}.yaml", "--device", device,
                                        "--precision", precision, "-o", "out"], out)  # fmt: skip
            tag = f"{device}-{precision}"
            manifest = out / "out" / arch / (tag if rc == 0 else f"{tag}.failed") / "manifest.json"
            on, sim = _metric(manifest)
            build = "ok" if rc == 0 else f"failed ({msg[:90]})"
            print(
                f"| {arch} | {init} | {task} | {device}/{precision} | {build} | {on} | {sim} "
                f"| {secs:.0f} | {peak:.0f} |",
                flush=True,
            )
        if code != 0:
            print(f"| {arch} | {init} | - | - | - | - | - | - | - |", flush=True)


if __name__ == "__main__":
    main()
