"""A float reference that gives the same outputs whatever its input cannot judge a build.

A random-weight model whose activations vanish layer by layer (transformers' default init
on a deep CNN) or a model fed the wrong preprocessing can answer every held-out sample
alike: its quantized build then "agrees" with it perfectly (SQNR at its cap, top-1
agreement 1.0) while it says nothing. verify holds the float outputs to a gate: at least
two held-out samples must be told apart by some output."""

from __future__ import annotations

from typing import Any

import numpy as np

from winml_recipes.sdk.gates import Gate

METRIC = "distinct_samples"


def distinct_samples(reference: list[dict[str, Any]]) -> int:
    """How many of the held-out samples the float model answers differently (all its outputs
    compared together, exactly)."""
    seen: list[dict[str, Any]] = []
    for outputs in reference:
        if not any(_same(outputs, other) for other in seen):
            seen.append(outputs)
    return len(seen)


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(
        np.shape(a[k]) == np.shape(b[k]) and np.array_equal(a[k], b[k]) for k in a
    )


def gate(reference: list[dict[str, Any]]) -> Gate | None:
    """The gate on the float outputs; None when there are fewer than two samples."""
    if len(reference) < 2:
        return None
    return Gate("float model", METRIC, float(distinct_samples(reference)), 2.0)


def note(reference: list[dict[str, Any]]) -> str:
    """What the float outputs were and what to check, for the failure message."""
    first = reference[0]
    shown = []
    for name, value in list(first.items())[:3]:
        array = np.asarray(value)
        if array.size and np.issubdtype(array.dtype, np.number) and np.all(array == array.flat[0]):
            shown.append(f"{name} all {array.flat[0]:.4g}")
        else:
            shown.append(f"{name} the same array")
    return (
        f"; the float model gives the same outputs for all {len(reference)} held-out samples "
        f"({', '.join(shown)}), so no comparison with it can judge the build: check its "
        "weights (random weights whose activations vanish?) and the input preprocessing"
    )


DEFAULT_LEVEL = "onnxruntime default level"
# Healthy cpu/int8 builds agree with themselves at BASIC and at ALL to 276-338 dB (tiny ViT,
# ResNet, ConvNeXt, ConvNeXt V2, MobileNet V2, Swin, measured): the fusions compute the
# same QDQ arithmetic. A fusion that computes something else lands far below (EfficientNet's
# whole-map AveragePool: 0 dB, every logit 0).
DEFAULT_LEVEL_MIN_SQNR_DB = 40.0


def default_level_gate(agreement: dict[str, dict[str, float]]) -> Gate:
    """The verified (BASIC) run against the same model at onnxruntime's default level, by
    the worst output's SQNR."""
    worst = min(m["sqnr_db"] for m in agreement.values())
    return Gate(DEFAULT_LEVEL, "sqnr_db", float(worst), DEFAULT_LEVEL_MIN_SQNR_DB)


def default_level_note(agreement: dict[str, dict[str, float]]) -> str:
    name, worst = min(agreement.items(), key=lambda kv: kv[1]["sqnr_db"])
    return (
        f"; at onnxruntime's default optimization level (ALL, what an InferenceSession in an "
        f"app uses) the model computes something else: {name} {worst['sqnr_db']:.1f} dB "
        "against the verified run (BASIC): an onnxruntime graph fusion changes it; keep the "
        "evidence and report it, or set the app's graph_optimization_level to BASIC"
    )
