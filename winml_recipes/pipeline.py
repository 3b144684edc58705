"""A build folder as a runnable pipeline: its components in catalog order, each fed the
outputs of the earlier ones by name (SAM: the vision encoder's embeddings feed the prompt
encoder / mask decoder), on the target's execution provider, with the float reference beside
it on the CPU EP."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from winml_recipes.sdk.contract import IOContract, TensorSpec
from winml_recipes.sdk.errors import ModelFileError, RecipeError

MANIFEST = "manifest.json"  # engine.run writes it (not imported: no cycle through the engine)
Outputs = dict[str, np.ndarray]


@dataclass(frozen=True)
class BuiltComponent:
    name: str
    contract: IOContract
    model: Path | None  # the uncompiled model (model.onnx), when shipped
    compiled: Path | None  # the EPContext model (model_ctx.onnx), when compiled
    reference: Path | None  # the float model (None: the shipped model is the float one)
    fallback: bool  # whether verify allowed CPU fallback on the target's EP

    def input_shape(self, name: str) -> tuple[int | None, ...] | None:
        """The shipped graph's shape of input `name` (None for dynamic dims)."""
        from winml_recipes.onnx.io import load_model

        path = self.model or self.compiled
        assert path is not None
        for vi in load_model(path, load_external_data=False).graph.input:
            if vi.name == name:
                dims = vi.type.tensor_type.shape.dim
                return tuple(d.dim_value if d.HasField("dim_value") else None for d in dims)
        return None


@dataclass(frozen=True)
class BuildFolder:
    path: Path
    manifest: dict[str, Any]
    name: str
    task: str | None
    device: str
    precision: str
    components: tuple[BuiltComponent, ...]

    @property
    def label(self) -> str:
        return f"{self.name} {self.device}/{self.precision}"

    def image_input(self) -> tuple[BuiltComponent, TensorSpec] | None:
        """The first component input with an `image:` block (None: not an image model)."""
        for comp in self.components:
            for spec in comp.contract.inputs:
                if spec.image is not None:
                    return comp, spec
        return None


def open_build(path: Path | str) -> BuildFolder:
    """A build folder (build/<recipe>/<device>-<precision>) read from its manifest."""
    from winml_recipes.catalog import entry_from_data, load_entry

    path = Path(path)
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise RecipeError(
            f"no {MANIFEST} here; pass a build folder such as build/<recipe>/<device>-<precision>",
            where=str(path),
        )
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RecipeError(f"unreadable manifest: {exc}", where=str(manifest_path)) from None
    if "catalog" in manifest:
        entry = entry_from_data(manifest["catalog"], manifest_path)
    else:  # a manifest from before the catalog was recorded: the entry by name
        entry = load_entry(manifest["model"])
    target = manifest["target"]
    components = []
    for name, record in manifest["components"].items():
        folder = path / name
        model = folder / "model.onnx"
        compiled = folder / "model_ctx.onnx"
        reference = record.get("reference", {}).get("path")
        verify = next((s for s in record["steps"] if s["pass"] == "verify"), {})
        components.append(
            BuiltComponent(
                name=name,
                contract=entry.components[name].contract,
                model=model if model.is_file() else None,
                compiled=compiled if compiled.is_file() else None,
                reference=path / reference if reference else None,
                fallback=bool(verify.get("metrics", {}).get("cpu_fallback_allowed", False)),
            )
        )
    return BuildFolder(
        path=path,
        manifest=manifest,
        name=manifest["recipe"]["name"],
        task=entry.data.get("task"),
        device=target["device"],
        precision=target["precision"],
        components=tuple(components),
    )


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
                where=str(build.path),
            )
        feed = _feed_for(comp, inputs, run.outputs)
        session = open_session(path)
        run.feeds[comp.name] = feed
        run.outputs[comp.name] = session.run(feed)
        run.ran_on[comp.name] = {"model": _rel(path, build.path), "ran_on": "cpu"}
    return run


def run_target(
    build: BuildFolder, inputs: Mapping[str, np.ndarray], compiled: bool | None = None
) -> PipelineRun:
    """The built pipeline on the target device's EP (CPU simulation where that EP cannot load
    here, said in `ran_on`). `compiled`: the EPContext model (None: where there is one and
    the EP loads)."""
    from winml_recipes.runtime.providers import availability, provider_for_device
    from winml_recipes.runtime.target import target_session

    ep = provider_for_device(build.device)
    on_ep = ep.is_cpu or availability(ep.key).available
    run = PipelineRun()
    for comp in build.components:
        use_ctx = comp.compiled is not None and on_ep and compiled is not False
        if compiled and comp.compiled is None:
            raise ModelFileError(
                f"{comp.name}: not compiled (no model_ctx.onnx); run without --compiled",
                where=str(build.path / comp.name),
            )
        path = comp.compiled if use_ctx else comp.model
        if path is None:
            why = "" if on_ep else f" ({ep.provider} cannot load here)"
            raise ModelFileError(
                f"{comp.name}: only the compiled model is shipped and it cannot run{why}",
                where=str(build.path / comp.name),
            )
        feed = _feed_for(comp, inputs, run.outputs)
        session, record = target_session(path, build.device, fallback=comp.fallback)
        run.feeds[comp.name] = feed
        run.outputs[comp.name] = session.run(feed)
        run.ran_on[comp.name] = {"model": _rel(path, build.path), "ran_on": record["verified_on"]}
        if "placement" in record:
            run.ran_on[comp.name]["placement"] = record["placement"]
    return run


def _rel(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)
