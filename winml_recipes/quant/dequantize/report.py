"""What a dequantize run did: counts per pattern, and what it could not rewrite and why."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from winml_recipes.onnx.quant import QOPERATOR_OPS, WEIGHT_ONLY_OPS

# Ops reported as "replaced N <op>": the detector's QOperator and weight-only families and
# DynamicQuantizeMatMul (ConvInteger/MatMulInteger get their own "fusions" wording).
REPLACED_OPS = sorted(
    (QOPERATOR_OPS - {"ConvInteger", "MatMulInteger"}) | {"DynamicQuantizeMatMul"} | WEIGHT_ONLY_OPS
)


def snake(op: str) -> str:
    """Report key stem of an op: QLinearConv -> qlinear_conv, MatMulNBits -> matmul_nbits."""
    out = op.replace("QLinear", "Qlinear").replace("MatMul", "Matmul").replace("NBits", "Nbits")
    out = out.replace("QGemm", "Qgemm")
    return "".join("_" + c.lower() if c.isupper() else c for c in out).lstrip("_")


# Report keys in describe() order: (singular, plural) phrase templates.
PHRASES: dict[str, tuple[str, str]] = {
    "weight_dq_folded": ("folded {n} weight DQ", "folded {n} weight DQ"),
    "qdq_pairs_collapsed": ("collapsed {n} Q/DQ pair", "collapsed {n} Q/DQ pairs"),
    "conv_integer_replaced": (
        "replaced {n} ConvInteger fusion",
        "replaced {n} ConvInteger fusions",
    ),
    "matmul_integer_replaced": (
        "replaced {n} MatMulInteger fusion",
        "replaced {n} MatMulInteger fusions",
    ),
    **{f"{snake(op)}_replaced": (f"replaced {{n}} {op}",) * 2 for op in REPLACED_OPS},
    "bias_add_folded": ("folded {n} bias Add into Conv", "folded {n} bias Adds into Conv"),
    "passthrough_converted": (
        "moved {n} integer data-movement op to float",
        "moved {n} integer data-movement ops to float",
    ),
    "relu_restored": ("restored {n} Relu clamp", "restored {n} Relu clamps"),
}


class Leftover(NamedTuple):
    """A quantized node no rule or pass rewrote, and the rule's reason when one matched it."""

    name: str
    op: str
    reason: str = ""


@dataclass
class DequantizeReport:
    """What `dequantize_model` did: counts per pattern and the quantized ops it left."""

    counts: dict[str, int] = field(default_factory=dict)
    changed: bool = False
    remaining: list[Leftover] = field(default_factory=list)

    def describe(self) -> str:
        """One line, e.g. "folded 12 weight DQ, collapsed 40 Q/DQ pairs"."""
        keys = [k for k in PHRASES if k in self.counts]
        keys += [k for k in self.counts if k not in PHRASES]
        parts = []
        for key in keys:
            n = self.counts[key]
            if n:
                one, many = PHRASES.get(key, (f"{key}: {{n}}",) * 2)
                parts.append((one if n == 1 else many).format(n=n))
        if self.remaining:
            parts.append(f"left {len(self.remaining)} quantized ops")
        return ", ".join(parts) if parts else "already float: nothing to do"

    def to_dict(self) -> dict[str, Any]:
        return {
            "changed": self.changed,
            "counts": dict(self.counts),
            "remaining": [list(r) for r in self.remaining],
            "summary": self.describe(),
        }

    def error_message(self) -> str:
        """One line naming what is left and, when a rule refused a node, why.

        "cannot dequantize node conv1 (QLinearConv): scale 'xs' is not a constant" for one
        refused node; otherwise the list of what is left, then each refusal.
        """
        left = self.remaining
        explained = [r for r in left if r.reason]
        if len(left) == 1 and explained:
            return f"cannot dequantize node {left[0].name} ({left[0].op}): {left[0].reason}"
        shown = ", ".join(f"{r.name} ({r.op})" for r in left[:10])
        more = f" and {len(left) - 10} more" if len(left) > 10 else ""
        noun = "node" if len(left) == 1 else "nodes"
        why = "".join(f"; node {r.name} ({r.op}): {r.reason}" for r in explained[:3])
        return f"cannot dequantize {len(left)} {noun}: {shown}{more}{why}"
