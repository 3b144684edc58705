"""Dense-prediction vision families from a tiny `save_pretrained` folder to a verified build.

Per architecture (tests/vision_models.py: the real transformers class at a tiny size,
seeded random weights, a preprocessor_config.json shaped like the Hub model's):
`winml-recipes init FOLDER`, then `build` for npu/w8a16 (QNN HTP, CPU fallback off) and
cpu/int8, each in its own process (wall seconds, peak RSS of that process). The task metric
on the target and, for npu, the same metric on the CPU EP's run of the same QDQ model.

    python bench/vision_tasks.py [ARCH ...] [--targets npu/w8a16,cpu/int8] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.vision_models import TINY, save_tiny  # noqa: E402

KEYS = ("abs_rel_worst", "delta1_worst", "mean_iou", "pixel_agreement", "box_f1",
        "float_boxes", "psnr_db_worst")  # fmt: skip


def _run(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess, float, float]:
    """The CLI in a child process: (result, wall seconds, that process's peak RSS in MB)."""
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "winml_recipes", *args], cwd=cwd, stdout=out, stderr=err
        )
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        result = subprocess.CompletedProcess(args, proc.returncode, out.read(), err.read())
    return result, time.perf_counter() - started, usage.ru_maxrss / 1024


def _metric(manifest: dict, where: str) -> dict:
    step = next((s for s in manifest["components"]["model"]["steps"] if s["pass"] == "verify"), {})
    m = step.get("metrics") or {}
    if where == "simulation":
        return (m.get("cpu_simulation") or {}).get("task_metric") or {}
    return (m.get("task_metric") or {}).get("values") or {}


def _short(values: dict) -> str:
    parts = [f"{k} {values[k]:.3g}" for k in KEYS if k in values]
    return ", ".join(parts) or "-"


def bench(arch: str, root: Path, targets: list[str]) -> dict:
    folder = save_tiny(arch, root / arch)
    row: dict = {"arch": arch}
    init, secs, _ = _run(["init", str(folder), "--name", arch.lower()], root)
    row["init"] = init.returncode == 0
    row["init_error"] = init.stderr.strip().splitlines()[-1:] if init.returncode else []
    if not row["init"]:
        return row
    import yaml

    entry = yaml.safe_load((root / "catalog" / f"{arch.lower()}.yaml").read_text())
    row["task"] = entry["task"]
    for target in targets:
        device, precision = target.split("/")
        out = root / "out" / arch
        result, secs, rss = _run(
            ["build", f"recipes/{arch.lower()}.yaml", "--device", device, "--precision",
             precision, "-o", str(out)], root)  # fmt: skip
        manifest_path = next(out.glob(f"*/{device}-{precision}*/manifest.json"), None)
        manifest = json.loads(manifest_path.read_text()) if manifest_path else {}
        row[target] = {
            "ok": result.returncode == 0,
            "exit": result.returncode,
            "seconds": round(secs, 1),
            "peak_mb": round(rss),
            "target": _metric(manifest, "target") if manifest else {},
            "simulation": _metric(manifest, "simulation") if manifest else {},
            "error": result.stderr.strip().splitlines()[-3:] if result.returncode else [],
        }
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("archs", nargs="*", default=list(TINY))
    parser.add_argument("--targets", default="npu/w8a16,cpu/int8")
    parser.add_argument("--json")
    parser.add_argument("--keep", help="work in this folder and keep it (builds, evidence)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="vision-bench-") as tmp:
        tmp = args.keep or tmp
        os.environ.setdefault("WINML_RECIPES_CACHE", str(Path(tmp) / "cache"))
        for arch in args.archs:
            row = bench(arch, Path(tmp), args.targets.split(","))
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("\n| architecture | init | task | target | build | task metric on target | "
          "same on CPU simulation | s | peak MB |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        for target in args.targets.split(","):
            t = row.get(target)
            if t is None:
                print(f"| {row['arch']} | {'ok' if row['init'] else 'refused'} | "
                      f"{row.get('task', '-')} | {target} | - | - | - | - | - |")  # fmt: skip
                continue
            print(
                f"| {row['arch']} | ok | {row['task']} | {target} | "
                f"{'ok' if t['ok'] else 'exit ' + str(t['exit'])} | {_short(t['target'])} | "
                f"{_short(t['simulation'])} | {t['seconds']} | {t['peak_mb']} |"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
