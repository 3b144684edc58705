"""Execution providers: the installed EP plugins (winml_recipes.sdk.ep), discovery and
plugin-library registration.

A plugin EP is a shared library that a Python package ships; onnxruntime registers it once
per process (`register_execution_provider_library`); its devices then appear in
`get_ep_devices()` and a session selects them with `SessionOptions.add_provider_for_devices`.
What an EP is (its library, options, devices, versions) is its plugin's; whether it can
load here is decided once per process and kept, with the reason when it cannot.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from winml_recipes.sdk.ep import (
    ExecutionProvider,
    execution_providers,
    get_ep,
    register_library_once,
)
from winml_recipes.sdk.target import Target

CPU = "cpu"

__all__ = [
    "CPU",
    "Availability",
    "ExecutionProvider",
    "availability",
    "ep_devices",
    "execution_providers",
    "get_provider",
    "identity",
    "provider_for",
    "provider_for_device",
]


@dataclass(frozen=True)
class Availability:
    """Whether this host can load an EP, and what it is when it can."""

    available: bool
    reason: str = ""  # why not, one line
    versions: dict[str, str] = field(default_factory=dict)
    library: str | None = None


def get_provider(key: str) -> ExecutionProvider:
    """The EP plugin named `key` (its key or its entry-point name)."""
    return get_ep(key)


def provider_for(target: Target) -> ExecutionProvider:
    """The EP a target builds for: its own (`resolve_target` fills it), else its device's."""
    if target.execution_provider:
        return get_provider(target.execution_provider)
    return provider_for_device(target.device)


def provider_for_device(device: str) -> ExecutionProvider:
    """The EP a device builds for by default (presets: devices.<device>.execution_provider)."""
    from winml_recipes.presets import device_settings

    return get_provider(str(device_settings(device).get("execution_provider", CPU)))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def availability(key: str) -> Availability:
    """Load (register) the EP once per process; never raises."""
    return _availability(get_provider(key).key)


@cache
def _availability(key: str) -> Availability:
    ep = get_provider(key)
    if ep.is_cpu:
        return Availability(True, versions=ep.versions())
    import onnxruntime as ort

    if ep.plugin is None:
        if ep.provider in ort.get_available_providers():
            return Availability(True, versions=ep.versions())
        return Availability(False, f"{ep.provider} is not in this onnxruntime build")
    try:
        library = ep.library_path()
    except ImportError:
        return Availability(
            False, f"the Python package '{ep.plugin}' is not installed ({ep.install_hint()})"
        )
    if not Path(library).is_file():
        return Availability(False, f"EP library not found: {library}")
    from winml_recipes.runtime.native import native_output_captured

    # Some EP libraries print to stdout when they load (LIBNATIVE ...).
    with native_output_captured():
        try:
            if not ep_devices(ep):
                register_library_once(ep.provider, library)
            error = None
        except Exception as exc:  # ORT raises Fail with the loader's message
            error = exc
    if error is not None:
        return Availability(False, f"cannot load {library}: {_first_line(error)}")
    if not ep_devices(ep):
        why = ep.no_device_reason(ort.get_ep_devices())
        return Availability(
            False, why or f"{ep.provider} registered but offers no device on this host"
        )
    return Availability(True, versions=ep.versions(), library=library)


def ep_devices(ep: ExecutionProvider, device: str | None = None) -> list[Any]:
    """The onnxruntime EP devices of a loaded plugin EP (those its plugin selects for
    `device`, a preset device name, when given)."""
    import onnxruntime as ort

    return ep.select_devices(ort.get_ep_devices(), device)


def identity(key: str) -> dict[str, Any]:
    """What a cache key and a manifest need to know about an EP on this host."""
    ep = get_provider(key)
    avail = availability(ep.key)
    out: dict[str, Any] = {"key": ep.key, "provider": ep.provider, "available": avail.available}
    if ep.backend:
        out["backend"] = ep.backend
    if avail.available:
        out["versions"] = avail.versions
    else:
        out["reason"] = avail.reason
    return out
