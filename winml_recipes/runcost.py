"""What running a build on its target costs here, read from what the build measured.

`run` and `perf` say it before they start: a component verify ran on the target costs about
what verify took per sample (its recorded seconds over its samples: an upper bound, as
they hold the session's preparation and the float reference's runs); a component verify
ran on the CPU simulation (`on_target: false`, a graph the emulated target cannot hold in
time or memory here) and that was not compiled is run on the CPU simulation instead, and
said so, rather than prepared on the emulator for an hour.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from winml_recipes.buildfolder import BuildFolder, BuiltComponent


@dataclass(frozen=True)
class RunCost:
    seconds: float | None  # about one run of the whole pipeline here (None: not known)
    simulate: tuple[str, ...] = ()  # components run on the CPU simulation instead
    lines: list[str] = field(default_factory=list)  # what to tell the person before it starts


def _verify(comp: BuiltComponent) -> dict[str, Any] | None:
    return next(
        (
            s
            for s in comp.record.get("steps", [])
            if s.get("pass") == "verify" and s.get("status") in ("ran", "cached", "failed")
        ),
        None,
    )


def per_sample_seconds(comp: BuiltComponent) -> tuple[float, int] | None:
    """(seconds per sample, samples) from the verify step's record (None: not recorded):
    its `target_seconds` (session and runs on the target, kept when the step is a cache
    hit), else the step's wall time when it ran (an upper bound)."""
    step = _verify(comp)
    if step is None:
        return None
    metrics = step.get("metrics") or {}
    samples = metrics.get("samples") or metrics.get("data_samples")
    seconds = metrics.get("target_seconds")
    if seconds is None and step.get("status") == "ran":
        seconds = step.get("wall_seconds")
    if not samples or not seconds:
        return None
    return float(seconds) / int(samples), int(samples)


def run_cost(build: BuildFolder, compiled: bool | None = None) -> RunCost:
    """What one run of `build`'s pipeline costs on its target here, and what is simulated."""
    from winml_recipes.runtime.providers import get_provider

    ep = get_provider(build.ep_key)
    if ep.is_cpu:
        return RunCost(None)
    name = ep.shown_name()
    simulate, lines, total, known = [], [], 0.0, True
    for comp in build.components:
        step = _verify(comp)
        on_target = ((step or {}).get("options") or {}).get("on_target", True)
        usable_ctx = comp.compiled is not None and compiled is not False
        if step is not None and on_target is False and not usable_ctx and comp.model:
            simulate.append(comp.name)
            lines.append(
                f"{comp.name}: verify ran it on the CPU simulation (on_target: false: "
                f"{name} cannot hold it in time here), so it runs there"
            )
            continue
        cost = per_sample_seconds(comp)
        if cost is None:
            known = False
            continue
        seconds, samples = cost
        total += seconds
        lines.append(
            f"{comp.name}: about {seconds:.0f} s on {name} (verify took "
            f"{seconds * samples:.0f} s for {samples} samples)"
        )
    return RunCost(total if known else None, tuple(simulate), lines)
