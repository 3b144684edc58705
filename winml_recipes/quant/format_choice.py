"""`mode: auto` (CPU EPs): static QDQ, unless it misses the task on held-out samples.

The static model (calibrated ranges, the mode a CPU EP runs fastest) is scored on held-out
samples on the target's EP against the float model, by the gates verify will hold it to
(below). Where it holds them it is kept and nothing else runs. Where it does not,
onnxruntime's dynamic quantization is tried, which measures each activation's range on
every run instead of fixing one from calibration:

1. every op type onnxruntime quantizes dynamically (MatMulInteger, ConvInteger, ...);
2. MatMul and Gemm only, convolutions float: what PyTorch's dynamic quantization
   (`torch.ao.quantization.quantize_dynamic`, nn.Linear) does for speech and text
   transformers. Kept only where it quantizes at least MIN_QUANTIZED_FRACTION of the
   MatMul/Conv nodes, so a convolutional network cannot pass as float under an int8 label.

The first candidate that holds every gate is kept; where none does, the static
model is (verify then fails naming the layer where its error starts, which only a QDQ
model can show). Measured on tiny random-weight models at cpu/int8 (docs/families.md):
static misses its gate on EfficientNet (top-1 0.625), MobileViT segmentation (pixels 0.896)
and wav2vec2 CTC (sequences 0 of 4); dynamic holds them (1.0; 0.959; 4 of 4 with MatMul
only).

Each candidate is held to the gates the verify step after it holds the model to (the
recipe's own thresholds, per-output ones and task gates: `held_to`, filled in when
planning), so a candidate those gates would withhold is not kept. Without a verify step it
is held to the task metric's default gates; with neither there is nothing to judge by and
static is kept. magika (a Keras content-type classifier) at cpu/int8 with no task given:
static QDQ misses verify's whole-sample argmax agreement on its softmax (0.625, gate 0.8),
dynamic holds it (1.0).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from winml_recipes.quant.config import QuantConfig
from winml_recipes.sdk.gates import Gate
from winml_recipes.sdk.metrics import TaskMetric

# the share of MatMul/Conv/Gemm nodes a dynamic candidate must quantize (by count)
MIN_QUANTIZED_FRACTION = 0.5
STATIC = "static"
DYNAMIC_ALL = "dynamic"
DYNAMIC_MATMUL = "dynamic-matmul"
DYNAMIC_CANDIDATES: dict[str, tuple[str, ...]] = {
    DYNAMIC_ALL: (),  # every op type onnxruntime quantizes dynamically
    DYNAMIC_MATMUL: ("MatMul", "Gemm"),
}


@dataclass(frozen=True)
class Judge:
    """What a candidate is held to: `held_to` (HeldTo options: verify's gates), else the
    task metric's default gates."""

    metric: TaskMetric | None
    held_to: Mapping[str, Any] | None = None

    @property
    def by(self) -> str:
        """What the candidates were held to, as the console and the manifest say it."""
        if self.held_to is None:
            assert self.metric is not None
            return f"{self.metric.name}'s default gates"
        what = self.metric.name if self.metric is not None else "per output"
        return f"verify's gates ({what})"

    def judge(self, reference: Sequence[dict], outputs: Sequence[dict]) -> tuple[dict, list[str]]:
        """(the values it judged by, the gates missed as 'what value (gate >= t)')."""
        from winml_recipes.onnx.metrics import output_metrics
        from winml_recipes.sdk.held_to import judged, task_gates

        values = self.metric.values(reference, outputs) if self.metric is not None else None
        if self.held_to is None:
            assert self.metric is not None and values is not None
            known = {k: t.threshold for k, t in self.metric.gates.items() if k in values}
            gates = task_gates(self.metric, values, known)
        else:
            gates = judged(self.held_to, self.metric, values, output_metrics(reference, outputs))
        missed = [_missed(g) for g in gates if not g.holds]
        record: dict[str, Any] = {}
        if values is not None:
            record["task_metric"] = {k: round(v, 4) for k, v in values.items()}
        outputs_held = {f"{g.output}: {g.metric}": round(g.value, 4) for g in gates
                        if g.output != "task" and not g.advisory}  # fmt: skip
        if outputs_held:
            record["outputs"] = outputs_held
        return record, missed


def _brief(missed: Sequence[str], shown: int = 3) -> str:
    """The first `shown` missed gates, and how many more (a model of many outputs)."""
    more = f"; and {len(missed) - shown} more" if len(missed) > shown else ""
    return "; ".join(missed[:shown]) + more


def _missed(gate: Gate) -> str:
    sign = ">=" if gate.higher_is_better else "<="
    what = gate.metric if gate.output == "task" else f"{gate.output}: {gate.metric}"
    return f"{what} {gate.value:.4g} (gate {sign} {gate.threshold:g})"


def dynamic_config(cfg: QuantConfig, op_types: tuple[str, ...]) -> QuantConfig:
    """`cfg` as onnxruntime's dynamic quantization runs it: run-time uint8 activations,
    the precision's weight type, no calibration; `op_types` within the recipe's own."""
    if op_types and cfg.op_types:
        op_types = tuple(t for t in op_types if t in cfg.op_types)
    return replace(
        cfg, mode="dynamic", format="qoperator", activation_type="uint8", ep_rules=False,
        calibration=None, regions=(), auto=None, algorithms=(), algorithms_auto=None,
        op_types=op_types or cfg.op_types,
    )  # fmt: skip


def why_no_dynamic(cfg: QuantConfig) -> str | None:
    """Why dynamic candidates would not be what the recipe asked for (None: they are)."""
    if cfg.activation_type.endswith("16"):
        return f"{cfg.activation_type} activations asked for; dynamic quantization runs uint8"
    if cfg.regions or cfg.auto:
        return "the recipe sets mixed_precision, which dynamic quantization cannot keep"
    if cfg.algorithms or cfg.algorithms_auto:
        return "the recipe sets algorithms, which need calibrated (static) ranges"
    return None


def choose_format(
    out: Path,
    work: Path,
    quantize_static: Callable[[Path], dict[str, Any]],
    quantize_dynamic: Callable[[Path, QuantConfig], dict[str, Any]],
    held_out: Sequence[dict],
    reference: Callable[[], list[dict]],
    judge: Judge | None,
    cfg: QuantConfig,
    device: str,
    progress: Callable[[str, int, int], None] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Quantize into `out` with the first candidate `judge` passes on `held_out`; returns
    (the kept candidate's metrics, the record). `quantize_static(dest)` and
    `quantize_dynamic(dest, cfg)` write a candidate and return its step metrics;
    `reference()` gives the float model's outputs for `held_out`."""
    from winml_recipes.runtime.target import run_on_target

    started = time.perf_counter()
    static_dest = work / "format-static" / "model.onnx"
    static_dest.parent.mkdir(parents=True, exist_ok=True)
    kept_metrics = quantize_static(static_dest)
    record: dict[str, Any] = {"kept": STATIC, "tried": []}
    if judge is None:
        _move(static_dest, out)
        record["why"] = "no task metric and no verify step to judge by: static QDQ kept unscored"
        return kept_metrics, record
    float_outputs = reference()
    planned = 1 + len(DYNAMIC_CANDIDATES)

    def score(name: str, dest: Path, metrics: dict[str, Any]) -> list[str]:
        op_types = DYNAMIC_CANDIDATES.get(name) or cfg.op_types
        t0 = time.perf_counter()
        outputs = run_on_target(dest, held_out, device, ep=cfg.ep).outputs
        values, missed = judge.judge(float_outputs, outputs)
        record["tried"].append({
            "candidate": name,
            "activation_type": metrics.get("activation_type"),
            "op_types": list(op_types) or "all",
            "matmul_conv_quantized_fraction": metrics.get("matmul_conv_quantized_fraction"),
            **values,
            "missed": missed,
            "seconds": round(time.perf_counter() - t0, 2),
        })  # fmt: skip
        return missed

    if progress:
        progress("format candidates", 1, planned)
    missed = score(STATIC, static_dest, kept_metrics)
    if not missed:
        _move(static_dest, out)
        record["why"] = f"static QDQ holds {judge.by} on held-out samples"
        return kept_metrics, _timed(record, started, len(held_out))
    refused = why_no_dynamic(cfg)
    if refused is not None:
        _move(static_dest, out)
        record["why"] = (
            f"static QDQ misses {judge.by} on held-out samples ({_brief(missed)}); "
            f"dynamic candidates not tried: {refused}"
        )
        return kept_metrics, _timed(record, started, len(held_out))
    for i, (name, op_types) in enumerate(DYNAMIC_CANDIDATES.items(), start=2):
        if progress:
            progress("format candidates", i, planned)
        dest = work / f"format-{name}" / "model.onnx"
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            metrics = quantize_dynamic(dest, dynamic_config(cfg, op_types))
        except Exception as exc:  # onnxruntime's quantizer on a graph it cannot take
            record["tried"].append({"candidate": name, "error": _summary(exc)})
            continue
        fraction = metrics.get("matmul_conv_quantized_fraction", 0.0)
        if fraction < MIN_QUANTIZED_FRACTION:
            record["tried"].append({
                "candidate": name, "matmul_conv_quantized_fraction": fraction,
                "skipped": f"quantizes {fraction:.0%} of the MatMul/Conv nodes (needs "
                           f"{MIN_QUANTIZED_FRACTION:.0%})",
            })  # fmt: skip
            continue
        try:
            missed_here = score(name, dest, metrics)
        except Exception as exc:  # a dynamic graph the CPU EP cannot load or run
            record["tried"].append({"candidate": name, "error": _summary(exc)})
            continue
        if not missed_here:
            _move(dest, out)
            record["kept"] = name
            record["why"] = (
                f"static QDQ misses {judge.by} on held-out samples "
                f"({_brief(missed)}); {name} holds them"
            )
            return metrics, _timed(record, started, len(held_out))
    _move(static_dest, out)
    record["why"] = (
        f"static QDQ misses {judge.by} on held-out samples ({_brief(missed)}) "
        "and no dynamic candidate holds them: static kept (verify names where its error starts)"
    )
    return kept_metrics, _timed(record, started, len(held_out))


def _timed(record: dict[str, Any], started: float, samples: int) -> dict[str, Any]:
    return record | {"samples": samples, "seconds": round(time.perf_counter() - started, 2)}


def _move(src: Path, out: Path) -> None:
    """The kept candidate, with the external-data files it references, to `out` (their
    names unchanged: the model refers to them by name)."""
    from winml_recipes.onnx.io import sidecar_paths

    out.parent.mkdir(parents=True, exist_ok=True)
    for sidecar in sidecar_paths(src):
        shutil.move(sidecar, out.parent / sidecar.name)
    shutil.move(src, out)


def _summary(exc: Exception) -> str:
    """An exception's message on one line (its last line: where tracebacks put it)."""
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    return f"{type(exc).__name__}: {lines[-1][:200]}"
