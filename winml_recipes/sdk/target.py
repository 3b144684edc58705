"""The target of a build: a device, a precision and the execution provider the device builds
for (validated and filled from presets.yaml upstream)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, order=True)
class Target:
    device: str
    precision: str
    # A key of presets.yaml's execution_providers (e.g. "qnn-htp"), filled by
    # presets.resolve_target. Not part of equality or order: a device and a precision name
    # a target; its EP follows from the device.
    execution_provider: str = field(default="", compare=False)

    def __str__(self) -> str:
        return f"{self.device}-{self.precision}"
