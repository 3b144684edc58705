"""A build folder read back, for the tools that use its models (run, report, perf, compare).

`build/<recipe>/<device>-<precision>/` (or a failed build's `<target>.failed/` evidence)
holds `manifest.json` and one folder per component, in build order, with `model.onnx`
and, when compiled, `model_ctx.onnx`; `float-reference/<component>/model.onnx` when the
shipped model is not the float one. The manifest records the target, the catalog entry,
each component's input contract (dtypes, shapes with their dims, ranges, allowed values,
image preprocessing: `engine.run.contract_record`) and its float reference, so a model is
fed as its build fed it without the recipe or catalog. A manifest from before contracts
were recorded falls back to the catalog entry with the recipe's dims.

A build folder is untrusted input (it is zipped, mailed, downloaded): the manifest is read
through the bounded JSON reader and checked against its generated schema, and every path
comes from the folder itself (`inside`: no `..`, no absolute path, no link resolving out,
regular files only), as the image and dataset readers do. docs/security.md has the rule.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import stat
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from winml_recipes.sdk.contract import AudioPreprocess, ImagePreprocess, IOContract, TensorSpec
from winml_recipes.sdk.errors import ModelFileError, RecipeError, WinmlError
from winml_recipes.sdk.types import UpstreamComponent
from winml_recipes.untrusted import printable

MANIFEST = "manifest.json"  # engine.run writes it (not imported: no cycle through the engine)
MODEL = "model.onnx"
COMPILED = "model_ctx.onnx"


@dataclass(frozen=True)
class BuiltComponent:
    """One component of a build folder: its models, manifest record and input contract."""

    folder: Path  # the build folder
    name: str
    manifest: dict[str, Any]
    contract: IOContract | None  # the inputs the build fed it (None: unknown, old manifest)
    model: Path | None  # the uncompiled model (model.onnx), when shipped
    compiled: Path | None  # the EPContext model (model_ctx.onnx), when compiled
    reference: Path | None  # the shipped float model (None: the model is the float one)

    @property
    def record(self) -> dict[str, Any]:
        return self.manifest["components"][self.name]

    @property
    def failed(self) -> bool:
        return self.manifest.get("status") == "failed"

    @property
    def fallback(self) -> bool:
        """Whether verify allowed CPU fallback on the target's EP."""
        verify = next((s for s in self.record.get("steps", []) if s.get("pass") == "verify"), {})
        return bool(verify.get("metrics", {}).get("cpu_fallback_allowed", False))

    @property
    def deployable(self) -> Path:
        """What an app loads: the compiled model when there is one."""
        path = self.compiled or self.model
        if path is None:
            raise ModelFileError(
                f"component '{self.name}' has neither {MODEL} nor a compiled model; rebuild it",
                where=str(self.folder / self.name),
            )
        return path

    def input_shape(self, name: str) -> tuple[int | None, ...] | None:
        """The shipped graph's shape of input `name` (None for dynamic dims)."""
        from winml_recipes.onnx.io import load_model

        graph = load_model(self.model or self.deployable, load_external_data=False).graph
        for vi in graph.input:
            if vi.name == name:
                dims = vi.type.tensor_type.shape.dim
                return tuple(d.dim_value if d.HasField("dim_value") else None for d in dims)
        return None

    @cached_property
    def inputs(self) -> tuple[TensorSpec, ...]:
        """The shipped graph's inputs with concrete shapes (its static dims, else the
        contract's) and the contract's ranges, values and image blocks."""
        from winml_recipes.onnx.inputs import specs_from_model
        from winml_recipes.onnx.io import load_model

        model = load_model(self.model or self.deployable, load_external_data=False)
        specs, model_dims = specs_from_model(model)
        contract = self.contract
        out = []
        for spec in specs:
            declared = contract.input(spec.name) if contract else None
            shape = []
            for i, d in enumerate(spec.shape):
                want = declared.shape[i] if declared and i < len(declared.shape) else None
                if not isinstance(d, int):
                    dims = contract.dims if contract else {}
                    d = want if isinstance(want, int) else dims.get(str(want), model_dims.get(d, 1))
                shape.append(int(d))
            if declared is not None:
                spec = dataclasses.replace(
                    spec, range=declared.range, values=declared.values, image=declared.image
                )
            out.append(dataclasses.replace(spec, shape=tuple(shape)))
        return tuple(out)


@dataclass(frozen=True)
class BuildFolder:
    folder: Path
    manifest: dict[str, Any]
    task: str | None
    components: tuple[BuiltComponent, ...]

    @property
    def recipe(self) -> str:
        return str(self.manifest.get("recipe", {}).get("name", self.folder.parent.name))

    @property
    def device(self) -> str:
        return str(self.manifest["target"]["device"])

    @property
    def precision(self) -> str:
        return str(self.manifest["target"]["precision"])

    @property
    def ep(self) -> str:
        """The EP the recipe named for the target ("" when it builds for the device's)."""
        return str(self.manifest["target"].get("ep", ""))

    @property
    def ep_key(self) -> str:
        """The key of the EP plugin the target was built for."""
        from winml_recipes.runtime.providers import provider_for_device

        return self.ep or provider_for_device(self.device).key

    @property
    def failed(self) -> bool:
        return self.manifest.get("status") == "failed"

    @property
    def label(self) -> str:
        """How people name it: `sam3-tiny npu/w8a16`."""
        return f"{self.recipe} {self.target_label}"

    @property
    def target_label(self) -> str:
        """device/precision[/ep]."""
        return f"{self.device}/{self.precision}" + (f"/{self.ep}" if self.ep else "")

    @property
    def relpath(self) -> str:
        """Its folder under the output root: `sam3-tiny/npu-w8a16`."""
        return f"{self.recipe}/{self.device}-{self.precision}" + (f"-{self.ep}" if self.ep else "")

    def component(self, name: str) -> BuiltComponent:
        found = next((c for c in self.components if c.name == name), None)
        if found is None:
            names = ", ".join(c.name for c in self.components) or "(none)"
            raise RecipeError(f"{self.folder}: no component '{name}'; components: {names}")
        return found

    def image_input(self) -> tuple[BuiltComponent, TensorSpec] | None:
        """The first component input with an `image:` block (None: not an image model)."""
        for comp in self.components:
            for spec in comp.contract.inputs if comp.contract else ():
                if spec.image is not None:
                    return comp, spec
        return None

    def upstream_links(self) -> dict[str, dict[str, str]]:
        """For each component, which of its inputs an earlier component's output feeds
        (same tensor name: SAM's decoder takes the encoder's `image_embeddings.*`)."""
        from winml_recipes.onnx.io import load_model

        produced: dict[str, str] = {}
        links: dict[str, dict[str, str]] = {}
        for comp in self.components:
            links[comp.name] = {s.name: produced[s.name] for s in comp.inputs if s.name in produced}
            graph = load_model(comp.deployable, load_external_data=False).graph
            for out in graph.output:
                produced.setdefault(out.name, comp.name)
        return links


def open_build(
    folder: Path | str, catalog_dir: Path | None = None, *, contracts: bool = False
) -> BuildFolder:
    """The build in `folder` (a directory holding manifest.json), or a one-line error.
    `contracts`: every component's input contract is needed (an error when unknown)."""
    folder = Path(folder)
    if not (folder / MANIFEST).is_file():
        raise ModelFileError(
            f"no {MANIFEST} here; pass a build folder (build/<recipe>/<device>-<precision>)",
            where=str(folder),
        )
    manifest = read_manifest(folder)
    records = manifest["components"]
    entry = None
    if "catalog" not in manifest or not all(r.get("contract") for r in records.values()):
        entry = _catalog_entry(manifest, folder, catalog_dir)
    task = manifest.get("catalog", entry.data if entry else {}).get("task")
    components = tuple(_component(folder, manifest, name, entry) for name in records)
    missing = [c.name for c in components if c.contract is None]
    if contracts and missing:
        raise RecipeError(
            f"{', '.join(missing)}: the manifest records no input contract and catalog entry "
            f"'{manifest.get('model')}' is not found; build the target again",
            where=str(folder / MANIFEST),
        )
    return BuildFolder(folder, manifest, task, components)


def find_component(path: Path, component: str | None = None) -> BuiltComponent | None:
    """The build-folder component `path` names: a model file in `<build>/<component>/`,
    that component folder, or the build folder itself with `component` (optional when the
    build has one component with a model); its `model` is the model file (an error when
    there is none). None: `path` is not inside a build folder."""
    path = Path(path)
    if path.is_dir() and (path / MANIFEST).is_file():
        build = open_build(path)
        if component is None:
            names = [c.name for c in build.components if "artifact" in c.record]
            if len(names) != 1:
                raise RecipeError(
                    f"{path} holds components {', '.join(names) or '(none with a model)'}; "
                    "name one (--component NAME, or the path of its folder)"
                )
            component = names[0]
        return _with_model(build.component(component))
    folder = path if path.is_dir() else path.parent
    if not (folder.parent / MANIFEST).is_file():
        if component is not None:
            raise RecipeError(f"{path}: --component needs a build folder (one with {MANIFEST})")
        return None
    build = open_build(folder.parent)
    if folder.name not in {c.name for c in build.components}:
        return None
    if component is not None and component != folder.name:
        raise RecipeError(f"{path} is component '{folder.name}', not '{component}'")
    built = _with_model(build.component(folder.name))
    return dataclasses.replace(built, model=path) if path.is_file() else built


def _with_model(built: BuiltComponent) -> BuiltComponent:
    if built.model is None:
        have = sorted(p.name for p in (built.folder / built.name).glob("*.onnx"))
        raise RecipeError(
            f"{built.folder / built.name}: no {MODEL} (files: {', '.join(have) or 'none'}); "
            "compare needs the uncompiled QDQ model (compile: {keep_uncompiled: true})"
        )
    return built


def _component(folder: Path, manifest: dict[str, Any], name: str, entry: Any) -> BuiltComponent:
    record = manifest["components"][name]
    where = f"{folder / MANIFEST}: components.{printable(name)}"
    inside(folder, name, f"{where}: the component's folder", kind="folder")
    if record.get("contract"):
        contract = contract_from_record(record["contract"], where=f"{where}.contract")
    elif entry is not None and name in entry.components:
        contract = entry.components[name].contract
        contract = dataclasses.replace(
            contract, dims={**contract.dims, **_recipe_dims(manifest, name)}
        )
    else:
        contract = None
    model = inside(folder, f"{name}/{MODEL}", where)
    compiled = inside(folder, f"{name}/{COMPILED}", where)
    if compiled is not None:
        _check_context_binaries(folder, compiled)
    reference = record.get("reference", {}).get("path")
    ref = inside(folder, reference, f"{where}.reference.path") if reference else None
    if reference and ref is None:
        raise ModelFileError(
            f"reference.path {printable(reference)!r} is not in the build folder; "
            "copy the whole build folder, or build the target again",
            where=where,
        )
    return BuiltComponent(
        folder=folder,
        name=name,
        manifest=manifest,
        contract=contract,
        model=model,
        compiled=compiled,
        reference=ref,
    )


def inside(folder: Path, relative: str, what: str, *, kind: str = "file") -> Path | None:
    """`folder/relative` when it exists and is a regular file (`kind` "folder": a folder)
    inside `folder`; None when it does not exist. A relative path that is absolute, has a
    drive or a `..` part, or a link resolving outside `folder`, is refused (one line): a
    build folder's paths come from the folder itself (the rule of datafiles.py's readers)."""
    text = str(relative)
    posix, windows = PurePosixPath(text.replace("\\", "/")), PureWindowsPath(text)
    if (
        not text
        or posix.is_absolute()
        or windows.drive
        or windows.root
        or ".." in posix.parts
        or any(ord(c) < 32 for c in text)
    ):
        raise ModelFileError(
            f"{printable(text)!r} is not a path inside the build folder (absolute, or with "
            "'..'); refused",
            where=what,
        )
    path = folder.joinpath(*posix.parts)
    if not (path.is_symlink() or path.exists()):
        return None
    try:
        target, base = path.resolve(strict=True), folder.resolve(strict=True)
    except (OSError, RuntimeError) as exc:  # a dangling link, a link loop
        raise ModelFileError(
            f"cannot resolve {printable(text)!r}: {printable(exc)}", where=what
        ) from None
    if target == base or not target.is_relative_to(base):
        raise ModelFileError(
            f"{printable(text)!r} is a link to {printable(target)}, outside the build folder; "
            "refused (a build folder's files must be in it)",
            where=what,
        )
    mode = target.stat().st_mode
    if not (stat.S_ISDIR(mode) if kind == "folder" else stat.S_ISREG(mode)):
        raise ModelFileError(f"{printable(text)!r} is not a {kind}; refused", where=what)
    return path


def _check_context_binaries(folder: Path, compiled: Path) -> None:
    """Every context binary an EPContext node of `compiled` names (embed mode 0) is a file
    beside it in the build folder (the EP opens it by that name)."""
    import onnx

    from winml_recipes.onnx.io import load_model

    base = compiled.parent.relative_to(folder).as_posix()
    for node in load_model(compiled, load_external_data=False).graph.node:
        if node.op_type != "EPContext":
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if attrs.get("embed_mode", 1) != 0:
            continue
        name = attrs.get("ep_cache_context", b"")
        name = name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
        inside(folder, f"{base}/{name}", f"{compiled}: node {printable(node.name)!r}")


def read_manifest(folder: Path) -> dict[str, Any]:
    """`folder/manifest.json` read through the bounded JSON reader (size and depth capped)
    and checked against the manifest's generated schema: one line naming the field."""
    from winml_recipes.untrusted import read_json_bounded
    from winml_recipes.yamlfile import first_schema_error

    path = folder / MANIFEST
    data = read_json_bounded(path)
    problem = first_schema_error(data, _manifest_schema())
    if problem is not None:
        raise ModelFileError(
            f"not a build manifest this tool reads: {printable(problem)}; build the target "
            "again (or pass the folder of a build)",
            where=str(path),
        )
    return data


@lru_cache(maxsize=1)
def _manifest_schema() -> dict[str, Any]:
    from winml_recipes.schemas import manifest_schema

    return manifest_schema()


def _catalog_entry(manifest: dict[str, Any], folder: Path, catalog_dir: Path | None) -> Any:
    """The catalog entry the manifest records, else (an old manifest) the one it names."""
    from winml_recipes.catalog import default_catalog_dir, entry_from_data, load_entry

    with contextlib.suppress(WinmlError, OSError, KeyError):
        if "catalog" in manifest:
            return entry_from_data(manifest["catalog"], folder / MANIFEST)
        # the recipe path a manifest records is not followed (paths come from the folder):
        # --catalog, $WINML_RECIPES_CATALOG or ./catalog, then the built-in entries
        return load_entry(str(manifest["model"]), catalog_dir or default_catalog_dir())
    return None


def _recipe_dims(manifest: dict[str, Any], name: str) -> dict[str, int]:
    """The dims the rendered recipe set for component `name` (top level, then its own);
    {} when the text is not such a recipe (read with the bounded YAML loader)."""
    from winml_recipes.yamlfile import load_yaml

    def mapping(value: object) -> dict[str, Any]:
        return value if isinstance(value, dict) else {}

    try:
        text = manifest.get("recipe", {}).get("rendered") or ""
        data = mapping(load_yaml(text, "recipe.rendered", ModelFileError).data)
    except WinmlError:
        return {}
    own = mapping(mapping(data.get("components")).get(name))
    dims = {**mapping(data.get("dims")), **mapping(own.get("dims"))}
    return {k: v for k, v in dims.items() if isinstance(v, int) and not isinstance(v, bool)}


def contract_from_record(recorded: dict[str, Any], where: str = "") -> IOContract:
    """The IOContract a manifest's `contract` record describes (engine.run.contract_record).
    Its image blocks are checked (`check_image`): the schema bounds each value, not how
    they fit together."""

    def spec(name: str, s: dict[str, Any]) -> TensorSpec:
        image = s.get("image")
        if image:
            check_image(image, f"{where}.inputs.{printable(name)}.image" if where else name)
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
            audio=AudioPreprocess(
                s["audio"]["feature_extractor"],
                int(s["audio"].get("sampling_rate", 16000)),
                tuple(sorted(dict(s["audio"].get("options") or {}).items())),
            )
            if s.get("audio")
            else None,
            ctc_blank=s.get("ctc_blank"),
        )

    inputs = tuple(spec(n, s) for n, s in recorded.get("inputs", {}).items())
    outputs = tuple(spec(n, s) for n, s in recorded.get("outputs", {}).items())
    return IOContract(inputs=inputs, outputs=outputs, dims=dict(recorded.get("dims", {})))


MAX_IMAGE_SIDE = 16384  # the catalog schema's bound on image.size (schemas.MAX_IMAGE_SIDE)
IMAGE_CHANNELS = (1, 3)  # mean/std: one value for every channel, or one per RGB channel


def check_image(image: dict[str, Any], where: str) -> None:
    """A recorded `image:` block a photo can be preprocessed with: size two positive ints
    (height, width) of at most MAX_IMAGE_SIDE, mean and std numbers (std above 0) with one
    value or one per RGB channel; else a one-line error naming the field."""
    size, mean, std = image.get("size"), image.get("mean", [0.0]), image.get("std", [1.0])

    def whole(v: object) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    def number(v: object) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool) and v == v  # not NaN

    if not (isinstance(size, list) and len(size) == 2 and all(whole(v) for v in size)) or not all(
        1 <= v <= MAX_IMAGE_SIDE for v in size
    ):
        raise ModelFileError(
            f"image.size must be [height, width], two whole numbers from 1 to "
            f"{MAX_IMAGE_SIDE}, not {printable(size)}; build the target again",
            where=where,
        )
    for field, values in (("mean", mean), ("std", std)):
        if not (
            isinstance(values, list)
            and len(values) in IMAGE_CHANNELS
            and all(number(v) and abs(v) < 1e6 for v in values)
            and (field == "mean" or all(v > 0 for v in values))
        ):
            raise ModelFileError(
                f"image.{field} must be 1 or 3 finite numbers"
                f"{' above 0' if field == 'std' else ''}, not {printable(values)}; "
                "build the target again",
                where=where,
            )


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
    if not built.manifest["components"].get(name, {}).get("contract"):
        return None
    up = _component(built.folder, built.manifest, name, None)
    assert up.contract is not None
    upstream = UpstreamComponent(name, float_reference(up), "", up.contract, None)
    return upstream, int(options.get("samples_per_upstream", 1))


def float_reference(built: BuiltComponent, cache_root: Path | None = None) -> Path:
    """The float model the build verified this component against: the copy the build
    ships (`float-reference/`); else the output of its last step that makes one (export,
    dequantize), read back from the step cache; else its float ONNX source file. An error
    says to give the reference when none is there."""
    from winml_recipes.engine.cache import StepCache
    from winml_recipes.sdk.passes import all_passes

    if built.reference is not None and built.reference.is_file():
        return built.reference

    passes = all_passes()
    cache = StepCache(cache_root)
    for step in reversed(built.record.get("steps", [])):
        cls = passes.get(step.get("pass", ""))
        if cls is None or not cls.produces_reference or step.get("status") not in ("ran", "cached"):
            continue
        key = str(step.get("cache_key", ""))
        # a step-cache key is a sha256: anything else would name a path outside the cache
        entry = cache.get(key) if re.fullmatch(r"[0-9a-f]{64}", key) else None
        if entry is None or entry.model is None:
            raise RecipeError(
                f"{built.name}: the float model of its {step['pass']} step is no longer in the "
                f"step cache ({cache.root}); give REFERENCE, or build the target again"
            )
        return entry.model
    # The manifest's source path is never opened: a build folder's paths come from the folder.
    source = built.record.get("source", {})
    raise RecipeError(
        f"{built.name}: the build folder holds no float model to compare with (its source "
        f"is {printable(source.get('kind', 'unknown'))} {printable(source.get('ref', ''))!r}); "
        "give REFERENCE (that file, if it is the float model)"
    )
