"""Execution providers: the table in presets.yaml, discovery and plugin registration.

A plugin EP (e.g. QNN, shipped by the `onnxruntime-qnn` wheel) is a shared library that
onnxruntime registers once per process (`register_execution_provider_library`); its
devices then appear in `get_ep_devices()` and a session selects them with
`SessionOptions.add_provider_for_devices`. Whether an EP can load is decided once per
process and kept, with the reason when it cannot.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from dataclasses import dataclass, field
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from winml_recipes.sdk.errors import check_known
from winml_recipes.sdk.target import Target

CPU = "cpu"


@dataclass(frozen=True)
class ExecutionProvider:
    """One entry of presets.yaml's `execution_providers` table."""

    key: str  # "cpu", "qnn-htp"
    provider: str  # onnxruntime's EP name, e.g. "QNNExecutionProvider"
    description: str = ""
    plugin: str | None = None  # Python package whose get_library_path() is the EP library
    package: str | None = None  # its distribution name, for versions
    library_env: str | None = None  # environment variable overriding the library path
    options: dict[str, str] = field(default_factory=dict)  # provider options
    backend: str | None = None  # e.g. "htp"

    @property
    def is_cpu(self) -> bool:
        return self.provider == "CPUExecutionProvider"


@dataclass(frozen=True)
class Availability:
    """Whether this host can load an EP, and what it is when it can."""

    available: bool
    reason: str = ""  # why not, one line
    versions: dict[str, str] = field(default_factory=dict)
    library: str | None = None


def _table() -> dict[str, dict[str, Any]]:
    from winml_recipes.presets import presets

    return dict(presets().get("execution_providers", {}))


def execution_providers() -> dict[str, ExecutionProvider]:
    """Every EP the presets know, by key."""
    out = {}
    for key, row in _table().items():
        out[key] = ExecutionProvider(
            key=key,
            provider=row["provider"],
            description=row.get("description", ""),
            plugin=row.get("plugin"),
            package=row.get("package"),
            library_env=row.get("library_env"),
            options={k: str(v) for k, v in (row.get("options") or {}).items()},
            backend=row.get("backend"),
        )
    return out


def get_provider(key: str) -> ExecutionProvider:
    table = execution_providers()
    check_known(key, list(table), "execution provider")
    return table[key]


def provider_for(target: Target) -> ExecutionProvider:
    """The EP a target builds for: its own (`resolve_target` fills it), else its device's."""
    if target.execution_provider:
        return get_provider(target.execution_provider)
    return provider_for_device(target.device)


def provider_for_device(device: str) -> ExecutionProvider:
    """The EP a device builds for (presets: devices.<device>.execution_provider)."""
    from winml_recipes.presets import device_settings

    return get_provider(str(device_settings(device).get("execution_provider", CPU)))


def _library_path(ep: ExecutionProvider) -> str:
    if ep.library_env and os.environ.get(ep.library_env):
        return os.environ[ep.library_env]
    assert ep.plugin is not None
    module = importlib.import_module(ep.plugin)
    return str(module.get_library_path())


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def _versions(ep: ExecutionProvider) -> dict[str, str]:
    out = {"onnxruntime": metadata.version("onnxruntime")}
    if ep.package:
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[ep.package] = metadata.version(ep.package)
    if ep.plugin:
        try:
            info = importlib.import_module(f"{ep.plugin}.build_and_package_info")
            for attr in ("qnn_version",):
                if hasattr(info, attr):
                    out[attr.removesuffix("_version") + "_sdk"] = str(getattr(info, attr))
        except ImportError:
            pass
    return out


@cache
def availability(key: str) -> Availability:
    """Load (register) the EP once per process; never raises."""
    ep = get_provider(key)
    if ep.is_cpu:
        return Availability(True, versions=_versions(ep))
    import onnxruntime as ort

    if ep.plugin is None:
        if ep.provider in ort.get_available_providers():
            return Availability(True, versions=_versions(ep))
        return Availability(False, f"{ep.provider} is not in this onnxruntime build")
    try:
        library = _library_path(ep)
    except ImportError:
        return Availability(
            False, f"the Python package '{ep.plugin}' is not installed (pip install {ep.package})"
        )
    if not Path(library).is_file():
        return Availability(False, f"EP library not found: {library}")
    from winml_recipes.runtime.native import native_output_captured

    # The QNN libraries print to stdout when they load (LIBNATIVE ...).
    with native_output_captured():
        try:
            if not ep_devices(ep):
                ort.register_execution_provider_library(ep.provider, library)
            error = None
        except Exception as exc:  # ORT raises Fail with the loader's message
            error = exc
    if error is not None:
        return Availability(False, f"cannot load {library}: {_first_line(error)}")
    if not ep_devices(ep):
        return Availability(False, f"{ep.provider} registered but offers no device on this host")
    return Availability(True, versions=_versions(ep), library=library)


def ep_devices(ep: ExecutionProvider) -> list[Any]:
    """The onnxruntime EP devices of a loaded plugin EP."""
    import onnxruntime as ort

    return [d for d in ort.get_ep_devices() if d.ep_name == ep.provider]


def identity(key: str) -> dict[str, Any]:
    """What a cache key and a manifest need to know about an EP on this host."""
    ep = get_provider(key)
    avail = availability(key)
    out: dict[str, Any] = {"key": key, "provider": ep.provider, "available": avail.available}
    if ep.backend:
        out["backend"] = ep.backend
    if avail.available:
        out["versions"] = avail.versions
    else:
        out["reason"] = avail.reason
    return out
