"""sam3-mid npu/w8a16: wall time and peak RSS per step, against one float forward pass.

sam3-mid has the full-size shapes and widths (1008 px, ViT hidden 1024) with 2 ViT layers,
so activations dominate memory as in the full model. The build runs in a fresh process
with an empty cache; the baseline, measured in the same run, is one fp32 forward pass of
its float vision encoder on the CPU EP (time and peak RSS, in its own process). Each step's
wall time and the build's peak RSS when the step ended are reported as multiples of it,
with the step's own memory estimate (checked against the budget before it ran) beside it.
Then the quantize step's calibration of the encoder against a plain onnxruntime forward
pass, per sample on the same 2 inputs (`bench/sam3_full.py calibration`, target <= 1.3x).

    python bench/mid.py      # takes several minutes
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "sam3-mid.yaml"

_FORWARD = """
import json, time
import numpy as np
from winml_recipes.runtime.memory import peak_rss_mb
from winml_recipes.runtime.sessions import open_session
session = open_session({model!r})
x = np.random.default_rng(0).uniform(-1, 1, (1, 3, 1008, 1008)).astype(np.float32)
started = time.perf_counter()
session.run({{"pixel_values": x}})
print(json.dumps({{"seconds": time.perf_counter() - started, "peak_rss_mb": peak_rss_mb()}}))
"""


def _run(args: list[str], env: dict | None = None) -> str:
    import os

    done = subprocess.run(
        args,
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )
    return done.stdout


def run() -> dict:
    with tempfile.TemporaryDirectory(prefix="winml-bench-mid-") as tmp:
        env = {"WINML_RECIPES_CACHE": str(Path(tmp) / "cache")}

        def build(device: str, precision: str) -> dict:
            args = ["build", str(RECIPE), "--device", device, "--precision", precision]
            cmd = [sys.executable, "-m", "winml_recipes", *args, "-o", str(Path(tmp) / "out")]
            return json.loads(_run([*cmd, "--json"], env))

        manifest = build("npu", "w8a16")
        fp32 = build("cpu", "fp32")
        encoder = Path(tmp) / "out" / "sam3-mid" / "cpu-fp32" / "vision_encoder" / "model.onnx"
        base = json.loads(_run([sys.executable, "-c", _FORWARD.format(model=str(encoder))]))
        # the float model the npu build calibrated (after its fix_shapes and prepare)
        calibrated = encoder.parents[2] / "npu-w8a16" / "float-reference" / encoder.parent.name
        sys.path.insert(0, str(REPO / "bench"))
        import sam3_full

        calibration = sam3_full.calibration_vs_forward(calibrated / "model.onnx", samples=2)
    steps = []
    for name, comp in manifest["components"].items():
        for s in comp["steps"]:
            steps.append(
                {
                    "component": name,
                    "pass": s["pass"],
                    "status": s["status"],
                    "wall_s": s.get("wall_seconds"),
                    "peak_rss_mb": s.get("peak_rss_mb"),
                    "memory_estimate_mb": s.get("memory_estimate_mb"),
                    "wall_over_forward": round((s.get("wall_seconds") or 0) / base["seconds"], 2),
                    "peak_over_forward": (
                        round(s["peak_rss_mb"] / base["peak_rss_mb"], 2)
                        if s.get("peak_rss_mb")
                        else None
                    ),
                }
            )
    return {
        "baseline_forward": {k: round(v, 2) for k, v in base.items()},
        "build_wall_s": manifest["wall_seconds"],
        "fp32_build_wall_s": fp32["wall_seconds"],
        "steps": steps,
        "calibration_vs_forward": calibration,
    }


def main() -> int:
    r = run()
    out = REPO / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "mid.json").write_text(json.dumps(r, indent=2) + "\n")
    b = r["baseline_forward"]
    print(
        f"sam3-mid: one fp32 encoder forward {b['seconds']:.1f} s, peak {b['peak_rss_mb']:.0f} MB"
    )
    print(f"npu/w8a16 build {r['build_wall_s']:.0f} s (cold cache)")
    for s in r["steps"]:
        if s["status"] == "skipped":
            continue
        print(
            f"  {s['component']:<28} {s['pass']:<10} {s['wall_s'] or 0:7.1f} s "
            f"(x{s['wall_over_forward']} forward)  peak {s['peak_rss_mb']} MB "
            f"(x{s['peak_over_forward']}; estimated {s['memory_estimate_mb']} MB)"
        )
    import sam3_full

    return 0 if sam3_full.print_calibration(r["calibration_vs_forward"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
