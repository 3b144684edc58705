"""Image classifiers whose op patterns gave QNN HTP trouble, from a tiny `save_pretrained`
folder to a verified build (issue 33: Swin, MobileViT, EfficientNet, ConvNeXt V2).

Per architecture (tests/image_classifiers.py): `winml-recipes init FOLDER`, then `build`
for npu/w8a16 (QNN HTP, CPU fallback off) and cpu/int8, each in its own process (wall
seconds, peak RSS). Top-1 agreement with the float model on the target and, for npu, on the
CPU EP's run of the same QDQ model, with the logits' SQNR on both.

    python bench/image_classifiers.py [ARCH ...] [--json out.json] [--results]

`--results` writes the rows into docs/results/image-classifiers.json (at the current
commit; rows of other architectures are kept), then run `make tables`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.vision_tasks import _run  # noqa: E402
from tests.image_classifiers import ARCHITECTURES, saved  # noqa: E402


def _verify(manifest: dict) -> dict:
    steps = manifest["components"]["model"]["steps"]
    return next((s.get("metrics") or {} for s in steps if s["pass"] == "verify"), {})


def _judged(m: dict) -> dict:
    """Top-1 agreement and logits SQNR on the target and in the CPU simulation."""
    sim = m.get("cpu_simulation") or {}
    return {
        "top1": ((m.get("task_metric") or {}).get("values") or {}).get("top1_agreement"),
        "sqnr_db": ((m.get("outputs") or {}).get("logits") or {}).get("sqnr_db"),
        "sim_top1": (sim.get("task_metric") or {}).get("top1_agreement"),
        "sim_sqnr_db": ((sim.get("outputs") or {}).get("logits") or {}).get("sqnr_db"),
    }


def bench(arch: str, root: Path, targets: list[str]) -> dict:
    folder = saved(arch, root / "hf")
    row: dict = {"arch": arch, "folder": folder}
    init, _, _ = _run(["init", str(folder), "--name", arch], root)
    row["init"] = init.returncode == 0
    row["init_error"] = init.stderr.strip().splitlines()[-1:] if init.returncode else []
    if not row["init"]:
        return row
    for target in targets:
        device, precision = target.split("/")
        out = root / "out" / arch
        result, secs, rss = _run(
            ["build", f"recipes/{arch}.yaml", "--device", device, "--precision", precision,
             "-o", str(out)], root)  # fmt: skip
        path = next(out.glob(f"*/{device}-{precision}*/manifest.json"), None)
        row[target] = {
            "ok": result.returncode == 0,
            "exit": result.returncode,
            "seconds": round(secs, 1),
            "peak_mb": round(rss),
            **(_judged(_verify(json.loads(path.read_text()))) if path else {}),
            "error": result.stderr.strip().splitlines()[-2:] if result.returncode else [],
        }
    return row


RESULTS = REPO / "docs" / "results" / "image-classifiers.json"


def _cell(t: dict | None, simulated: bool) -> str:
    if t is None:
        return "-"
    if t.get("top1") is None:
        return "fails: " + " ".join(t["error"])[-160:].replace("|", "/")
    text = f"top-1 {t['top1']:.3g}"
    text += f" ({t['sim_top1']:.3g})" if simulated and t.get("sim_top1") is not None else ""
    db = t.get("sqnr_db")
    if db is not None:
        text += f"; logits {db:.1f} dB"
        text += f" ({t['sim_sqnr_db']:.1f})" if simulated and t.get("sim_sqnr_db") else ""
    return text if t["ok"] else f"FAIL: {text} (exit {t['exit']})"


def write_results(rows: list[dict]) -> None:
    """Each bench row as a results row at this commit, replacing the architecture's old row."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=REPO, check=True).stdout.strip()  # fmt: skip
    data = json.loads(RESULTS.read_text())
    kept = {r["cells"][0]: r for r in data["rows"]}
    for row in rows:
        config = json.loads((Path(row["folder"]) / "config.json").read_text())
        name = config["architectures"][0]
        npu, cpu = row.get("npu/w8a16"), row.get("cpu/int8")
        cells = [name, _cell(npu, True), _cell(cpu, False),
                 f"{npu['seconds']:.0f}, {npu['peak_mb']}" if npu else "-"]  # fmt: skip
        if not row["init"]:
            cells[1:3] = ["init refused: " + " ".join(row["init_error"])[-120:], "-"]
        kept[name] = {"cells": cells, "commit": commit}
    data["rows"] = list(kept.values())
    RESULTS.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("archs", nargs="*", default=list(ARCHITECTURES))
    parser.add_argument("--targets", default="npu/w8a16,cpu/int8")
    parser.add_argument("--json")
    parser.add_argument("--keep", help="work in this folder and keep it (builds, evidence)")
    parser.add_argument("--results", action="store_true", help=f"write {RESULTS.name}")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="classifier-bench-") as tmp:
        tmp = args.keep or tmp
        os.environ.setdefault("WINML_RECIPES_CACHE", str(Path(tmp) / "cache"))
        for arch in args.archs:
            rows.append(bench(arch, Path(tmp), args.targets.split(",")))
            print(json.dumps(rows[-1], default=str), flush=True)
        if args.results:
            write_results(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2, default=str))


if __name__ == "__main__":
    main()
