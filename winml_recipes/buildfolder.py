"""A build folder as tools that use its models see it (compare, run): the manifest, the
component a model file belongs to, and the inputs the build fed it.

`build/<recipe>/<device>-<precision>/` (or its `.failed/` evidence) holds `manifest.json`
and one folder per component with `model.onnx`; the manifest records each component's
input contract (dtypes, shapes with their dims, ranges, allowed values, image
preprocessing), so a model can be fed as its build fed it without the recipe or catalog.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from winml_recipes.sdk.contract import ImagePreprocess, IOContract, TensorSpec
from winml_recipes.sdk.errors import RecipeError
from winml_recipes.sdk.types import UpstreamComponent

MANIFEST = "manifest.json"
MODEL = "model.onnx"


@dataclass(frozen=True)
class BuiltComponent:
    """One component of a build folder."""

    build_dir: Path
    name: str
    model: Path  # the component's (uncompiled) model.onnx
    manifest: dict[str, Any]

    @property
    def record(self) -> dict[str, Any]:
        return self.manifest["components"][self.name]

    @property
    def contract(self) -> IOContract | None:
        """The inputs the build fed this component (None: a manifest from before they
        were recorded)."""
        recorded = self.record.get("contract")
        return contract_from_record(recorded) if recorded else None

    @property
    def failed(self) -> bool:
        return self.manifest.get("status") == "failed"


def find_component(path: Path, component: str | None = None) -> BuiltComponent | None:
    """The build-folder component `path` names: a model file in `<build>/<component>/`,
    that component folder, or the build folder itself with `component` (optional when the
    build has one component with a model). None: `path` is not inside a build folder."""
    path = Path(path)
    if path.is_dir() and (path / MANIFEST).is_file():
        manifest = _read(path / MANIFEST)
        names = [n for n, c in manifest.get("components", {}).items() if "artifact" in c]
        if component is None:
            if len(names) != 1:
                raise RecipeError(
                    f"{path} holds components {', '.join(names) or '(none with a model)'}; "
                    "name one (--component NAME, or the path of its folder)"
                )
            component = names[0]
        return _component(path, manifest, component)
    folder = path if path.is_dir() else path.parent
    if not (folder.parent / MANIFEST).is_file():
        if component is not None:
            raise RecipeError(f"{path}: --component needs a build folder (one with {MANIFEST})")
        return None
    manifest = _read(folder.parent / MANIFEST)
    if folder.name not in manifest.get("components", {}):
        return None
    if component is not None and component != folder.name:
        raise RecipeError(f"{path} is component '{folder.name}', not '{component}'")
    built = _component(folder.parent, manifest, folder.name)
    if path.is_file():
        return BuiltComponent(built.build_dir, built.name, path, manifest)
    return built


def _component(build_dir: Path, manifest: dict[str, Any], name: str) -> BuiltComponent:
    comps = manifest.get("components", {})
    if name not in comps:
        raise RecipeError(
            f"{build_dir}: no component '{name}'; components: {', '.join(comps) or '(none)'}"
        )
    model = build_dir / name / MODEL
    if not model.is_file():
        have = sorted(p.name for p in (build_dir / name).glob("*.onnx"))
        raise RecipeError(
            f"{build_dir / name}: no {MODEL} (files: {', '.join(have) or 'none'}); "
            "compare needs the uncompiled QDQ model (compile: {keep_uncompiled: true})"
        )
    return BuiltComponent(build_dir, name, model, manifest)


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RecipeError(f"cannot read the build's manifest: {exc}", where=str(path)) from None
    if not isinstance(data, dict):
        raise RecipeError("not a build manifest", where=str(path))
    return data


def contract_from_record(recorded: dict[str, Any]) -> IOContract:
    """The IOContract a manifest's `contract` record describes (engine.run.contract_record)."""

    def spec(name: str, s: dict[str, Any]) -> TensorSpec:
        image = s.get("image")
        return TensorSpec(
            name,
            s.get("dtype", "float32"),
            tuple(s.get("shape", ())),
            tuple(s["range"]) if s.get("range") is not None else None,
            tuple(s["values"]) if s.get("values") is not None else None,
            ImagePreprocess(
                size=tuple(image["size"]),
                mean=tuple(image["mean"]),
                std=tuple(image["std"]),
                layout=image.get("layout", "NCHW"),
            )
            if image
            else None,
        )

    inputs = tuple(spec(n, s) for n, s in recorded.get("inputs", {}).items())
    outputs = tuple(spec(n, s) for n, s in recorded.get("outputs", {}).items())
    return IOContract(inputs=inputs, outputs=outputs, dims=dict(recorded.get("dims", {})))


def verify_upstream(built: BuiltComponent) -> tuple[UpstreamComponent, int] | None:
    """The component whose float outputs fed this one's verification (`verify:
    {inputs_from}`, e.g. SAM's encoder embeddings for its decoder), as a step sees it, and
    the samples per upstream output; None when its verify read no other component."""
    options = next(
        (s.get("options", {}) for s in built.record.get("steps", [])
         if s.get("pass") == "verify" and s.get("options", {}).get("inputs_from")),
        None,
    )  # fmt: skip
    if options is None:
        return None
    name = options["inputs_from"]
    record = built.manifest.get("components", {}).get(name, {})
    if not record.get("contract"):
        return None
    up = BuiltComponent(built.build_dir, name, built.build_dir / name / MODEL, built.manifest)
    assert up.contract is not None
    upstream = UpstreamComponent(name, float_reference(up), "", up.contract, None)
    return upstream, int(options.get("samples_per_upstream", 1))


def float_reference(built: BuiltComponent, cache_root: Path | None = None) -> Path:
    """The float model the build verified this component against: the output of its last
    step that makes one (export, dequantize), read back from the step cache; else its
    float ONNX source file. An error says to give the reference when neither is there."""
    from winml_recipes.engine.cache import StepCache
    from winml_recipes.sdk.passes import all_passes

    passes = all_passes()
    cache = StepCache(cache_root)
    for step in reversed(built.record.get("steps", [])):
        cls = passes.get(step.get("pass", ""))
        if cls is None or not cls.produces_reference or step.get("status") not in ("ran", "cached"):
            continue
        entry = cache.get(step.get("cache_key", ""))
        if entry is None or entry.model is None:
            raise RecipeError(
                f"{built.name}: the float model of its {step['pass']} step is no longer in the "
                f"step cache ({cache.root}); give REFERENCE, or build the target again"
            )
        return entry.model
    source = built.record.get("source", {})
    path = Path(source.get("ref", ""))
    if source.get("kind") == "onnx" and path.is_file() and not _quantized(path):
        return path
    raise RecipeError(
        f"{built.name}: the build has no float model to compare with (its source is "
        f"{source.get('kind', 'unknown')} {source.get('ref', '')!r}); give REFERENCE"
    )


def _quantized(path: Path) -> bool:
    from winml_recipes.onnx.io import load_model
    from winml_recipes.onnx.quant import detect_quantization

    return detect_quantization(load_model(path, load_external_data=False)).quantized
