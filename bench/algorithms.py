"""uint8 on QNN HTP with and without quantize's algorithms, on the real-model corpus, beside
onnxruntime's QNN recipe (u8u8) and the tool's w8a16.

Each cell is `build --onnx MODEL --device npu --precision uint8 --calibration-data calib.npz
--eval-data heldout.npz` as a user runs it, with the npu/uint8 preset's quantize step given
`algorithms: VARIANT` (none: the preset as it is); then the task metric against the float
model on the held-out samples on HTP (tests/corpus/quantizers.measure). A build a gate
withholds is measured on the candidate it kept. Each cell runs in its own process.
Run: `python bench/algorithms.py [--models a,b] [--variants none,cle,auto] [--json F]`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

VARIANTS = ("none", "cle", "smoothquant", "seqmse", "bias_correction",
            "cle+seqmse+bias_correction", "auto", "ort", "w8a16")  # fmt: skip
FAST = ("mtcnn-pnet", "mtcnn-onet", "ppocr-cls", "silero-vad", "crepe-tiny")


def _with_algorithms(variant: str) -> None:
    """The npu/uint8 preset's quantize step with `algorithms: variant` (this process only)."""
    from winml_recipes.presets import presets

    steps = presets()["defaults"]["npu"]["uint8"]
    at = next(i for i, s in enumerate(steps) if s == "quantize" or "quantize" in s)
    given: str | list[str] = "auto" if variant == "auto" else variant.split("+")
    steps[at] = {"quantize": {"algorithms": given}}


def cell(name: str, variant: str) -> dict:
    from tests.corpus import models
    from tests.corpus.quantizers import measure, ort
    from winml_recipes import api

    p = models.prepare(name)
    row = {
        "model": name,
        "variant": variant,
        "metric": p.entry.metric_name,
        "task_name": p.entry.task,
    }
    with tempfile.TemporaryDirectory(prefix=f"algos-{name}-") as tmp:
        work = Path(tmp)
        started = time.perf_counter()
        if variant == "ort":
            built = ort(p, "uint8", work)
        else:
            precision = "w8a16" if variant == "w8a16" else "uint8"
            if variant not in ("none", "w8a16"):
                _with_algorithms(variant)
            try:
                result = api.build_onnx(
                    p.model, device="npu", precision=precision, calibration_data=str(p.calib),
                    eval_data=str(p.heldout), output_root=work / "out", use_cache=False,
                    task=p.entry.task,
                )  # fmt: skip
                built = result.models["model"]
                row |= _kept(result.manifest)
            except Exception as exc:
                message = str(exc).splitlines()[0][:200]
                kept = sorted((work / "out").glob(f"*/npu-{precision}.failed/*/model.onnx"))
                if "verif" not in message or not kept:  # only a gate's withheld candidate
                    return row | {"error": message}
                built = kept[0]
                row["gate"] = message
                evidence = built.parents[1] / "manifest.json"  # the withheld build's
                if evidence.is_file():
                    row |= _kept(json.loads(evidence.read_text()))
        row["seconds"] = round(time.perf_counter() - started, 1)
        return row | measure(p, built)


def _kept(manifest: dict) -> dict:
    """{"kept": the algorithms the quantize step kept or applied, "tried": auto's candidates
    and their scores}, or {} without any."""
    steps = manifest.get("components", {}).get("model", {}).get("steps", [])
    quantize = next((s for s in steps if s.get("pass") == "quantize"), {})
    algos = (quantize.get("metrics") or {}).get("algorithms")
    if not algos:
        return {}
    out = {"kept": algos.get("kept", algos.get("applied"))}
    if "tried" in algos:
        out["tried"] = algos["tried"]
        out["ranges"] = algos.get("kept_ranges", "minmax")
    return out


def run_cell(name: str, variant: str) -> dict:
    done = subprocess.run(
        ["nice", sys.executable, __file__, "--cell", name, variant],
        cwd=REPO, capture_output=True, text=True, timeout=3600,
    )  # fmt: skip
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {"model": name, "variant": variant, "error": (done.stderr.strip().splitlines()
            or ["no output"])[-1][:200]}  # fmt: skip


def render(rows: list[dict], variants: list[str]) -> None:
    cells = {(r["model"], r["variant"]): r for r in rows}
    print("| model | metric | " + " | ".join(variants) + " |")
    print("|---|---|" + "---|" * len(variants))
    for name in dict.fromkeys(r["model"] for r in rows):
        out = []
        for v in variants:
            r = cells.get((name, v), {})
            if "task" in r:
                text = f"{r['task']:.4f}"
                if r.get("gate"):
                    text += " (withheld)"
                if v == "auto" and "kept" in r:
                    clipped = (
                        [r["ranges"] + " ranges"] if r.get("ranges", "minmax") != "minmax" else []
                    )
                    text += f" [{'+'.join(clipped + r['kept']) or 'none'}]"
            else:
                text = "fails" if r else "-"
            out.append(text)
        metric = next((cells[(name, v)].get("metric", "") for v in variants
                       if (name, v) in cells), "")  # fmt: skip
        print(f"| {name} | {metric} | " + " | ".join(out) + " |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(FAST))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--cell", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.cell:
        print(json.dumps(cell(*args.cell)), flush=True)
        return 0
    variants = args.variants.split(",")
    rows = []
    for name in args.models.split(","):
        for variant in variants:
            rows.append(run_cell(name, variant))
            print(json.dumps(rows[-1]), flush=True)
            if args.json:
                args.json.write_text(json.dumps(rows, indent=1))
    render(rows, variants)
    return 0


if __name__ == "__main__":
    sys.exit(main())
