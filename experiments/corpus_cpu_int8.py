"""The trained real-model corpus at cpu/int8, as a user builds it: `build --onnx MODEL
--device cpu --precision int8` with its calibration and held-out data (and `--task` where
the corpus names one). Per model: the exit code, seconds, peak RSS, what quantize's mode
auto kept and why, verify's task values, and the corpus's own task metric computed here on
the shipped model against the float model (onnxruntime's default level, as a user runs it).
One JSON line per model.

    python experiments/corpus_cpu_int8.py OUT_DIR [NAME ...]
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.corpus import models  # noqa: E402


def _choice(out: Path) -> dict:
    manifest = next(iter(sorted(out.glob("*/cpu-int8*/manifest.json"))), None)
    if manifest is None:
        return {}
    steps = json.loads(manifest.read_text())["components"]["model"]["steps"]
    metrics = {s["pass"]: s.get("metrics") or {} for s in steps}
    choice = metrics.get("quantize", {}).get("format_choice") or {}
    verify = (metrics.get("verify", {}).get("task_metric") or {}).get("values")
    return {"kept": choice.get("kept"), "why": choice.get("why"), "verify_task": verify}


def _corpus_metric(p, shipped: Path) -> float:
    import onnxruntime as ort

    feeds = models.heldout_feeds(p)
    reference = models.float_outputs(p, feeds)
    session = ort.InferenceSession(str(shipped))
    names = [o.name for o in session.get_outputs()]
    got = [dict(zip(names, session.run(None, f), strict=True)) for f in feeds]
    return round(p.entry.metric(reference, got), 4)


def main() -> None:
    root = Path(sys.argv[1]).resolve()
    for name in sys.argv[2:] or list(models.CORPUS):
        p = models.prepare(name)
        out = root / name / "out"
        started = time.time()
        command = [
            "/usr/bin/time", "-f", "PEAK %M", sys.executable, "-m", "winml_recipes", "build",
            "--onnx", str(p.model), "--device", "cpu", "--precision", "int8",
            "--calibration-data", str(p.calib), "--eval-data", str(p.heldout), "-o", str(out),
            *(["--task", p.entry.task] if p.entry.task else []),
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
        peak = next((int(x.split()[1]) // 1024 for x in done.stderr.splitlines()
                     if x.startswith("PEAK ")), 0)  # fmt: skip
        row = {"name": name, "exit": done.returncode, "seconds": round(time.time() - started),
               "peak_mb": peak, **_choice(out)}  # fmt: skip
        shipped = next(iter(sorted(out.glob("*/cpu-int8/*/model.onnx"))), None)
        if shipped is not None:
            row["corpus_metric"] = [p.entry.metric_name, _corpus_metric(p, shipped)]
        else:
            errors = [x for x in done.stderr.splitlines() if x.startswith("error")]
            row["error"] = (errors or [""])[0][:300]
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
