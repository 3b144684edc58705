"""Quality gates as records: what was measured, the threshold, the margin, the verdict.

`verify` makes them, the manifest stores them (`gates`), the console prints them and a
failed build names the failing ones: one typed record read by every consumer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# metric -> (what it is called on the console, unit, True when higher is better)
_METRICS: dict[str, tuple[str, str, bool]] = {
    "sqnr_db": ("SQNR", " dB", True),
    "cosine": ("cosine", "", True),
    "max_abs": ("max_abs", "", False),
    "decision_iou": ("decision IoU", "", True),
    "argmax_agreement": ("whole-sample argmax agreement", "", True),
    "distinct_samples": ("held-out samples it tells apart", "", True),
    "sqnr_change_db": ("SQNR vs float, change from the verified run", " dB", True),
}
# A softmax output is held to whole-sample argmax agreement besides its decisions' IoU: the
# share of samples whose argmax over classes (every step of a sequence) is float's.
ARGMAX_AGREEMENT = 0.8
# VerifyConfig threshold names -> metric
THRESHOLD_METRICS = {"min_sqnr_db": "sqnr_db", "min_cosine": "cosine", "max_abs": "max_abs"}
PROBABILITY = "probability map"


@dataclass(frozen=True)
class Gate:
    output: str  # an output name, or "task" for a task metric over all outputs
    metric: str
    value: float
    threshold: float
    higher_is_better: bool = True
    kind: str | None = None  # what the output is, when that chose the gate
    advisory: bool = False  # recorded and shown, but the task metric's gates decide

    @property
    def holds(self) -> bool:
        """Whether the build may pass: the gate passed, or it only advises."""
        return self.passed or self.advisory

    @property
    def passed(self) -> bool:
        return (
            self.value >= self.threshold if self.higher_is_better else self.value <= self.threshold
        )

    @property
    def margin(self) -> float:
        """How far inside (positive) or outside (negative) the threshold the value is."""
        return self.value - self.threshold if self.higher_is_better else self.threshold - self.value

    def to_manifest(self) -> dict[str, Any]:
        out = {
            "output": self.output,
            "metric": self.metric,
            "value": self.value,
            "threshold": self.threshold,
            "comparison": ">=" if self.higher_is_better else "<=",
            "margin": self.margin,
            "passed": self.passed,
        }
        return (
            out
            | ({"kind": self.kind} if self.kind else {})
            | ({"advisory": True} if self.advisory else {})
        )

    @classmethod
    def from_manifest(cls, record: Mapping[str, Any]) -> Gate:
        return cls(
            record["output"],
            record["metric"],
            float(record["value"]),
            float(record["threshold"]),
            record.get("comparison", ">=") == ">=",
            record.get("kind"),
            bool(record.get("advisory", False)),
        )

    def line(self, with_output: bool = True) -> str:
        """`pred_masks: SQNR 25.3 dB (gate >= 20 dB, margin +5.3 dB) pass`"""
        label, unit, _ = _METRICS.get(self.metric, (self.metric, "", True))
        what = f"{self.output} ({self.kind})" if self.kind else self.output
        sign = ">=" if self.higher_is_better else "<="
        verdict = "pass" if self.passed else "advisory, not met" if self.advisory else "FAIL"
        digits = ".5f" if self.metric == "cosine" else ".4g"
        return (
            (f"{what}: " if with_output else "")
            + f"{label} {self.value:{digits}}{unit} (gate {sign} "
            f"{self.threshold:{digits}}{unit}, margin {self.margin:+.3g}{unit}) {verdict}"
        )


def output_kind(metrics: Mapping[str, float]) -> str | None:
    """`probability map` for an output the float model keeps inside [0, 1] (sigmoid or
    softmax scores, masks); None for values (logits, offsets, scales, embeddings)."""
    low, high = metrics.get("ref_min"), metrics.get("ref_max")
    if low is None or high is None:
        return None
    return PROBABILITY if low >= 0.0 and high <= 1.0 and high > low else None


def gates_for(
    output: str,
    metrics: Mapping[str, float],
    limits: Mapping[str, float | None],
    *,
    probability_decision_iou: float | None = None,
) -> list[Gate]:
    """The gates one output is held to. With `probability_decision_iou`, a probability map
    is held to the IoU of its decisions (elements above 0.5, float vs target) instead of
    SQNR and cosine: a map of mostly near-zero scores has little signal power, so noise no
    decision notices sinks its SQNR, and one pixel at an object's edge moves max_abs by up
    to 1 while the detection stands. A softmax (rows over the last axis summing to 1, with
    `argmax_agreement` measured) is also held to the share of samples whose whole argmax is
    float's: decisions above 0.5 can hold while the classes picked change."""
    kind = output_kind(metrics) if probability_decision_iou is not None else None
    if kind == PROBABILITY and "decision_iou" in metrics:
        threshold = float(probability_decision_iou)
        out = [Gate(output, "decision_iou", float(metrics["decision_iou"]), threshold, True, kind)]
        if "argmax_agreement" in metrics:  # a softmax: its decisions are its argmax
            value = float(metrics["argmax_agreement"])
            out.append(Gate(output, "argmax_agreement", value, ARGMAX_AGREEMENT, True, kind))
        return out
    out = []
    for name, metric in THRESHOLD_METRICS.items():
        threshold = limits.get(name)
        if threshold is not None:
            higher = _METRICS[metric][2]
            out.append(Gate(output, metric, float(metrics[metric]), float(threshold), higher))
    return out
