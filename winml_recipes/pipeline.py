"""A build folder as a runnable pipeline: its components in catalog order, each fed the
outputs of the earlier ones by name (SAM: the vision encoder's embeddings feed the prompt
encoder / mask decoder), on the target's execution provider, with the float reference beside
it on the CPU EP. The build is read by `buildfolder.open_build(path, contracts=True)`."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from winml_recipes.buildfolder import BuildFolder, BuiltComponent
from winml_recipes.sdk.errors import ModelFileError, RecipeError

Outputs = dict[str, np.ndarray]


@dataclass
class PipelineRun:
    """One pass over every component: the feeds each got, its outputs and where it ran."""

    feeds: dict[str, Outputs] = field(default_factory=dict)
    outputs: dict[str, Outputs] = field(default_factory=dict)
    ran_on: dict[str, dict[str, Any]] = field(default_factory=dict)


def _feed_for(
    comp: BuiltComponent, inputs: Mapping[str, np.ndarray], earlier: Mapping[str, Outputs]
) -> Outputs:
    feed: Outputs = {}
    for spec in comp.contract.inputs:
        if spec.name in inputs:
            feed[spec.name] = inputs[spec.name]
            continue
        produced = next((outs[spec.name] for outs in earlier.values() if spec.name in outs), None)
        if produced is None:
            raise RecipeError(
                f"{comp.name}: input '{spec.name}' has no value (no earlier component makes it); "
                f"pass --npz with an array named '{spec.name}'"
            )
        feed[spec.name] = produced
    return feed


def run_float(build: BuildFolder, inputs: Mapping[str, np.ndarray]) -> PipelineRun:
    """The float pipeline on the CPU EP: each component's reference (or its shipped model
    where that is the float one)."""
    from winml_recipes.runtime.sessions import open_session

    run = PipelineRun()
    for comp in build.components:
        path = comp.reference or comp.model
        if path is None:
            raise ModelFileError(
                f"{comp.name}: no float model in the build folder; rebuild it",
                where=str(build.folder),
            )
        feed = _feed_for(comp, inputs, run.outputs)
        session = open_session(path)
        run.feeds[comp.name] = feed
        run.outputs[comp.name] = session.run(feed)
        run.ran_on[comp.name] = {"model": _rel(path, build.folder), "ran_on": "cpu"}
    return run


def run_target(
    build: BuildFolder,
    inputs: Mapping[str, np.ndarray],
    compiled: bool | None = None,
    simulate: Collection[str] = (),
) -> PipelineRun:
    """The built pipeline on the target device's EP (CPU simulation where that EP cannot load
    here, said in `ran_on`). `compiled`: the EPContext model (None: where there is one and
    the EP loads). `simulate`: components run on the CPU simulation of their uncompiled
    model instead (what the emulated target cannot run in time here)."""
    from winml_recipes.runtime.providers import availability, get_provider
    from winml_recipes.runtime.sessions import open_session
    from winml_recipes.runtime.target import target_session

    ep = get_provider(build.ep_key)
    on_ep = ep.is_cpu or availability(ep.key).available
    run = PipelineRun()
    for comp in build.components:
        if comp.name in simulate and comp.model is not None:
            feed = _feed_for(comp, inputs, run.outputs)
            run.feeds[comp.name] = feed
            run.outputs[comp.name] = open_session(comp.model).run(feed)
            run.ran_on[comp.name] = {
                "model": _rel(comp.model, build.folder),
                "ran_on": "cpu-simulation",
                "target_name": "the CPU simulation",
            }
            continue
        use_ctx = comp.compiled is not None and on_ep and compiled is not False
        if compiled and comp.compiled is None:
            raise ModelFileError(
                f"{comp.name}: not compiled (no model_ctx.onnx); run without --compiled",
                where=str(build.folder / comp.name),
            )
        path = comp.compiled if use_ctx else comp.model
        if path is None:
            why = "" if on_ep else f" ({ep.provider} cannot load here)"
            raise ModelFileError(
                f"{comp.name}: only the compiled model is shipped and it cannot run{why}",
                where=str(build.folder / comp.name),
            )
        feed = _feed_for(comp, inputs, run.outputs)
        session, record = target_session(path, build.device, fallback=comp.fallback, ep=ep.key)
        run.feeds[comp.name] = feed
        run.outputs[comp.name] = session.run(feed)
        run.ran_on[comp.name] = {"model": _rel(path, build.folder), "ran_on": record["verified_on"]}
        if record.get("target_name"):
            run.ran_on[comp.name]["target_name"] = record["target_name"]
        if "placement" in record:
            run.ran_on[comp.name]["placement"] = record["placement"]
    return run


def _rel(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)
