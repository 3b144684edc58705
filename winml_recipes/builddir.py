"""A build folder read back: its target, components, model files and input contracts.

`build/<recipe>/<device>-<precision>/manifest.json` names the components (in build order),
their shipped files and the catalog entry. Input specs come from the model itself (names,
dtypes, static dims) completed by the catalog's contract (ranges, allowed values, image
blocks, and the recipe's dims for dims the model leaves dynamic); a build whose catalog is
gone (an ad-hoc `build --onnx`) falls back to the graph alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from winml_recipes.sdk.contract import IOContract, TensorSpec
from winml_recipes.sdk.errors import ModelFileError, WinmlError

MANIFEST = "manifest.json"
MODEL_FILE = "model.onnx"


@dataclass(frozen=True)
class BuiltComponent:
    """One component of a build: its uncompiled and compiled (EPContext) models."""

    name: str
    model: Path | None  # model.onnx (None: compiled with the uncompiled model dropped)
    compiled: Path | None  # model_ctx.onnx when the build compiled it
    inputs: tuple[TensorSpec, ...]  # every shape concrete (ints)

    @property
    def deployable(self) -> Path:
        """What an app loads: the compiled model when there is one."""
        path = self.compiled or self.model
        assert path is not None
        return path


@dataclass(frozen=True)
class BuildFolder:
    folder: Path
    recipe: str
    model: str  # the catalog entry
    device: str
    precision: str
    components: tuple[BuiltComponent, ...]
    manifest: dict[str, Any]

    @property
    def label(self) -> str:
        return f"{self.recipe}/{self.device}-{self.precision}"

    def upstream_links(self) -> dict[str, dict[str, str]]:
        """For each component, which of its inputs an earlier component's output feeds
        (same tensor name: SAM's decoder takes the encoder's `image_embeddings.*`)."""
        produced: dict[str, str] = {}
        links: dict[str, dict[str, str]] = {}
        from winml_recipes.onnx.io import load_model

        for comp in self.components:
            links[comp.name] = {s.name: produced[s.name] for s in comp.inputs if s.name in produced}
            graph = load_model(comp.deployable, load_external_data=False).graph
            for out in graph.output:
                produced.setdefault(out.name, comp.name)
        return links


def read_build(folder: Path | str, catalog_dir: Path | None = None) -> BuildFolder:
    """The build in `folder` (a directory holding manifest.json), or a one-line error."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        raise ModelFileError(
            "no manifest.json here; pass a build folder (build/<recipe>/<device>-<precision>)",
            where=str(folder),
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        target = manifest["target"]
        components = manifest["components"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelFileError(f"not a build manifest ({exc})", where=str(path)) from None
    entry = _catalog_entry(manifest, catalog_dir)
    dims = _recipe_dims(manifest)
    built = []
    for name, record in components.items():
        model, compiled = _files(folder, name, record)
        contract = entry.components[name].contract if entry and name in entry.components else None
        probe = model or compiled
        assert probe is not None
        inputs = _input_specs(probe, contract, dims.get(name, dims.get("", {})))
        built.append(BuiltComponent(name, model, compiled, inputs))
    return BuildFolder(
        folder=folder,
        recipe=manifest.get("recipe", {}).get("name", folder.parent.name),
        model=str(manifest.get("model", "")),
        device=str(target["device"]),
        precision=str(target["precision"]),
        components=tuple(built),
        manifest=manifest,
    )


def _files(folder: Path, name: str, record: dict[str, Any]) -> tuple[Path | None, Path | None]:
    compiled = None
    for step in record.get("steps", []):
        if step.get("pass") == "compile" and step.get("status") != "skipped":
            onnx_files = [
                a["name"] for a in step.get("artifacts", []) if a["name"].endswith(".onnx")
            ]
            if onnx_files and (folder / name / onnx_files[0]).is_file():
                compiled = folder / name / onnx_files[0]
    model = folder / name / MODEL_FILE
    if not model.is_file():
        model = None
    if model is None and compiled is None:
        raise ModelFileError(
            f"component '{name}' has neither {MODEL_FILE} nor a compiled model; rebuild it",
            where=str(folder / name),
        )
    return model, compiled


def _catalog_entry(manifest: dict[str, Any], catalog_dir: Path | None):
    from winml_recipes.catalog import default_catalog_dir, load_entry

    name = manifest.get("model")
    if not name:
        return None
    recipe_path = Path(manifest.get("recipe", {}).get("path") or ".")
    with contextlib.suppress(WinmlError, OSError):
        return load_entry(name, catalog_dir or default_catalog_dir(recipe_path))
    return None


def _recipe_dims(manifest: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Per-component dims the rendered recipe set (top-level `dims`, then the component's)."""
    import yaml

    try:
        data = yaml.safe_load(manifest.get("recipe", {}).get("rendered") or "") or {}
    except yaml.YAMLError:
        return {}
    top = data.get("dims") or {}
    out = {}
    for name, own in (data.get("components") or {}).items():
        out[name] = {**top, **((own or {}).get("dims") or {})}
    out[""] = dict(top)  # components the recipe does not name
    return out


def _input_specs(
    model: Path, contract: IOContract | None, recipe_dims: dict[str, int]
) -> tuple[TensorSpec, ...]:
    """The model's inputs with concrete shapes: its static dims, else the contract's."""
    from winml_recipes.onnx.inputs import specs_from_model
    from winml_recipes.onnx.io import load_model

    specs, model_dims = specs_from_model(load_model(model, load_external_data=False))
    dims = {**(contract.dims if contract else {}), **recipe_dims}
    out = []
    for spec in specs:
        declared = contract.input(spec.name) if contract else None
        shape = []
        for i, d in enumerate(spec.shape):
            if isinstance(d, int):
                shape.append(d)
                continue
            want = declared.shape[i] if declared and i < len(declared.shape) else None
            value = want if isinstance(want, int) else dims.get(str(want), model_dims.get(d, 1))
            shape.append(int(value))
        if declared is not None:
            spec = dataclasses.replace(
                spec, range=declared.range, values=declared.values, image=declared.image
            )
        out.append(dataclasses.replace(spec, shape=tuple(shape)))
    return tuple(out)
