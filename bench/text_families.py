"""Text, two-tower and image-embedding families (issue 33) through `init` and `build`.

For every tiny architecture of tests/text_families.py (seeded random weights, a
`save_pretrained` folder with its preprocessor file): `winml-recipes init FOLDER`, then
`build` of the recipe it writes for each target (npu/w8a16 on QNN HTP with CPU fallback
off, cpu/int8). A row: init ok, the task and family chosen, the build's status, the task
metric on the target and on the CPU simulation of the same QDQ model, wall seconds and
the peak RSS of the largest child process. Two-tower models (CLIP, SigLIP) also get the
zero-shot top-1 agreement of their two built graphs on the bundled held-out photographs
against 8 label prompts (float graphs vs the target's).

Each cell runs in its own process. Run:
`python bench/text_families.py [--archs a,b] [--targets npu/w8a16,cpu/int8] [--json F]`;
`--tool-path DIR` runs another checkout's winml_recipes (the "before" table).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
FOLDERS = Path(tempfile.gettempdir()) / "winml-text-families"
TIMEOUT = 1500


def _first(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("WARNING")]
    errors = [ln for ln in lines if "error" in ln.lower()]
    return ((errors or lines or [""])[-1]).strip()[:220]


def _metric(component: dict) -> dict:
    verify = next((s for s in component["steps"] if s["pass"] == "verify"), {})
    m = verify.get("metrics") or {}
    task = m.get("task_metric") or {}
    return {
        "metric": task.get("metric", "-"),
        "target": task.get("values"),
        "simulation": (m.get("cpu_simulation") or {}).get("task_metric"),
        "verified_on": m.get("verified_on", verify.get("status")),
    }


def cell(arch: str, target: str, tool_path: str | None) -> dict:
    """init + build of one architecture for one target, in this process's children."""
    from tests import text_families

    device, precision = target.split("/")
    folder = text_families.saved(arch, FOLDERS)
    row: dict = {"arch": arch, "target": target}
    env = {**os.environ, "PYTHONPATH": tool_path or str(REPO)}
    with tempfile.TemporaryDirectory(prefix=f"text-families-{arch}-") as tmp:
        work = Path(tmp)
        env["WINML_RECIPES_CACHE"] = str(work / "cache")

        def run(*args: object) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "winml_recipes", *map(str, args)],
                                  cwd=work, capture_output=True, text=True, timeout=TIMEOUT,
                                  env=env)  # fmt: skip

        done = run("init", folder, "--name", arch)
        if done.returncode != 0:
            return row | {"init": _first(done.stderr + done.stdout)}
        import yaml

        entry = yaml.safe_load((work / "catalog" / f"{arch}.yaml").read_text())
        row |= {"init": "ok", "task": entry["task"], "family": entry.get("family")}
        row["inputs"] = {c: list(s["inputs"]) for c, s in entry["components"].items()}
        started = time.perf_counter()
        done = run("build", f"recipes/{arch}.yaml", "--device", device, "--precision", precision,
                   "-o", work / "out", "--json")  # fmt: skip
        row["seconds"] = round(time.perf_counter() - started, 1)
        row["peak_mb"] = round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
        if done.returncode != 0:
            return row | {"build": _first(done.stderr)}
        manifest = json.loads(done.stdout)
        row["build"] = manifest.get("status", "ok")
        row["components"] = {c: _metric(s) for c, s in manifest["components"].items()}
        if entry.get("family") == "two_tower":
            build = work / "out" / arch / f"{device}-{precision}"
            catalog = work / "catalog" / f"{arch}.yaml"
            row["zero_shot"] = text_families.zero_shot(build, device, catalog)
    return row


CLASSES = {
    "dinov2": "Dinov2Model", "siglip-vision": "SiglipVisionModel",
    "clip-vision-projection": "CLIPVisionModelWithProjection", "clip": "CLIPModel",
    "siglip": "SiglipModel", "distilbert-qa": "DistilBertForQuestionAnswering",
    "bert-token": "BertForTokenClassification", "bge": "BertModel (BGE-style)",
    "t5-encoder": "T5EncoderModel", "deberta-v3": "DebertaV2ForSequenceClassification (v3)",
}  # fmt: skip
GATED = {
    "embedding-cosine": "cosine_worst",
    "span-agreement": "span_agreement",
    "token-label-agreement": "token_agreement",
    "top-k-agreement": "top1_agreement",
}


def _cell_text(row: dict | None) -> str:
    """One build's status: its gated task value on the target (/ CPU simulation)."""
    if row is None:
        return "-"
    if row.get("init") != "ok":
        return "init refused"
    if row.get("build") != "ok":
        text = str(row.get("build", row.get("error", "?")))
        text = text.split("]: ", 1)[-1].replace("error: ", "").replace("auto/model: ", "")
        return "fails: " + text.split("; evidence kept")[0][:90].replace("|", "/")
    parts = []
    for comp in row["components"].values():
        key = GATED.get(comp["metric"])
        if key is None or not comp["target"]:
            parts.append("built, per-output gates only (no task metric)")
            continue
        text = f"{key} {comp['target'][key]:.3f}"
        if comp.get("simulation"):
            text += f" (sim {comp['simulation'][key]:.3f})"
        parts.append(text)
    if "zero_shot" in row:
        parts.append(f"zero-shot top1 {row['zero_shot']['top1_agreement']:.2f}")
    return "; ".join(parts) + f"; {row['seconds']:.0f} s, {row['peak_mb']} MB"


def table(before: list[dict], after: list[dict]) -> str:
    """The README's table: per architecture, init and both targets, before and after."""

    def index(rows: list[dict]) -> dict:
        return {(r["arch"], r["target"]): r for r in rows}

    b, a = index(before), index(after)
    lines = [
        "| architecture | init before | init after (task) | npu/w8a16 after: HTP (CPU sim) | "
        "cpu/int8 after | npu/w8a16 before |",
        "|---|---|---|---|---|---|",
    ]
    for arch, cls in CLASSES.items():
        first_b = b.get((arch, "npu/w8a16"), {})
        first_a = a.get((arch, "npu/w8a16"), {})
        init_b = first_b.get("task", "-") if first_b.get("init", "ok") == "ok" else "refused"
        init_a = first_a.get("task", "-") if first_a.get("init", "ok") == "ok" else "refused"
        lines.append(
            f"| {cls} | {init_b} | {init_a} | {_cell_text(a.get((arch, 'npu/w8a16')))} | "
            f"{_cell_text(a.get((arch, 'cpu/int8')))} | {_cell_text(first_b or None)} |"
        )
    return "\n".join(lines)


def main() -> None:
    from tests import text_families

    ap = argparse.ArgumentParser()
    ap.add_argument("--archs", default=",".join(text_families.ARCHITECTURES))
    ap.add_argument("--targets", default="npu/w8a16,cpu/int8")
    ap.add_argument("--json")
    ap.add_argument("--tool-path")
    ap.add_argument("--cell", nargs=2)
    ap.add_argument("--table", nargs=2, metavar=("BEFORE_JSON", "AFTER_JSON"))
    args = ap.parse_args()
    if args.table:
        rows = [json.loads(Path(p).read_text()) for p in args.table]
        print(table(*rows))
        return
    if args.cell:
        print(json.dumps(cell(*args.cell, args.tool_path)))
        return
    rows = []
    for arch in args.archs.split(","):
        for target in args.targets.split(","):
            cmd = [sys.executable, __file__, "--cell", arch, target]
            cmd += ["--tool-path", args.tool_path] if args.tool_path else []
            done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                                  timeout=2 * TIMEOUT)  # fmt: skip
            line = next((ln for ln in reversed(done.stdout.splitlines()) if ln.startswith("{")),
                        None)  # fmt: skip
            row = json.loads(line) if line else {"arch": arch, "target": target,
                                                 "error": _first(done.stderr)}  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
