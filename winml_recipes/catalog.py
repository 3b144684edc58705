"""Catalog entries: components, sources, I/O contracts and shape hints.

The built-in entries ship inside the package (winml_recipes/data/catalog); a project's own
`catalog/*.yaml` adds to them, and an entry of the same name overrides the built-in one.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from winml_recipes.data import CATALOG, builtin_dir
from winml_recipes.schemas import NAME_PATTERN, catalog_schema
from winml_recipes.sdk.contract import AudioPreprocess, ImagePreprocess, IOContract, TensorSpec
from winml_recipes.sdk.errors import CatalogError
from winml_recipes.yamlfile import load_yaml, validate

CATALOG_ENV = "WINML_RECIPES_CATALOG"


@dataclass(frozen=True)
class Component:
    name: str
    source: dict[str, Any]
    contract: IOContract
    task: str | None = None
    source_line: int = 0  # line of `source:` in the catalog file, for error messages
    sources: dict[str, dict[str, Any]] = field(default_factory=dict)  # named alternatives

    def pick_source(self, name: str | None) -> tuple[dict[str, Any], str | None]:
        """The source spec called `name` (None: the default) and its name, if it has one."""
        if not self.sources:
            return self.source, None
        name = name or next(iter(self.sources))
        return self.sources[name], name


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    path: Path
    data: dict[str, Any]  # validated raw data (also the `catalog` template variable)
    components: dict[str, Component]
    overrides: Path | None = None  # the built-in entry of the same name this one hides

    @property
    def builtin(self) -> bool:
        return self.path.parent.resolve() == builtin_catalog_dir().resolve()

    @property
    def family(self) -> str | None:
        return self.data.get("family")

    @property
    def source_names(self) -> list[str]:
        """Names of the alternative sources its components offer (empty: one source each)."""
        names: dict[str, None] = {}
        for comp in self.components.values():
            names |= dict.fromkeys(comp.sources)
        return list(names)


def builtin_catalog_dir() -> Path:
    """The catalog that ships inside the package (always available, from any folder)."""
    return builtin_dir(CATALOG)


def default_catalog_dir(near: Path | None = None) -> Path | None:
    """The project's own catalog, which adds to (and by name overrides) the built-in one:
    $WINML_RECIPES_CATALOG, else ../catalog beside a recipe, else ./catalog; None when
    there is none (the built-in entries are then the catalog)."""
    if os.environ.get(CATALOG_ENV):
        return Path(os.environ[CATALOG_ENV])
    if near is not None and (near.parent.parent / "catalog").is_dir():
        return near.parent.parent / "catalog"
    if Path("catalog").is_dir():
        return Path("catalog")
    return None


def _project_dir(catalog_dir: Path | None) -> Path | None:
    """The project catalog to search before the built-ins (None: none, or the built-ins
    themselves); a directory that was named but does not exist is an error, not a no-op."""
    if catalog_dir is None:
        return None
    if not catalog_dir.is_dir():
        raise CatalogError(f"catalog directory not found: {catalog_dir}; pass --catalog DIR")
    if catalog_dir.resolve() == builtin_catalog_dir().resolve():
        return None
    return catalog_dir


def _names_in(directory: Path) -> list[str]:
    return sorted(p.stem for p in directory.glob("*.yaml") if re.match(NAME_PATTERN, p.stem))


def entry_names(catalog_dir: Path | None = None) -> list[str]:
    """Every entry name: the project's (`catalog_dir`) and the built-in ones."""
    project = _project_dir(catalog_dir)
    names = set(_names_in(builtin_catalog_dir()))
    if project is not None:
        names |= set(_names_in(project))
    return sorted(names)


def entry_path(name: str, catalog_dir: Path | None = None) -> Path:
    """Where entry `name` is read from: the project's catalog first, then the built-in one."""
    if not re.match(NAME_PATTERN, name):
        raise CatalogError(
            f"invalid catalog entry name '{name}': a bare name like 'sam3' "
            f"(catalog/NAME.yaml), not a path"
        )
    project = _project_dir(catalog_dir)
    for directory in (project, builtin_catalog_dir()):
        if directory is None:
            continue
        path = directory / f"{name}.yaml"
        if path.is_symlink() or path.exists():
            real = path.resolve()
            if directory.resolve() not in real.parents:
                raise CatalogError(
                    "is a link that leaves the catalog directory; catalog entries are files in it",
                    where=str(path),
                )
            if not real.is_file():
                raise CatalogError("is not a regular file", where=str(path))
            return path
    names = entry_names(project)
    close = difflib.get_close_matches(name, names, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    listed = f"built-in: {', '.join(_names_in(builtin_catalog_dir())) or 'none'}"
    if project is not None:
        listed = f"{project}: {', '.join(_names_in(project)) or 'none'}; {listed}"
    raise CatalogError(f"unknown catalog entry '{name}'{hint}; entries in {listed}")


def load_entry(name: str, catalog_dir: Path | None = None) -> CatalogEntry:
    """Entry `name` from the project's catalog (`catalog_dir`), else the built-in one."""
    path = entry_path(name, catalog_dir)
    entry = load_file(path)
    builtin = builtin_catalog_dir() / f"{name}.yaml"
    if not entry.builtin and builtin.is_file():
        return dataclasses.replace(entry, overrides=builtin)
    return entry


def override_note(entry: CatalogEntry) -> str | None:
    """One line saying a project entry hides the built-in one of that name, if it does."""
    if entry.overrides is None:
        return None
    return f"catalog entry '{entry.name}' from {entry.path} overrides the built-in one"


def load_file(path: Path) -> CatalogEntry:
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise CatalogError(f"not a UTF-8 text file (byte {exc.start})", where=str(path)) from None
    return entry_from_text(text, path)


def entry_from_text(text: str, path: Path) -> CatalogEntry:
    """The entry in `text`, checked as if read from `path` (schema, name, dims, images)."""
    loaded = load_yaml(text, str(path), CatalogError)
    if not isinstance(loaded.data, dict):
        raise CatalogError("a catalog entry must be a mapping", where=f"{path}:1")
    validate(loaded, catalog_schema(), str(path), CatalogError)
    data = loaded.data
    if data["name"] != path.stem:
        line = loaded.lines.get(("name",), 1)
        raise CatalogError(
            f"$.name: '{data['name']}' must match the file name '{path.stem}'",
            where=f"{path}:{line}",
        )
    components = {
        cname: _component(cname, c, loaded.lines, path) for cname, c in data["components"].items()
    }
    return CatalogEntry(data["name"], path, data, components)


def _component(name: str, data: dict[str, Any], lines: dict, path: Path) -> Component:
    dims = dict(data.get("dims", {}))
    inputs = tuple(_tensor(n, s) for n, s in data["inputs"].items())
    outputs = tuple(_tensor(n, s) for n, s in data["outputs"].items())
    for spec in inputs:
        for d in spec.shape:
            if isinstance(d, str) and d not in dims:
                line = lines.get(("components", name, "inputs", spec.name, "shape"), 1)
                raise CatalogError(
                    f"$.components.{name}.inputs.{spec.name}.shape: dim '{d}' has no default; "
                    f"add it under components.{name}.dims",
                    where=f"{path}:{line}",
                )
        if spec.image is not None:
            _check_image(name, spec, lines, path)
        if spec.range and spec.range[0] > spec.range[1]:
            line = lines.get(("components", name, "inputs", spec.name, "range"), 1)
            raise CatalogError(
                f"$.components.{name}.inputs.{spec.name}.range: low is above high",
                where=f"{path}:{line}",
            )
    sources = {k: dict(v) for k, v in data.get("sources", {}).items()}
    key = "sources" if sources else "source"
    return Component(
        name,
        dict(data["source"]) if not sources else next(iter(sources.values())),
        IOContract(inputs, outputs, dims),
        data.get("task"),
        source_line=lines.get(("components", name, key), 0),
        sources=sources,
    )


def _check_image(component: str, spec: TensorSpec, lines: dict, path: Path) -> None:
    """An image block must fit its input: 4 dims, 3 channels, the resize size in place."""
    assert spec.image is not None
    shape = spec.shape
    layout = spec.image.layout
    where = f"$.components.{component}.inputs.{spec.name}.image"
    line = lines.get(("components", component, "inputs", spec.name, "image"), 1)
    if len(shape) != 4:
        raise CatalogError(
            f"{where}: an image input needs 4 dims ({layout}), the shape has {len(shape)}",
            where=f"{path}:{line}",
        )
    hw = (shape[2], shape[3]) if layout == "NCHW" else (shape[1], shape[2])
    channels = shape[1] if layout == "NCHW" else shape[3]
    for got, want in zip(hw, spec.image.size, strict=True):
        if isinstance(got, int) and got != want:
            raise CatalogError(
                f"{where}: size {list(spec.image.size)} does not match the input's "
                f"{layout} shape {list(shape)}; resize to the model's height and width",
                where=f"{path}:{line}",
            )
    if isinstance(channels, int) and not (
        len(spec.image.mean) in (1, channels) and len(spec.image.std) in (1, channels)
    ):
        raise CatalogError(
            f"{where}: mean and std need 1 or {channels} values", where=f"{path}:{line}"
        )


def _tensor(name: str, spec: dict[str, Any]) -> TensorSpec:
    return TensorSpec(
        name=name,
        dtype=spec.get("dtype", "float32"),
        shape=tuple(spec["shape"]),
        range=tuple(spec["range"]) if "range" in spec else None,
        values=tuple(spec["values"]) if "values" in spec else None,
        image=_image(spec["image"]) if "image" in spec else None,
        audio=_audio(spec["audio"]) if "audio" in spec else None,
        ctc_blank=spec.get("ctc_blank"),
        shape_advisory=bool(spec.get("shape_advisory", False)),
    )


def _image(spec: dict[str, Any]) -> ImagePreprocess:
    size = spec["size"]
    hw = (size, size) if isinstance(size, int) else (size[0], size[1])
    return ImagePreprocess(
        size=hw,
        mean=tuple(spec.get("mean", (0.0, 0.0, 0.0))),
        std=tuple(spec.get("std", (1.0, 1.0, 1.0))),
        layout=spec.get("layout", "NCHW"),
    )


def _audio(spec: dict[str, Any]) -> AudioPreprocess:
    return AudioPreprocess(
        feature_extractor=spec["feature_extractor"],
        sampling_rate=int(spec.get("sampling_rate", 16000)),
        options=tuple(sorted(dict(spec.get("options") or {}).items())),
    )


def entry_from_data(data: dict[str, Any], where: Path) -> CatalogEntry:
    """An entry from its validated data as a manifest records it (`where` names the file)."""
    components = {name: _component(name, c, {}, where) for name, c in data["components"].items()}
    return CatalogEntry(data["name"], where, data, components)
