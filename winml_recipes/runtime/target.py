"""Run a candidate model on a device's execution provider, honestly labelled.

Where the device's EP loads, the candidate runs there (with CPU fallback only when asked)
and the run is labelled with the EP's key. Where it cannot load, the run falls back to the
CPU EP and is labelled `cpu-simulation` with the reason, or fails when the EP is required.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from winml_recipes.runtime.providers import (
    availability,
    get_provider,
    identity,
    provider_for_device,
)
from winml_recipes.runtime.sessions import RuntimeSession, open_session
from winml_recipes.sdk.errors import ExecutionProviderError

CPU_SIMULATION = "cpu-simulation"


@dataclass
class TargetRun:
    outputs: list[dict[str, np.ndarray]]
    verified_on: str  # an EP key ("cpu", ...) or "cpu-simulation"
    record: dict[str, Any]  # for the manifest: verified_on, execution_provider, placement


def target_session(
    path: Path,
    device: str,
    *,
    fallback: bool = False,
    require: bool = False,
    on_target: bool = True,
    provider_options: Mapping[str, str] | None = None,
    ep: str | None = None,
) -> tuple[RuntimeSession, dict[str, Any]]:
    """A session on the target's EP (`ep`, else the device's default; or the CPU
    simulation) and its manifest record."""
    provider = get_provider(ep) if ep else provider_for_device(device)
    record: dict[str, Any] = {"execution_provider": identity(provider.key)}
    if provider.is_cpu:
        session = open_session(path, provider.key, device=device)
        return session, {"verified_on": provider.key, **record}
    if not on_target:
        record["execution_provider"]["reason"] = "the recipe verifies on the CPU EP (on_target)"
        return open_session(path), {"verified_on": CPU_SIMULATION, **record}
    avail = availability(provider.key)
    if not avail.available:
        if require:
            raise ExecutionProviderError(
                f"the {device} target requires {provider.provider} ({provider.key}), which "
                f"cannot be used here: {avail.reason}"
            )
        return open_session(path), {"verified_on": CPU_SIMULATION, **record}
    session = open_session(
        path,
        provider.key,
        fallback=fallback,
        provider_options=provider_options,
        device=device,
    )
    assert session.placement is not None
    record["placement"] = session.placement.to_manifest()
    record["cpu_fallback_allowed"] = fallback
    # how every view names where it ran: the plugin's name, "(emulated on x86_64)" there
    record["target_name"] = provider.shown_name()
    if provider.emulated_on():
        record["emulated_on"] = provider.emulated_on()
    return session, {"verified_on": provider.key, **record}


def run_on_target(
    path: Path,
    feeds: Sequence[Mapping[str, np.ndarray]],
    device: str,
    options: Mapping[str, Any] | None = None,
    on_sample: Callable[[int], None] | None = None,
    ep: str | None = None,
) -> TargetRun:
    """Run every feed on the target's EP (`ep`, else the device's default); `options` may
    set allow_cpu_fallback, require_ep, on_target and provider_options (for that EP)."""
    options = options or {}
    session, record = target_session(
        path,
        device,
        fallback=bool(options.get("allow_cpu_fallback", False)),
        require=bool(options.get("require_ep", False)),
        on_target=bool(options.get("on_target", True)),
        provider_options=options.get("provider_options"),
        ep=ep,
    )
    outputs = []
    for i, feed in enumerate(feeds):
        outputs.append(session.run(feed, i))
        if on_sample is not None:
            on_sample(i + 1)
    return TargetRun(outputs, record["verified_on"], record)
