"""Execution-provider plugins: the one place that knows a target runtime.

An EP plugin is an `ExecutionProvider` instance declared in the `winml_recipes.eps`
entry-point group (`name = "package.module:PLUGIN"`). It says:

- what it is: `key` (what manifests and recipes name it by), onnxruntime's `provider`
  name, the `devices` it serves (presets map a device to a default EP; a recipe target can
  name another: `{device: npu, precision: w8a16, ep: openvino}`);
- how to open a session: a plugin library (`library_module`'s `get_library_path()`, or
  `library_env`), default `options` (provider options), which of onnxruntime's EP devices
  to select (`select_devices`), its library `versions()` (manifest and cache key);
- placement: `refusal_reason(log)` reads the EP's log when it refused nodes;
  `may_fail_to_finalize`: a graph it accepted may still fail when the session is created
  (then checked before any calibration); `max_rank`: the highest tensor rank it places
  (a refusal names the nodes above it);
- quantization: `quant_rules` (a `QuantRules`: types, shared encodings, op constraints,
  hooks around calibration and onnxruntime's quantizer), or None (no EP-specific rules);
- graph rewrites: `graph_rules()` (a `GraphRules`: the exact float rewrites the `prepare`
  pass's `ep` stage applies for this EP, or None);
- compiling: `compiles` ("epcontext" or None) and `compile_options` (which recipe
  options of `compile` become provider options);
- notes: `emulation_note()` (why times here are not the device's), `cpu_pinning` (how to
  keep op types on the CPU, for a failing region);
- memory: `preparation_cost()` (a `PreparationCost`: what preparing a graph for the EP,
  session creation or compile, takes against the graph's largest activation; the budget
  estimates `verify` on the target and `compile` from it, and `compile` cuts a graph over
  the budget into parts that fit, one EPContext node each), or None (not estimated).

The module imports nothing heavy: onnxruntime is imported inside the methods that need it.
Nothing outside a plugin names an EP; the engine asks `get_ep(key)` / `ep_for_device`.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from winml_recipes.sdk.errors import PlanError, check_known
from winml_recipes.sdk.plugins import check_available, load_entry_points

if TYPE_CHECKING:
    import onnx

ENTRY_POINT_GROUP = "winml_recipes.eps"
CPU_PROVIDER = "CPUExecutionProvider"
# A generic phrase an EP's log uses for a refused node (an EP can parse more).
_GENERIC_REASON = re.compile(r"(?:Validation FAILED|validation failed|not supported)[^\n\x1b]*")


@dataclass(frozen=True)
class GraphRules:
    """An EP's exact float rewrites: the `prepare` pass's `ep` stage runs them before
    quantization (onnxscript rules and onnx_ir passes; each logs what it replaced or kept)."""

    name: str  # the rule set's name, as the manifest records it
    rules: tuple[str, ...]  # every rule name `rewrite` can log (errors name them)
    rewrite: Callable[[Any, Any], Any]  # (onnx_ir Model, graph.log.RewriteLog): in place


@dataclass(frozen=True)
class PreparationCost:
    """What an EP's graph preparation (session creation, compile) takes in memory: a line
    fitted to measurements, peak MB = base_mb + mb_per_million x (the largest activation's
    elements, in millions) + weight_factor x the weights' MB."""

    base_mb: float
    mb_per_million: float
    weight_factor: float
    fitted_on: str  # where the fit comes from (said in the estimate)
    lower_by: str = ""  # what to change when it does not fit
    # The largest estimate a graph may have and still be prepared at once: above it, compile
    # cuts the graph into parts whose estimates are under it, whatever the memory budget
    # (a preparation can take hours long before it takes the whole budget). None: the
    # budget alone decides.
    largest_mb: float | None = None


@dataclass
class QuantRules:
    """What an EP needs from static quantization, beyond the precision's types.

    Data: `name` (recorded in the manifest), `requires_static_qdq` (refuses dynamic mode and
    the QOperator format), `defaults` (option defaults the EP wants, e.g.
    {"weight_symmetric": True}; the recipe's options still win), `allowed` (option -> the
    values the EP accepts, e.g. {"activation_type": ("uint8",)}).

    Hooks (override in a subclass; each returns what it changed for the manifest, under the
    metric names it gives): before calibration on the float model, after calibration,
    on the ranges, the arguments of onnxruntime's `quantize_static`, and on the written
    model. The defaults change nothing.
    """

    name: str
    requires_static_qdq: bool = True
    defaults: Mapping[str, Any] = field(default_factory=dict)
    allowed: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    # bumped when the hooks change what they write (their code is not in the cache key)
    revision: int = 0

    def check(self, cfg: Any) -> str | None:
        """Why a resolved QuantConfig does not suit the EP (one line), else None."""
        for option, values in self.allowed.items():
            value = getattr(cfg, option, None)
            if value is not None and value not in values:
                return (
                    f"{option} {value} is not supported by the {self.name} rules "
                    f"(allowed: {', '.join(map(str, values))})"
                )
        return None

    def before_calibration(self, model: onnx.ModelProto) -> dict[str, Any]:
        """Rewrite the float model in place before calibration; metrics of what changed."""
        return {}

    def after_calibration(self, model: onnx.ModelProto) -> dict[str, Any]:
        """Rewrite the float model in place once ranges are known (e.g. sentinels)."""
        return {}

    def float_nodes(self, model: onnx.ModelProto) -> dict[str, str]:
        """Nodes of the float model the EP needs left in float (node name -> why, one
        line); the quantizer excludes them and they read float inputs."""
        return {}

    def adjust_ranges(
        self, model: onnx.ModelProto, ranges: dict[str, Any], tensors: Sequence[str]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Ranges the EP can take (widened, shared encodings) and metrics of the change."""
        return ranges, {}

    def rewrite_with_ranges(
        self, model: onnx.ModelProto, ranges: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Rewrite the float model in place from its calibrated ranges (exact in float);
        the ranges with the new tensors', and metrics of what changed (empty: nothing)."""
        return ranges, {}

    def quantizer_args(
        self,
        src: Path,
        cfg: Any,
        overrides: dict[str, list[dict[str, Any]]],
        exclude: list[str],
    ) -> dict[str, Any] | None:
        """onnxruntime `quantize_static` keyword arguments, or None for the generic ones."""
        return None

    def after_quantize(self, path: Path) -> None:
        """Rewrite the written QDQ model in place (e.g. fold guards the EP refuses)."""


@dataclass(frozen=True)
class ExecutionProvider:
    """One execution provider: data plus overridable hooks (see the module docstring)."""

    key: str  # "cpu", "openvino", ...: what recipes, manifests and cache keys name
    provider: str  # onnxruntime's EP name, e.g. "CPUExecutionProvider"
    devices: frozenset[str]  # the devices it serves
    description: str = ""
    library_module: str | None = None  # Python package whose get_library_path() is the EP
    package: str | None = None  # its distribution name, for versions and install hints
    library_env: str | None = None  # environment variable overriding the library path
    options: Mapping[str, str] = field(default_factory=dict)  # default provider options
    backend: str | None = None  # e.g. a backend the options select
    quant_rules: QuantRules | None = None
    compiles: Literal["epcontext"] | None = None
    # compile options (recipe) -> provider option names this EP takes for them
    compile_options: Mapping[str, str] = field(default_factory=dict)
    # file names this EP's compiled artifacts match (serializers that are not reproducible)
    unreproducible_artifacts: str | None = None
    # Whether a session on this EP can fail at graph finalization on a graph it accepted
    # node by node (an NPU's allocation error naming no node): a build then
    # checks each component there before any calibration (the `fail_fast` steps).
    may_fail_to_finalize: bool = False
    # The highest tensor rank it places (None: no limit known): a refusal names the refused
    # nodes that touch a tensor above it.
    max_rank: int | None = None
    # How a person reads its results' origin (a product name); None: the key.
    display_name: str | None = None

    # compatibility with runtime/providers' old table rows
    @property
    def plugin(self) -> str | None:
        return self.library_module

    @property
    def is_cpu(self) -> bool:
        return self.provider == CPU_PROVIDER

    def library_path(self) -> str:
        """The EP's shared library; ImportError when its package is not installed."""
        if self.library_env and os.environ.get(self.library_env):
            return os.environ[self.library_env]
        if self.library_module is None:
            raise ImportError(f"{self.key} has no plugin library")
        module = importlib.import_module(self.library_module)
        return str(module.get_library_path())

    def install_hint(self) -> str:
        return f"pip install {self.package}" if self.package else f"install {self.provider}"

    def versions(self) -> dict[str, str]:
        """Library versions for the manifest and the cache key."""
        out = {"onnxruntime": metadata.version("onnxruntime")}
        if self.package:
            with contextlib.suppress(metadata.PackageNotFoundError):
                out[self.package] = metadata.version(self.package)
        return out

    def select_devices(self, devices: Sequence[Any], device: str | None = None) -> list[Any]:
        """onnxruntime EP devices a session on `device` (a preset device name) uses."""
        return [d for d in devices if d.ep_name == self.provider]

    def provider_options(
        self, device: str | None = None, extra: Mapping[str, str] | None = None
    ) -> dict[str, str]:
        """Provider options for a session on `device`: defaults, then `extra`."""
        return {**self.options, **(extra or {})}

    def no_device_reason(self, devices: Sequence[Any]) -> str | None:
        """Why the registered plugin offers no device here, judged from onnxruntime's
        EP devices (`devices`), in one line; None for the generic message."""
        return None

    def refusal_reason(self, log: str) -> str | None:
        """The EP's own reason for nodes it refused, from what it logged, or None."""
        found = _GENERIC_REASON.search(log)
        return found.group(0).strip()[:200] if found else None

    def graph_rules(self) -> GraphRules | None:
        """The EP's exact float rewrites (prepare's `ep` stage), or None."""
        return None

    def emulation_note(self) -> str | None:
        """Why times measured on this host are not the device's (e.g. an emulator)."""
        return None

    def emulated_on(self) -> str | None:
        """The host architecture this EP's device is emulated on here (None: it is real)."""
        return None

    def shown_name(self) -> str:
        """Where a result ran, as a person reads it: "NAME (emulated on x86_64)" where
        the device is emulated on this host, the plain name where it is real."""
        name = self.display_name or self.key
        host = self.emulated_on()
        return f"{name} (emulated on {host})" if host else name

    def cpu_pinning(self, op_types: Sequence[str], work_dir: Path) -> dict[str, str] | None:
        """Provider options that keep `op_types` on the CPU (writing any file they name
        under `work_dir`), or None when the EP cannot."""
        return None

    def cpu_pinning_hint(self, op_types: Sequence[str]) -> str:
        """How an application keeps `op_types` on the CPU with this EP (one phrase)."""
        return "the EP's provider options"

    def estimate_note(self) -> str | None:
        """What a memory estimate leaves out on this EP (graph preparation), or None."""
        return None

    def preparation_cost(self) -> PreparationCost | None:
        """What preparing a graph for this EP costs in memory (see PreparationCost), or
        None when it is not estimated."""
        return None


_REGISTERED_LIBRARIES: set[tuple[str, str]] = set()


def register_library_once(provider: str, library: str) -> None:
    """Register an EP plugin library with onnxruntime, once per process (a second
    registration raises "EP library is already registered"). A plugin that registered and
    offers no device (OpenVINO's on an AMD host) lists no EP device either, so the devices
    cannot tell whether it was registered: this process-wide record does. Raises what
    onnxruntime raises when the library does not load."""
    import onnxruntime as ort

    key = (provider, str(library))
    if key in _REGISTERED_LIBRARIES:
        return
    try:
        ort.register_execution_provider_library(provider, str(library))
    except Exception as exc:  # registered by other code in this process: that is done
        if "already registered" not in str(exc):
            raise
    _REGISTERED_LIBRARIES.add(key)


def _accept(obj: Any) -> bool:
    return isinstance(obj, ExecutionProvider)


@cache
def _registry() -> tuple[dict[str, ExecutionProvider], dict[str, str]]:
    """Plugins by key, and entry-point names that differ from their plugin's key."""
    found = load_entry_points(
        ENTRY_POINT_GROUP,
        _accept,
        "an ExecutionProvider",
        skip_missing=True,
        claims=lambda plugin: (plugin.key,),
    )
    by_key: dict[str, ExecutionProvider] = {}
    aliases: dict[str, str] = {}
    for name, plugin in found.items():
        by_key[plugin.key] = plugin
        if name != plugin.key:
            aliases[name] = plugin.key
    return by_key, aliases


def execution_providers() -> dict[str, ExecutionProvider]:
    """Every installed EP plugin, by key."""
    return dict(_registry()[0])


def ep_key(name: str) -> str:
    """A plugin's key from its key or its entry-point name; a PlanError when unknown."""
    by_key, aliases = _registry()
    if name in aliases:
        return aliases[name]
    if name not in by_key:
        check_available(ENTRY_POINT_GROUP, name, "execution provider")
    check_known(name, list(by_key) + list(aliases), "execution provider")
    return name


def get_ep(name: str) -> ExecutionProvider:
    return _registry()[0][ep_key(name)]


def ran_on_name(record: Mapping[str, Any]) -> str:
    """Where a run recorded by `target_session` (verify, run, compare) happened, as a person
    reads it: the name recorded then ("NAME (emulated on x86_64)"), else its key's."""
    recorded = record.get("target_name")
    if isinstance(recorded, str) and recorded:
        return recorded
    return shown_name(str(record.get("verified_on") or record.get("ran_on") or "?"))


def shown_name(where: str) -> str:
    """A result's origin as a person reads it: an EP key's `shown_name()`, anything else
    (cpu-simulation, a key no installed plugin has) as it is."""
    plugin = _registry()[0].get(where)
    return plugin.shown_name() if plugin is not None else where


def check_serves(ep: ExecutionProvider, device: str) -> None:
    if device not in ep.devices:
        raise PlanError(
            f"execution provider '{ep.key}' does not serve device '{device}' "
            f"(it serves: {', '.join(sorted(ep.devices))}); choose another ep or device"
        )
