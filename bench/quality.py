"""What moves the SAM 3 decoder's quality (sam3-tiny, random weights: plumbing and method).

Builds the decoder under several quantization settings and measures each output's SQNR
against the float model on held-out inputs (fresh images through the float encoder, fresh
prompts). The baseline of each table is measured in the same run.

    python bench/quality.py        (also part of `make bench`)
"""

from __future__ import annotations

import json
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SAMPLES = 16
SEED = 4242

VARIANTS = [
    ("w8a16", "naive: synthetic calibration, 16 samples", "{calibration: {samples: 16}}"),
    (
        "w8a16",
        "encoder-fed calibration, 16 samples",
        "{calibration: {samples: 16, inputs_from: vision_encoder}}",
    ),
    (
        "w8a16",
        "encoder-fed calibration, 64 samples (recipe)",
        "{calibration: {samples: 64, inputs_from: vision_encoder}}",
    ),
    (
        "uint8",
        "encoder-fed calibration, 64 samples",
        "{calibration: {samples: 64, inputs_from: vision_encoder}}",
    ),
    (
        "uint8",
        "+ auto mixed precision, target 20 dB (recipe)",
        "{calibration: {samples: 64, inputs_from: vision_encoder}, "
        "mixed_precision: {auto: {target_sqnr_db: 20, max_promoted: 16}}}",
    ),
]


def _recipe(directory: Path, precision: str, options: str) -> Path:
    path = directory / "recipes" / f"q-{precision}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        textwrap.dedent(f"""\
        schema_version: 1
        name: q-{precision}
        model: sam3-tiny
        targets: [{{device: npu, precision: {precision}}}]
        components:
          vision_encoder:
            steps: [export, fix_shapes, {{quantize: {{calibration: {{samples: 16}}}}}}]
          prompt_encoder_mask_decoder:
            steps: [export, fix_shapes, {{quantize: {options}}}]
        """)
    )
    return path


def held_out_sqnr(float_models: dict[str, Path], decoder: Path) -> dict[str, float]:
    from winml_recipes.catalog import load_entry
    from winml_recipes.feeds import feeds_for, take
    from winml_recipes.onnx.metrics import compare_runs
    from winml_recipes.runtime.sessions import run_model
    from winml_recipes.sdk.types import UpstreamComponent

    entry = load_entry("sam3-tiny")
    enc = entry.components["vision_encoder"].contract
    dec = entry.components["prompt_encoder_mask_decoder"].contract
    up = UpstreamComponent("vision_encoder", float_models["vision_encoder"], "", enc, None)
    feeds = take(
        feeds_for(
            {"inputs_from": "vision_encoder"}, dec, REPO, {"vision_encoder": up}, SAMPLES, SEED
        ),
        SAMPLES,
    )
    reference = run_model(float_models["prompt_encoder_mask_decoder"], feeds)
    metrics = compare_runs(reference, run_model(decoder, feeds))
    return {name: round(m["sqnr_db"], 1) for name, m in metrics.items()}


def run() -> list[dict]:
    from winml_recipes import api

    rows = []
    with tempfile.TemporaryDirectory(prefix="quality-bench-") as tmp:
        root = Path(tmp)
        float_build = api.build(
            REPO / "recipes" / "sam3-tiny.yaml",
            device="npu",
            precision="fp32",
            output_root=root / "float",
        )
        for precision, label, options in VARIANTS:
            recipe = _recipe(root / label.replace(" ", "_")[:20], precision, options)
            built = api.build(recipe, output_root=root / "out")
            steps = built.manifest["components"]["prompt_encoder_mask_decoder"]["steps"]
            quant = next(s for s in steps if s["pass"] == "quantize")["metrics"]
            auto = quant.get("mixed_precision_auto") or {}
            rows.append(
                {
                    "precision": precision,
                    "setting": label,
                    "sqnr_db": held_out_sqnr(
                        float_build.models, built.models["prompt_encoder_mask_decoder"]
                    ),
                    "matmul_conv_quantized_fraction": quant["matmul_conv_quantized_fraction"],
                    "promoted_to_16bit": len(auto.get("promoted", [])),
                }
            )
    return rows


def main() -> int:
    rows = run()
    print(f"SAM 3 tiny decoder vs float, held-out ({SAMPLES} prompts on fresh images), dB")
    print(
        f"{'prec':6} {'setting':48} {'pred_masks':>10} {'iou':>6} {'obj':>6} {'MC q':>5} {'16b':>4}"
    )
    for r in rows:
        s = r["sqnr_db"]
        print(
            f"{r['precision']:6} {r['setting']:48} {s['pred_masks']:10.1f} "
            f"{s['iou_scores']:6.1f} {s['object_score_logits']:6.1f} "
            f"{r['matmul_conv_quantized_fraction']:5.2f} {r['promoted_to_16bit']:4d}"
        )
    out = REPO / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "quality.json").write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
