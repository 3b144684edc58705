"""The target of a build: a device, a precision and the execution provider the device builds
for (validated and filled from presets.yaml upstream)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, order=True)
class Target:
    device: str
    precision: str
    # The key of the EP plugin it builds for (winml_recipes.sdk.ep), filled by
    # presets.resolve_target. Not part of equality or order: a device and a precision name
    # a target; its EP follows from the device.
    execution_provider: str = field(default="", compare=False)
    # The EP the recipe named when it is not the device's default ("" otherwise): part of
    # the target's identity (its build folder, cache keys), so one device and precision can
    # be built for two EPs.
    ep: str = ""

    def __str__(self) -> str:
        return f"{self.device}-{self.precision}" + (f"-{self.ep}" if self.ep else "")

    def key_parts(self) -> list[str]:
        """What a target-dependent step's cache and plan keys hold of the target."""
        return [self.device, self.precision, *([self.ep] if self.ep else [])]

    def to_dict(self) -> dict[str, str]:
        """The manifest's and the plan's record of the target."""
        return {"device": self.device, "precision": self.precision, **self._ep()}

    def _ep(self) -> dict[str, str]:
        return {"ep": self.ep} if self.ep else {}

    @property
    def label(self) -> str:
        """device/precision[/ep], as messages name a target."""
        return f"{self.device}/{self.precision}" + (f"/{self.ep}" if self.ep else "")
