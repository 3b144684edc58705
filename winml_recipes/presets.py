"""Device x precision policy, loaded from presets.yaml (data, not code)."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

import yaml

from winml_recipes.sdk.errors import PlanError, check_known
from winml_recipes.sdk.target import Target


@cache
def presets() -> dict[str, Any]:
    text = resources.files("winml_recipes").joinpath("presets.yaml").read_text()
    # libyaml's loader when PyYAML has it: 1.5 ms instead of 50 ms, paid by every process.
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def devices() -> list[str]:
    return list(presets()["devices"])


def precisions() -> list[str]:
    return list(presets()["precisions"])


_check = check_known


def resolve_target(device: str, precision: str, ep: str | None = None) -> Target:
    """Validate a device/precision pair (and the EP a recipe names, an installed EP plugin
    that serves the device) against the presets; never a silent default. The device's
    default EP named explicitly is the same target as no EP named."""
    from winml_recipes.sdk.ep import check_serves, ep_key, get_ep

    _check(device, devices(), "device")
    _check(precision, precisions(), "precision")
    default = str(presets()["devices"][device].get("execution_provider", "cpu"))
    if ep is None or ep_key(ep) == default:
        return Target(device, precision, default)
    plugin = get_ep(ep)
    check_serves(plugin, device)
    return Target(device, precision, plugin.key, ep=plugin.key)


def precision_settings(precision: str) -> dict[str, Any]:
    _check(precision, precisions(), "precision")
    return dict(presets()["precisions"][precision])


def default_steps(target: Target) -> list[Any]:
    """The preset step list for a target, or a PlanError saying which targets have one."""
    table = presets()["defaults"]
    steps = table.get(target.device, {}).get(target.precision)
    if steps is None:
        have = [f"{d}/{p}" for d, row in table.items() for p in row]
        raise PlanError(
            f"no default steps for {target.device}/{target.precision}; list 'steps' in the "
            f"recipe or use one of: {', '.join(have)}"
        )
    return list(steps)


def device_settings(device: str) -> dict[str, Any]:
    _check(device, devices(), "device")
    return dict(presets()["devices"][device])


def default_precision(device: str) -> str:
    return str(device_settings(device)["default_precision"])


def precisions_of_kind(kind: str) -> frozenset[str]:
    return frozenset(p for p, s in presets()["precisions"].items() if s["kind"] == kind)
