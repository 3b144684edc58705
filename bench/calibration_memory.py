"""Peak memory of calibration against the number of samples (sam3-tiny vision encoder).

Each (method, sample count) runs `measure` in a fresh interpreter and reports its peak RSS
(`ru_maxrss`). That interpreter is started through a small trampoline process: on Linux,
exec folds the high-water mark of the forked copy of the parent into `ru_maxrss`, so a
child started straight from this (large, model-building) process would report at least
the parent's RSS whatever it does itself. `VmHWM` (reset by exec) is reported alongside
as a cross-check. The figure
that matters is the ratio of the peak with 32 samples to the peak with 8: our calibration
streams, so it must stay <= 1.2 for minmax and entropy. onnxruntime's own histogram
calibrater (percentile: same collection code as entropy, without its slow threshold
search) is measured too, as the reference that grows with the sample count.

    python bench/calibration_memory.py          # table + exit 1 if a ratio is above 1.2
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "sam3-tiny.yaml"
SAMPLES = (8, 32)
METHODS = ("minmax", "entropy")
REFERENCE = "ort-percentile"  # onnxruntime's HistogramCalibrater, for comparison only
MAX_RATIO = 1.2


def build_vision_encoder(output_root: Path) -> Path:
    """The float sam3-tiny vision encoder (exported once, then served from the step cache)."""
    from winml_recipes import api

    result = api.build(RECIPE, output_root=output_root, device="cpu", precision="fp32")
    return Path(result.models["vision_encoder"])


def _feeds(samples: int):
    from winml_recipes.catalog import load_entry
    from winml_recipes.onnx.inputs import make_inputs

    contract = load_entry("sam3-tiny").components["vision_encoder"].contract
    specs, dims = list(contract.inputs), contract.dims

    def factory():
        for i in range(samples):
            yield make_inputs(specs, dims, seed=i, count=1)[0]

    return factory


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _vm_hwm_mb() -> float | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def measure(samples: int, method: str = "minmax", model: Path | str | None = None) -> dict:
    """Calibrate the vision encoder on `samples` samples; meant for a fresh process.

    `model` is the encoder's path (built here when None: building imports the exporter,
    so pass it in when the peak should reflect calibration alone).
    """
    if model is None:
        model = build_vision_encoder(Path(tempfile.mkdtemp(prefix="calib-bench-")))
    model = Path(model)
    feeds = _feeds(samples)
    from winml_recipes.quant.calibrate import CalibrationSettings, calibrate

    before = _peak_rss_mb()
    started = time.perf_counter()
    if method == REFERENCE:
        tensors = _ort_reference(model, feeds)
    else:
        tensors = len(calibrate(model, feeds, CalibrationSettings(method=method)))
    return {
        "method": method,
        "samples": samples,
        "tensors": tensors,
        "seconds": round(time.perf_counter() - started, 3),
        "rss_before_mb": round(before, 1),
        "peak_rss_mb": round(_peak_rss_mb(), 1),
        "vm_hwm_mb": None if (hwm := _vm_hwm_mb()) is None else round(hwm, 1),
    }


def _ort_reference(model: Path, feeds) -> int:
    """onnxruntime's PercentileCalibrater (2048 bins): keeps every sample's outputs."""
    from onnxruntime.quantization.calibrate import CalibrationMethod, create_calibrator

    class Reader:
        def __init__(self) -> None:
            self.it = feeds()

        def get_next(self):
            return next(self.it, None)

    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
        calibrator = create_calibrator(
            model,
            augmented_model_path=str(Path(tmp) / "augmented.onnx"),
            calibrate_method=CalibrationMethod.Percentile,
            extra_options={"num_bins": 2048},
        )
        calibrator.collect_data(Reader())
        return len(calibrator.compute_data().data)


# Forks the measuring interpreter from a fresh, small process (see the module docstring).
_TRAMPOLINE = "import subprocess, sys; sys.exit(subprocess.run(sys.argv[1:]).returncode)"


def measure_in_subprocess(samples: int, method: str, model: Path) -> dict:
    argv = [sys.executable, __file__, "--measure", str(samples), method, str(model)]
    done = subprocess.run(
        [sys.executable, "-c", _TRAMPOLINE, *argv],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"measure({samples}, {method!r}) failed: {tail}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run() -> dict:
    """{method: {8: {...}, 32: {...}, ratio, within_limit}} plus the model path used."""
    results: dict = {"max_ratio": MAX_RATIO}
    with tempfile.TemporaryDirectory(prefix="calib-bench-") as tmp:
        model = build_vision_encoder(Path(tmp))
        for method in (*METHODS, REFERENCE):
            runs = {n: measure_in_subprocess(n, method, model) for n in SAMPLES}
            small, large = runs[SAMPLES[0]], runs[SAMPLES[-1]]
            ratio = large["peak_rss_mb"] / small["peak_rss_mb"]
            results[method] = {
                "runs": list(runs.values()),
                "ratio": round(ratio, 3),
                "growth_mb": round(large["peak_rss_mb"] - small["peak_rss_mb"], 1),
                "reference_only": method == REFERENCE,
                "within_limit": ratio <= MAX_RATIO,
            }
    results["ok"] = all(results[m]["within_limit"] for m in METHODS)
    return results


def main() -> int:
    results = run()
    lo, hi = SAMPLES[0], SAMPLES[-1]
    print(f"calibration peak RSS, sam3-tiny vision encoder ({lo} vs {hi} samples)")
    print(f"{'method':16} {f'{lo} MB':>9} {f'{hi} MB':>9} {'ratio':>7} {'s@' + str(hi):>7}")
    for method in (*METHODS, REFERENCE):
        r = results[method]
        small, large = r["runs"][0], r["runs"][-1]
        note = "  (onnxruntime, reference)" if r["reference_only"] else ""
        print(
            f"{method:16} {small['peak_rss_mb']:9.1f} {large['peak_rss_mb']:9.1f} "
            f"{r['ratio']:7.3f} {large['seconds']:7.2f}{note}"
        )
    print(("OK" if results["ok"] else "FAIL") + f": ratios must be <= {MAX_RATIO}")
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--measure":
        print(json.dumps(measure(int(sys.argv[2]), sys.argv[3], sys.argv[4])))
    else:
        sys.exit(main())
