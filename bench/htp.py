"""QNN HTP verification and compile time for sam3-tiny npu/w8a16, against CPU-EP verification.

The npu/w8a16 build is made once (cached); then, per component, with the same seeded
inputs: the candidate run on the CPU EP (what verification cost before the NPU was in the
loop) is the baseline, and the same run on QNN HTP (session creation included) and an
EPContext compile are reported as ratios against it.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "sam3-tiny.yaml"
SAMPLES = 4


def _timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def run() -> dict:
    from winml_recipes import api
    from winml_recipes.feeds import synthetic, take
    from winml_recipes.runtime.sessions import open_session, run_model

    with tempfile.TemporaryDirectory(prefix="winml-bench-htp-") as tmp:
        result = api.build(RECIPE, device="npu", precision="w8a16", output_root=Path(tmp))
        plan = api.plan(RECIPE, device="npu", precision="w8a16", fetch=False)
        rows = {}
        for comp in plan.components:
            model = result.models[comp.name]
            feeds = take(synthetic(comp.contract, SAMPLES, 1), SAMPLES)
            cpu = _timed(lambda m=model, f=feeds: run_model(m, f))
            htp = _timed(lambda m=model, f=feeds: run_model(m, f, "qnn-htp", fallback=False))
            ctx = Path(tmp) / f"{comp.name}_ctx.onnx"

            def configure(so, ctx=ctx) -> None:
                so.add_session_config_entry("ep.context_enable", "1")
                so.add_session_config_entry("ep.context_file_path", str(ctx))

            compile_s = _timed(
                lambda m=model, c=configure: open_session(m, "qnn-htp", fallback=False, configure=c)
            )
            rows[comp.name] = {
                "cpu_verify_s": round(cpu, 3),
                "htp_verify_s": round(htp, 3),
                "compile_s": round(compile_s, 3),
                "htp_over_cpu": round(htp / cpu, 2),
                "compile_over_cpu": round(compile_s / cpu, 2),
            }
    return {"samples": SAMPLES, "components": rows}


def main() -> int:
    results = run()
    out = REPO / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "htp.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"sam3-tiny npu/w8a16, {results['samples']} samples per verification")
    for name, r in results["components"].items():
        print(
            f"  {name:<28} cpu {r['cpu_verify_s']:6.2f} s  htp {r['htp_verify_s']:6.2f} s "
            f"(x{r['htp_over_cpu']})  compile {r['compile_s']:6.2f} s (x{r['compile_over_cpu']})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
