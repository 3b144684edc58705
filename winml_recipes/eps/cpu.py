"""onnxruntime's CPU execution provider: every device can fall back to it."""

from __future__ import annotations

from winml_recipes.sdk.ep import CPU_PROVIDER, ExecutionProvider

PLUGIN = ExecutionProvider(
    key="cpu",
    provider=CPU_PROVIDER,
    devices=frozenset({"cpu"}),
    description="onnxruntime's CPU execution provider",
)
