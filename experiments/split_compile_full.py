"""Split compilation of a large QDQ graph on QNN HTP, measured: the compile step's split path
(runtime/splitcompile.py: plan_split -> compile_parts, each part prepared in its own process,
one at a time, then stitched into one model_ctx.onnx), each part's preparation seconds and
peak RSS, the whole compile's wall time and the stitched model loaded back on HTP with CPU
fallback off (what `compile: {samples: 0}` does), in a fresh process.

    nice python experiments/split_compile_full.py QDQ.onnx OUT [--every 4 | --auto]
        [--shape x=1,3,8,8]

`--every K` cuts after every K transformer blocks (onnx/split.py `block_boundaries`);
`--auto` lets the qnn-htp plugin's PreparationCost and the memory budget choose (what a
build's compile step does). Prints one JSON line per part and a summary line. Run it under
a memory watchdog: a part that does not fit is what this measures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from experiments.htp_prepare_memory import _python  # noqa: E402

_LOAD = """
import json, sys, time
from winml_recipes.runtime.memory import peak_rss_mb
from winml_recipes.runtime.sessions import open_session
started = time.perf_counter()
open_session(sys.argv[1], "qnn-htp", fallback=False)
print(json.dumps({"load_seconds": round(time.perf_counter() - started, 2),
                  "peak_rss_mb": peak_rss_mb()}))
"""


def main(argv: list[str] | None = None) -> int:
    import onnx

    from winml_recipes.engine.budget import resolve_budget
    from winml_recipes.eps.qnn import PLUGIN
    from winml_recipes.onnx.split import Splitter
    from winml_recipes.runtime.memory import peak_rss_mb
    from winml_recipes.runtime.splitcompile import compile_parts, plan_split

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("out", type=Path)
    how = parser.add_mutually_exclusive_group(required=True)
    how.add_argument("--every", type=int, help="cut after every K transformer blocks")
    how.add_argument("--auto", action="store_true", help="the plugin's cost and the budget")
    parser.add_argument("--shape", action="append", default=[], help="input=d0,d1,...")
    parser.add_argument("--budget-mb", type=float, default=None)
    args = parser.parse_args(argv)
    shapes = {k: tuple(int(d) for d in v.split(",")) for k, v in
              (s.split("=", 1) for s in args.shape)}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    cut_after: tuple[str, ...] = ()
    if args.every:
        splitter = Splitter(onnx.load(args.model, load_external_data=False))
        bounds = splitter.block_boundaries()
        cut_after = tuple(splitter.crossing(bounds[k])[0]
                          for k in range(args.every, len(bounds), args.every))  # fmt: skip
        del splitter
    budget = args.budget_mb if args.budget_mb is not None else resolve_budget(None)
    plan = plan_split(args.model, PLUGIN, shapes, None, budget, "quantized", cut_after)
    print(json.dumps({"plan_seconds": round(time.perf_counter() - started, 1),
                      "parts": plan.count, "why": plan.why,
                      "whole_estimate_mb": plan.whole_mb and round(plan.whole_mb),
                      "cut_after": [p.inputs for p in plan.parts[1:]],
                      "plan_peak_rss_mb": peak_rss_mb()}), flush=True)  # fmt: skip
    compiled = args.out / "model_ctx.onnx"
    begun = time.perf_counter()
    records = compile_parts(plan, args.model, args.out / "parts", compiled, PLUGIN.key,
                            embed=False, provider_options={}, device="npu")  # fmt: skip
    for r in records:
        print(json.dumps({k: r[k] for k in ("index", "nodes", "inputs", "estimate_mb",
                                            "prepare_seconds", "prepare_peak_rss_mb")}),
              flush=True)  # fmt: skip
    summary = {
        "compile_seconds": round(time.perf_counter() - begun, 1),
        "parent_peak_rss_mb": peak_rss_mb(),
        "largest_part_peak_rss_mb": max(r["prepare_peak_rss_mb"] or 0 for r in records),
        "load_back": _python(_LOAD, str(compiled), cap_mb=8192),
    }
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
