"""Benchmarks, each reported as a ratio against a baseline measured in the same run.

- sam3-tiny: cold build (empty cache) vs fully cached rebuild; the rebuild must not import
  torch and should take under 10% of the cold build.
- calibration memory (bench/calibration_memory.py): peak RSS calibrating the sam3-tiny
  vision encoder with 8 and with 32 samples; the ratio must stay at or below 1.2.
- activation memory (bench/activation_memory.py): peak RSS of minmax calibration against a
  plain forward pass of a 40-activation chain; the ratio must stay at or below 1.5.
- decoder quality (bench/quality.py): held-out SQNR of the sam3-tiny decoder under each
  quantization setting, against the naive baseline measured in the same run.
- QNN HTP (bench/htp.py): verification of the sam3-tiny npu/w8a16 graphs on QNN HTP and
  their EPContext compile, as ratios against verification on the CPU EP.
- matrix (bench/matrix.py): sam3-tiny's 5 targets + 3 of a small MLP recipe built by the
  local, pool and Ray executors from empty caches, wall times as ratios against local, Ray's
  start-up apart, outputs checked byte-identical.
- P1 overhead (bench/overhead.py): a `build --onnx` cpu/uint8 of sam3-tiny's two graphs
  against the same onnxruntime calls (quantize_static, float and quantized sessions) in a
  plain script, whole processes; the CPU-time ratio must stay at or below 1.05.
- sam3-mid (bench/mid.py): wall time and peak RSS per step of the npu/w8a16 build at the
  full-size shapes, against one fp32 forward pass of its encoder; and the quantize step's
  calibration of the 1008 px encoder against a plain onnxruntime forward, per sample on
  the same 2 inputs (bench/sam3_full.py calibration): the ratio must stay at or below 1.3.
- algorithm memory (bench/algorithm_memory.py): peak RSS and wall time of quantize with
  seqmse / bias_correction against plain calibration on sam3-mid's vision encoder (504 px,
  npu/w8a16, same samples, fresh processes); the peak ratio must stay at or below 1.5.
- quantize algorithms (bench/algorithms.py): mtcnn-pnet at npu/uint8 with plain ranges,
  `algorithms: auto` and onnxruntime's QNN recipe, box F1 on QNN HTP (a few minutes; the
  other corpus rows: `python bench/algorithms.py --models ... --variants ...`).
- third-party quantizers (bench/thirdparty.py, with WINML_BENCH_THIRDPARTY=1, ~10 min):
  ours against onnxruntime's get_qnn_qdq_config a16w8 and quantize_static u8 on a BERT,
  a CNN, a text recognizer and a ResNet, task metric on the CPU EP and QNN HTP.

Run with `make bench`. Prints a table and writes bench/out/results.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "sam3-tiny.yaml"

_BUILD = """
import json, resource, sys, time
t = time.perf_counter()
from winml_recipes import api
api.build({recipe!r}, output_root={out!r})
print(json.dumps({{
    "seconds": time.perf_counter() - t,
    "torch_imported": "torch" in sys.modules,
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
}}))
"""


def _build_in_fresh_process(cache: Path, out: Path) -> dict:
    """One build in a new interpreter (import time counts, as it does for a user)."""
    env = {**os.environ, "WINML_RECIPES_CACHE": str(cache)}
    code = _BUILD.format(recipe=str(RECIPE), out=str(out))
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, cwd=REPO
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["process_seconds"] = time.perf_counter() - started
    return result


def bench_cached_rebuild(scratch: Path) -> dict:
    cache = scratch / "cache"
    cold = _build_in_fresh_process(cache, scratch / "out-cold")
    warm = _build_in_fresh_process(cache, scratch / "out-warm")
    return {
        "cold_build_s": round(cold["process_seconds"], 3),
        "cached_rebuild_s": round(warm["process_seconds"], 3),
        "ratio": round(warm["process_seconds"] / cold["process_seconds"], 4),
        "cached_imports_torch": warm["torch_imported"],
        "target_ratio_below": 0.10,
    }


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="winml-bench-") as tmp:
        results = {"sam3_tiny_cached_rebuild": bench_cached_rebuild(Path(tmp))}
    out = REPO / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    ok = True
    r = results["sam3_tiny_cached_rebuild"]
    print(f"sam3-tiny cold build        {r['cold_build_s']:8.2f} s")
    print(f"sam3-tiny cached rebuild    {r['cached_rebuild_s']:8.2f} s")
    print(f"ratio cached / cold         {r['ratio']:8.4f}   (target < {r['target_ratio_below']})")
    print(f"cached rebuild imports torch: {r['cached_imports_torch']}")
    ok &= r["ratio"] < r["target_ratio_below"] and not r["cached_imports_torch"]
    print("PASS" if ok else "FAIL")
    print()
    sys.path.insert(0, str(REPO / "bench"))
    import calibration_memory

    memory_ok = calibration_memory.main() == 0
    print()
    import activation_memory

    memory_ok &= activation_memory.main() == 0
    print()
    import quality

    quality.main()
    print()
    import overhead

    ok &= overhead.main() == 0
    print()
    import htp

    htp.main()
    print()
    import matrix

    same_bytes = matrix.main([]) == 0
    print()
    import mid

    ok &= mid.main() == 0
    print()
    import algorithm_memory

    memory_ok &= algorithm_memory.main([]) == 0
    print()
    import algorithms

    algorithms.main(["--models", "mtcnn-pnet", "--variants", "none,auto,ort"])
    if os.environ.get("WINML_BENCH_THIRDPARTY") == "1":
        print()
        import thirdparty

        thirdparty.main([])
    return 0 if ok and memory_ok and same_bytes else 1


if __name__ == "__main__":
    sys.exit(main())
