"""verify's per-layer record: what report.html plots, measured while verify has the target.

After its gates pass, verify of a quantized npu build whose models are small compares every
quantized activation of its first sample on the target and on the CPU simulation against
the float model (quant/divergence.py), reusing the untouched model's outputs on the target
it already has; the rows go into the step's record (`layers`), so the report reads them
and never runs the model again. Off where the models are large, or with
WINML_RECIPES_REPORT_LAYERS=0 (then `winml-recipes report --layers` computes it on request).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

LAYERS_ENV = "WINML_RECIPES_REPORT_LAYERS"  # 0: verify records no per-layer comparison
LAYERS_MAX_MB = 64.0  # recorded by default only for models this small (candidate + float)
QUANTIZED = ("uint8", "int8", "w8a16")


def model_mb(path: Path) -> float:
    """A model file and its external data, in MB."""
    return sum(f.stat().st_size for f in path.parent.glob(f"{path.name}*") if f.is_file()) / 1e6


def why_not(src: Path, reference: Path, device: str, precision: str, ran_on: str) -> str | None:
    """Why verify records no per-layer comparison here (None: it does)."""
    if os.environ.get(LAYERS_ENV) == "0":
        return f"turned off ({LAYERS_ENV}=0)"
    if device != "npu" or precision not in QUANTIZED:
        return f"recorded only for quantized npu builds ({device}/{precision} is not one)"
    if ran_on in ("cpu", "cpu-simulation"):
        return "verify did not run the model on the target"
    size = model_mb(src) + model_mb(reference)
    if size > LAYERS_MAX_MB:
        return f"models of {size:.0f} MB, above the {LAYERS_MAX_MB:.0f} MB default cap"
    return None


def layer_record(
    src: Path,
    reference: Path,
    feed: Mapping[str, Any],
    untapped: Mapping[str, Any],
    device: str,
    ep: str,
    threshold_db: float = 30.0,
) -> dict[str, Any]:
    """The per-layer rows of one sample (graph order), the first divergence, and what the
    extra outputs changed; an error is recorded as one line (the report says it)."""
    from winml_recipes.quant.divergence import compare_tensors, first_divergence

    started = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="winml-layers-") as tmp:
            rows, record = compare_tensors(
                src, reference, [feed], device, Path(tmp), ep, untapped=[untapped]
            )
    except Exception as exc:  # the plot is evidence, not a gate: say why it is missing
        text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return {"error": text[:300]}
    first = first_divergence(rows, threshold_db)
    return {
        "sample": 0,
        "columns": [
            "tensor",
            "op_type",
            "target_vs_float_db",
            "simulation_vs_float_db",
            "target_vs_simulation_db",
        ],
        "rows": [
            [
                r.tensor,
                r.op_type,
                round(r.target_vs_float_db, 2),
                round(r.simulation_vs_float_db, 2),
                round(r.target_vs_simulation_db, 2),
            ]
            for r in rows
        ],
        "first_divergence": first.tensor if first is not None else None,
        "threshold_db": threshold_db,
        "tapped_vs_untapped_db": record.get("tapped_vs_untapped_db"),
        "seconds": round(time.perf_counter() - started, 2),
    }


def rows_of(layers: Mapping[str, Any]) -> Sequence[dict[str, Any]]:
    """A recorded `layers` block's rows as dicts keyed by its columns."""
    columns = layers.get("columns") or []
    return [dict(zip(columns, row, strict=False)) for row in layers.get("rows") or []]
