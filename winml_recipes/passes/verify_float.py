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


def note(reference: list[dict[str, Any]], feeds: list[dict[str, Any]]) -> str:
    """What the float outputs were and what to check, for the failure message."""
    if distinct_samples(feeds) < 2:
        return (
            f"; the {len(feeds)} held-out inputs are all the same: give verify distinct "
            "samples (the data file, or verify.samples)"
        )
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
# The default level's run may round differently (fused integer kernels), but it must not be
# further from float than the run verify judged by more than this: legitimate rounding moves
# an output a few dB (sam3-tiny's decoder at cpu/int8: object_score_logits 32.0 -> 28.4 dB
# on two samples), a fusion that computes something else lands near 0 dB. Measured: healthy
# cpu/int8 builds agree with themselves at BASIC and ALL to 276-338 dB (tiny ViT, ResNet,
# ConvNeXt, ConvNeXt V2, MobileNet V2, Swin); MobileViT's differ (28 dB between the levels)
# at the same distance from float; EfficientNet's quantized whole-map AveragePool gave 0
# for every logit at ALL (0 dB vs float, against 12 dB verified).
DEFAULT_LEVEL_MAX_LOSS_DB = 10.0
# At or above this SQNR vs float (an error of 1% of the signal) a run is right to any purpose,
# however much closer the verified run was: its change is not counted. A float build at ALL
# fuses LayerNormalization or Gelu and rounds differently from BASIC; a QDQ Softmax fused
# into QLinearSoftmax (a table of 8-bit outputs) moved mtcnn-onet's face_prob from 59.5 dB
# (BASIC) to 48.5 dB at cpu/int8, which withheld a right model. A fusion that computes
# something else lands far below it (EfficientNet's pool: 0 dB).
RIGHT_ENOUGH_DB = 40.0


def default_level_record(
    verified: dict[str, dict[str, float]], default: dict[str, dict[str, float]]
) -> dict[str, dict[str, float]]:
    """Per output: SQNR vs float of the verified (BASIC) run and of the default-level run."""
    return {
        name: {"verified_sqnr_db": verified[name]["sqnr_db"], "sqnr_db": default[name]["sqnr_db"]}
        for name in verified
    }


def default_level_gate(record: dict[str, dict[str, float]]) -> Gate:
    """The worst output's SQNR change (default level minus verified run), >= -10 dB."""
    worst = min(_change(m) for m in record.values())
    return Gate(DEFAULT_LEVEL, "sqnr_change_db", float(worst), -DEFAULT_LEVEL_MAX_LOSS_DB)


def default_level_note(record: dict[str, dict[str, float]]) -> str:
    name, worst = min(record.items(), key=lambda kv: _change(kv[1]))
    return (
        f"; at onnxruntime's default optimization level (ALL, what an InferenceSession in an "
        f"app uses) the model computes something else: {name} {worst['sqnr_db']:.1f} dB vs "
        f"float against {worst['verified_sqnr_db']:.1f} dB in the verified run (BASIC): an "
        "onnxruntime graph fusion changes it; keep the evidence and report it, or set the "
        "app's graph_optimization_level to BASIC"
    )


def _change(m: dict[str, float]) -> float:
    return 0.0 if m["sqnr_db"] >= RIGHT_ENOUGH_DB else m["sqnr_db"] - m["verified_sqnr_db"]
