"""The target of a build: a device and a precision (validated against presets.yaml upstream)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Target:
    device: str
    precision: str

    def __str__(self) -> str:
        return f"{self.device}-{self.precision}"
