"""Whether report.html may run a build on its target (the picture and the per-layer plot).

The report runs in the build's own process after the build. Running a big model on the
target again there (an NPU EP prepares the graph anew: sam3-mid's encoder passed 10 GB) must
not happen where the build itself did not: a component whose verify ran on the CPU
simulation (`on_target: false`) is not prepared on the target by the report, and a run
whose estimate (the EP's preparation cost, the candidate's and the float reference's
forward passes) is over the memory budget is skipped. Either way the section says so in
one line and `winml-recipes run` does it on request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from winml_recipes.buildfolder import BuildFolder, BuiltComponent
    from winml_recipes.sdk.ep import ExecutionProvider
    from winml_recipes.sdk.estimates import MemoryEstimate


def _verify_options(comp: BuiltComponent) -> dict | None:
    step = next((s for s in comp.record.get("steps", []) if s.get("pass") == "verify"), None)
    if step is None or step.get("status") == "skipped":
        return None
    return step.get("options") or {}


def run_estimate(comp: BuiltComponent, ep: ExecutionProvider) -> MemoryEstimate | None:
    """The peak of running `comp` on `ep` and its float reference on the CPU, one after the
    other (None: nothing to estimate from)."""
    from winml_recipes.engine.budget import forward_estimate, larger, preparation_estimate

    if comp.contract is None:
        return None
    phases = []
    if comp.reference is not None:
        phases.append(forward_estimate(comp.reference, comp.contract, "float forward"))
    if comp.model is not None:
        phases.append(forward_estimate(comp.model, comp.contract, "target forward"))
        if not ep.is_cpu and comp.compiled is None:  # an EPContext model is not prepared
            phases.append(preparation_estimate(comp.model, comp.contract, ep, "target session"))
    return larger(*phases)


def why_not_run(build: BuildFolder, budget_mb: float) -> str | None:
    """One line saying why the report does not run `build` on its target (None: it may)."""
    from winml_recipes.runtime.providers import get_provider

    ep = get_provider(build.ep_key)
    for comp in build.components:
        options = _verify_options(comp)
        if not ep.is_cpu and options is not None and options.get("on_target") is False:
            return (
                f"{comp.name} was verified on the CPU simulation (verify: on_target false), so "
                f"the report does not prepare it on {ep.key} (it may not fit this machine's "
                "memory)"
            )
    for comp in build.components:
        estimate = run_estimate(comp, ep)
        if estimate is not None and estimate.mb > budget_mb:
            return (
                f"running {comp.name} needs about {estimate.mb / 1024:.1f} GB "
                f"({estimate.made_of}), over the memory budget of {budget_mb / 1024:.1f} GB"
            )
    return None
