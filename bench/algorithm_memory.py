"""Peak memory and wall time of quantize's weight tuning (SeqMSE, bias correction) against
plain calibration, on sam3-mid's vision encoder (npu/w8a16).

The encoder (sam3-mid's config: full widths, 2 ViT layers and the neck, seeded random
weights) is exported with static shapes at `--side` px (tests/sam3_blocks.py, `encoder2`;
1008 is the catalog's size). One build runs the steps before quantize (normalize,
fix_shapes, prepare's ep stage, preflight) into a shared cache; then each variant is the
same recipe with `quantize: {calibration: {samples: N}, algorithms: [...]}`, built in a
fresh process from that cache, so the process's peak RSS is the quantize step's. The
calibration samples are the same seeded ones in every variant. Reported: the quantize
step's wall time and peak RSS (the manifest's), and each variant's peak over plain's; the
gate is 1.5x.

    python bench/algorithm_memory.py                      # 504 px (make bench)
    python bench/algorithm_memory.py --side 1008          # the catalog's size, ~x4 slower
    python bench/algorithm_memory.py --model enc.onnx     # an already exported encoder

`--cap-gb` stops a build whose RSS passes it (a watchdog; reported as stopped).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

VARIANTS = {
    "plain": [],
    "seqmse": ["seqmse"],
    "bias_correction": ["bias_correction"],
    "seqmse+bias_correction": ["seqmse", "bias_correction"],
}
MAX_RATIO = 1.5
# 504 px on 2 cores: the 1008 px encoder's activations are 4x larger and its global
# attention 16x (one quantize variant there takes minutes); 504 keeps `make bench` short.
DEFAULT_SIDE = 504
SAMPLES = 4
PREFIX = ["normalize", "fix_shapes", {"prepare": {"stages": ["ep"]}}, "preflight"]

# In the measured process: one build from the shared cache; the quantize step's figures.
_BUILD = """
import json, sys, time
from winml_recipes import api
from winml_recipes.engine import run
# the build's report.html runs the float and quantized models on a photo (minutes at
# 1008 px on the CPU EP), after quantize: not what is measured here
run._write_report = lambda *args, **kwargs: None
started = time.perf_counter()
result = api.build(sys.argv[1], output_root=sys.argv[2])
steps = result.manifest["components"]["model"]["steps"]
q = next((s for s in steps if s["pass"] == "quantize"), None)
from winml_recipes.runtime.memory import peak_rss_mb
row = {"process_seconds": round(time.perf_counter() - started, 1), "process_peak_mb": peak_rss_mb()}
if q is not None:
    algos = (q.get("metrics") or {}).get("algorithms") or {}
    w = algos.get("weights") or {}
    row |= {"status": q["status"], "quantize_s": q.get("wall_seconds"),
            "quantize_peak_mb": q.get("peak_rss_mb"), "tuned_layers": w.get("tuned"),
            "narrowed": len((w.get("seqmse") or {}).get("narrowed", [])),
            "corrected": len((w.get("bias_correction") or {}).get("corrected", [])),
            "tuning_s": w.get("seconds"), "stopped": w.get("stopped")}
print(json.dumps(row))
"""


def export(side: int, out: Path) -> Path:
    from tests.sam3_blocks import export_block

    return export_block(side, "encoder2", out)


def write_project(root: Path, model: Path, name: str, algorithms: list[str] | None) -> Path:
    """root/catalog/<entry> (from the graph) + root/recipes/NAME.yaml; quantize when
    `algorithms` is not None."""
    from winml_recipes.authoring import onnx_entry

    entry, _ = onnx_entry(model, "encoder", {})
    (root / "catalog").mkdir(parents=True, exist_ok=True)
    (root / "recipes").mkdir(exist_ok=True)
    (root / "catalog" / "encoder.yaml").write_text(yaml.safe_dump(entry, sort_keys=False))
    steps: list = list(PREFIX)
    if algorithms is not None:
        quantize: dict = {"calibration": {"samples": SAMPLES}}
        if algorithms:
            quantize["algorithms"] = algorithms
        steps.append({"quantize": quantize})
    recipe = {
        "schema_version": 1,
        "name": name,
        "model": "encoder",
        "description": "bench/algorithm_memory.py",
        "targets": [{"device": "npu", "precision": "w8a16"}],
        "components": {"model": {"steps": steps}},
    }
    path = root / "recipes" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def run(side: int, model: Path | None, cap_gb: float | None, variants: list[str]) -> dict:
    from capped import capped_python as _python

    cap_mb = cap_gb * 1024 if cap_gb else None
    with tempfile.TemporaryDirectory(prefix="winml-bench-algomem-") as tmp:
        work = Path(tmp)
        os.environ["WINML_RECIPES_CACHE"] = str(work / "cache")
        # the builds' reports would add a per-layer float/quantized comparison: not measured
        os.environ["WINML_RECIPES_REPORT_LAYERS"] = "0"
        if model is None:
            model = export(side, work / f"encoder_{side}.onnx")
        prefix = write_project(work, model, "prefix", None)
        rows: dict = {"prefix": _python(_BUILD, str(prefix), str(work / "out"), cap_mb=cap_mb)}
        for name in variants:
            recipe = write_project(work, model, name.replace("+", "-"), VARIANTS[name])
            rows[name] = _python(_BUILD, str(recipe), str(work / "out"), cap_mb=cap_mb)
    plain = rows.get("plain", {}).get("quantize_peak_mb")
    for name in variants:
        peak = rows[name].get("quantize_peak_mb")
        if plain and peak and name != "plain":
            rows[name]["ratio"] = round(peak / plain, 3)
            rows[name]["ok"] = peak / plain <= MAX_RATIO
    return {"side": side, "samples": SAMPLES, "max_ratio": MAX_RATIO, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", type=int, default=DEFAULT_SIDE)
    parser.add_argument("--model", type=Path, help="an exported encoder (skips the export)")
    parser.add_argument("--cap-gb", type=float, default=None)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args(argv)
    result = run(args.side, args.model, args.cap_gb, args.variants.split(","))
    out = REPO / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / f"algorithm_memory_{result['side']}.json").write_text(
        json.dumps(result, indent=2) + "\n"
    )
    print(f"quantize algorithms, sam3-mid vision encoder at {result['side']} px, "
          f"npu/w8a16, {result['samples']} calibration samples")  # fmt: skip
    print(f"{'variant':24} {'quantize s':>10} {'tuning s':>9} {'peak MB':>9} {'x plain':>8}")
    ok = True
    for name, r in result["rows"].items():
        if name == "prefix":
            continue
        if "quantize_peak_mb" not in r:
            print(f"{name:24} {r.get('stopped') or r.get('error') or r}")
            ok = False
            continue
        ratio = r.get("ratio")
        ok &= r.get("ok", True)
        print(f"{name:24} {r['quantize_s'] or 0:10.1f} {r.get('tuning_s') or 0:9.1f} "
              f"{r['quantize_peak_mb'] or 0:9.0f} "
              f"{'' if ratio is None else f'{ratio:8.2f}'}")  # fmt: skip
    print(("OK" if ok else "FAIL") + f": peak within {MAX_RATIO}x of plain calibration's")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
