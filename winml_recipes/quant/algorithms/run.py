"""Running the algorithms inside the quantize pass: the float rewrites on the model before
calibration, the weight tuning on a first quantized model; each returns its record."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from winml_recipes.sdk.errors import PassError

# A float rewrite is exact when the outputs move by at most this, relative to their range.
EXACT_RTOL = 1e-3
EXACT_SAMPLES = 2
# SeqMSE keeps a narrower range only when it lowers the layer's output error by this share.
SEQMSE_MIN_GAIN = 0.02


def float_rewrites(
    model: onnx.ModelProto,
    src: Path,
    algorithms: Sequence[str],
    feeds: Callable,
    samples: int,
    work_dir: Path,
) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """CLE then SmoothQuant on `model` (loaded from `src`): the rewritten model and records."""
    import onnx_ir as ir

    from winml_recipes.quant.algorithms import cle, smoothquant
    from winml_recipes.quant.algorithms.layers import collect_inputs

    record: dict[str, Any] = {}
    started = time.perf_counter()
    irm = ir.serde.deserialize_model(model)
    if "cle" in algorithms:
        record["cle"] = {"pairs": cle.equalize(irm)}
    if "smoothquant" in algorithms:
        found = smoothquant.sites(irm)
        amax = {}
        if found:
            current = ir.serde.serialize_model(irm)
            for name, values in collect_inputs(
                src, current, list(found), feeds, samples, work_dir / "smoothquant"
            ):
                amax[name] = np.max(
                    [np.abs(v).reshape(-1, v.shape[-1]).max(0) for v in values], axis=0
                )
        record["smoothquant"] = {
            "alpha": smoothquant.ALPHA,
            "outlier_ratio": smoothquant.OUTLIER_RATIO,
            "candidates": len(found),
            "smoothed": smoothquant.smooth(irm, amax),
        }
    rewritten = ir.serde.serialize_model(irm)
    record["max_relative_change"] = _exactness(model, rewritten, feeds, work_dir)
    record["seconds"] = round(time.perf_counter() - started, 3)
    return rewritten, record


def _exactness(before: onnx.ModelProto, after: onnx.ModelProto, feeds, work_dir: Path) -> float:
    """The largest output change on a few calibration samples, relative to the output's
    largest |value|; a PassError when a rewrite that should be exact is not."""
    from winml_recipes.feeds import take
    from winml_recipes.onnx.io import save_model
    from winml_recipes.runtime.sessions import run_model

    sample = take(feeds, EXACT_SAMPLES)
    a = run_model(save_model(before, work_dir / "exact-before" / "model.onnx"), sample)
    b = run_model(save_model(after, work_dir / "exact-after" / "model.onnx"), sample)
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        for name in x:
            ref = np.asarray(x[name], np.float64)
            if ref.dtype.kind != "f" or ref.size == 0:
                continue
            scale = max(float(np.abs(ref).max()), 1e-12)
            worst = max(worst, float(np.abs(ref - y[name]).max()) / scale)
    if worst > EXACT_RTOL:
        raise PassError(
            f"quantize.algorithms: the float rewrites changed the outputs by {worst:.2e} of "
            "their range (they should be exact); remove cle/smoothquant and report this model"
        )
    return float(f"{worst:.3g}")


def tune_weights(
    float_src: Path,
    quantized: Path,
    algorithms: Sequence[str],
    feeds: Callable,
    samples: int,
    work_dir: Path,
    progress: Callable[[str, int, int | None], None],
    budget_seconds: float,
) -> tuple[Path | None, dict[str, Any]]:
    """SeqMSE ranges and bias correction from the calibration inputs: the float model with
    tuned weights (to quantize again), or None when nothing changed; the records."""
    from winml_recipes.onnx.io import load_model, save_model
    from winml_recipes.quant.algorithms import bias_correction, seqmse
    from winml_recipes.quant.algorithms.layers import (
        LayerRunner,
        collect_inputs,
        fake_quant,
        initializer,
        quantized_weights,
        second_moment_rows,
        set_initializer,
        weight_layers,
    )

    started = time.perf_counter()
    model = load_model(float_src)
    layers = weight_layers(model)
    specs = quantized_weights(load_model(quantized), layers)
    uses: dict[str, int] = {}
    for la in layers:
        uses[la.weight] = uses.get(la.weight, 0) + 1
    layers = [la for la in layers if la.weight in specs and uses[la.weight] == 1]
    by_input: dict[str, list] = {}
    for la in layers:
        by_input.setdefault(la.input, []).append(la)
    seq: list[dict] = []
    bias: list[dict] = []
    skipped: list[dict] = []
    done = 0
    out_of_time = False
    for tensor, inputs in collect_inputs(
        float_src, model, list(by_input), feeds, samples, work_dir / "layer-inputs"
    ):
        for la in by_input[tensor]:
            if time.perf_counter() - started > budget_seconds:
                out_of_time = True
                break
            spec = specs[la.weight]
            w = initializer(model, la.weight).astype(np.float32)
            step = np.abs(spec.dequantized - fake_quant(w, spec)).max()
            if step > 1e-6 * max(float(np.abs(w).max()), 1e-12):
                skipped.append({"layer": la.node, "reason": "quantizer's rounding not reproduced"})
                continue
            run = LayerRunner(model, la)
            w_q = spec.dequantized
            if "seqmse" in algorithms:
                # MatMul/Gemm: the output error over K rows with the inputs' second moment
                # (exact), instead of every row of every sample
                folded = second_moment_rows(la, inputs) or inputs
                ratio, before, after = seqmse.choose_ratio(la, w, spec, folded, run)
                del folded
                if after < before * (1 - SEQMSE_MIN_GAIN):
                    clipped = seqmse.apply(w, spec, ratio)
                    set_initializer(model, la.weight, clipped)
                    w_q = fake_quant(clipped, spec)
                    seq.append({
                        "layer": la.node,
                        "range_fraction": _summary(ratio),
                        "output_error_ratio": round(after / before, 4) if before else 1.0,
                    })  # fmt: skip
            if "bias_correction" in algorithms:
                entry = _correct_bias(model, la, w, w_q, inputs, run, bias_correction)
                (bias if "shift" in entry else skipped).append(entry)
            done += 1
            progress("algorithm layers", done, len(layers))
        del inputs
        if out_of_time:
            break
    record: dict[str, Any] = {"layers": len(layers), "tuned": done, "skipped": skipped}
    if "seqmse" in algorithms:
        record["seqmse"] = {"grid": [seqmse.GRID[0], seqmse.GRID[-1], len(seqmse.GRID)],
                            "narrowed": seq}  # fmt: skip
    if "bias_correction" in algorithms:
        record["bias_correction"] = {"corrected": bias}
    if out_of_time:
        record["stopped"] = f"time budget of {budget_seconds:g} s spent after {done} layers"
    record["seconds"] = round(time.perf_counter() - started, 3)
    if not seq and not bias:
        return None, record
    return save_model(model, work_dir / "tuned" / "model.onnx"), record


def _summary(ratio: np.ndarray) -> dict[str, float] | float:
    r = np.asarray(ratio, np.float64).reshape(-1)
    if r.size == 1:
        return round(float(r[0]), 4)
    return {"min": round(float(r.min()), 4), "mean": round(float(r.mean()), 4)}


def _correct_bias(model, la, w, w_q, inputs, run, bias_correction) -> dict[str, Any]:
    """Subtract the layer's output shift from its bias (adding a bias to a Conv/Gemm)."""
    from onnx import numpy_helper

    from winml_recipes.quant.algorithms.layers import initializer, set_initializer

    shift = bias_correction.output_shift(la, w, w_q, inputs, run)
    if la.bias is not None:
        b = initializer(model, la.bias).astype(np.float32)
        if la.op == "Gemm":  # Gemm adds beta * C
            (node,) = [n for n in model.graph.node if n.name == la.node]
            beta = next((a.f for a in node.attribute if a.name == "beta"), 1.0)
            shift = shift / beta if beta else shift * 0
        set_initializer(model, la.bias, b - shift)
    elif la.op == "Conv" or la.op == "Gemm":
        (node,) = [n for n in model.graph.node if n.name == la.node]
        if la.op == "Gemm":
            beta = next((a.f for a in node.attribute if a.name == "beta"), 1.0)
            shift = shift / beta if beta else shift * 0
        name = f"{la.node}_corrected_bias"
        model.graph.initializer.append(numpy_helper.from_array(-shift.astype(np.float32), name))
        while len(node.input) < 2:
            node.input.append("")
        if len(node.input) == 2:
            node.input.append(name)
        else:
            node.input[2] = name
    else:
        return {"layer": la.node, "reason": "MatMul without a constant bias Add"}
    return {"layer": la.node, "shift": round(float(np.abs(shift).mean()), 6)}
