"""A toy execution-provider plugin, installed only through its entry point (the dist-info
beside it): onnxruntime's CPU EP under another key, with quantization rules of its own
(per-tensor weights, what some NPUs need) so that a build for it differs from the CPU
target's. tests/integration/test_ep_plugins.py puts this folder on PYTHONPATH."""

from __future__ import annotations

from dataclasses import dataclass

from winml_recipes.sdk.ep import ExecutionProvider, QuantRules


@dataclass(frozen=True)
class ToyEP(ExecutionProvider):
    def versions(self) -> dict[str, str]:
        return {**super().versions(), "toy-runtime": "0.1"}


PLUGIN = ToyEP(
    key="toy",
    provider="CPUExecutionProvider",
    devices=frozenset({"cpu"}),
    description="a toy EP backed by onnxruntime's CPU EP (tests)",
    quant_rules=QuantRules(
        name="toy",
        requires_static_qdq=False,
        defaults={"per_channel": False},
        allowed={"activation_type": ("int8", "uint8")},
    ),
)
