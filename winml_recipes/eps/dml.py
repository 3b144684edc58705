"""DirectML (Windows GPUs), built into the onnxruntime-directml wheel (not a plugin library)."""

from __future__ import annotations

from winml_recipes.sdk.ep import ExecutionProvider

PLUGIN = ExecutionProvider(
    key="dml",
    provider="DmlExecutionProvider",
    devices=frozenset({"gpu"}),
    description="DirectML (Windows GPUs); onnxruntime-directml on Windows",
    package="onnxruntime-directml",
)
