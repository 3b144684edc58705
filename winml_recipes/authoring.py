"""Write a catalog entry and a recipe for a model file (used by `build --onnx`).

The generated YAML goes through the normal loader and validator, so a build from a bare
ONNX file takes exactly the same code path as a build from a curated recipe.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import yaml

from winml_recipes.errors import RecipeError
from winml_recipes.specs import TensorSpec


def parse_shapes(items: tuple[str, ...] | list[str]) -> dict[str, tuple[int, ...]]:
    """`--shape name=1x3x224x224` options."""
    out: dict[str, tuple[int, ...]] = {}
    for item in items:
        name, sep, dims = item.partition("=")
        if not sep or not name or not re.fullmatch(r"\d+(x\d+)*", dims):
            raise RecipeError(
                f"--shape '{item}': expected NAME=DxDx... (e.g. pixel_values=1x3x224x224)"
            )
        out[name] = tuple(int(d) for d in dims.split("x"))
    return out


def _dims_from_shapes(
    specs: list[TensorSpec], dims: dict[str, int], shapes: Mapping[str, tuple[int, ...]]
) -> dict[str, int]:
    by_name = {s.name: s for s in specs}
    for name, shape in shapes.items():
        spec = by_name.get(name)
        if spec is None:
            raise RecipeError(
                f"--shape {name}: the model has no input '{name}'; inputs: {', '.join(by_name)}"
            )
        if len(shape) != len(spec.shape):
            raise RecipeError(
                f"--shape {name}: {len(shape)} dims given, the input has "
                f"{len(spec.shape)} ({list(spec.shape)})"
            )
        for want, got in zip(spec.shape, shape, strict=True):
            if isinstance(want, int) and want != got:
                raise RecipeError(f"--shape {name}: dim of size {want} cannot be {got}")
            if isinstance(want, str):
                dims[want] = got
    return dims


def _identifier(text: str) -> str:
    out = re.sub(r"[^A-Za-z0-9_]", "_", text)
    return out if re.match(r"[A-Za-z_]", out) else f"_{out}"


def _tensor(spec: TensorSpec) -> dict:
    out: dict = {"dtype": spec.dtype, "shape": list(spec.shape)}
    if spec.range is not None:
        out["range"] = [float(spec.range[0]), float(spec.range[1])]
    return out


def onnx_entry(
    model_path: Path, name: str, shapes: Mapping[str, tuple[int, ...]]
) -> tuple[dict, dict[str, int]]:
    """A catalog entry (plain data) with one component, `model`, read from the graph."""
    from winml_recipes.onnx.digest import value_info_dict
    from winml_recipes.onnx.inputs import specs_from_model
    from winml_recipes.onnx.io import load_model

    model = load_model(model_path, load_external_data=False)
    specs, dims = specs_from_model(model)
    dims = _dims_from_shapes(specs, dims, shapes)
    outputs = {}
    for vi in model.graph.output:
        shape = value_info_dict(vi)["shape"] or []
        outputs[vi.name] = {
            "shape": [
                d if d is not None else f"{_identifier(vi.name)}_dim{i}"
                for i, d in enumerate(shape)
            ]
        }
    entry = {
        "schema_version": 1,
        "name": name,
        "task": "unknown",
        "license": "unknown",
        "description": f"Generated from {model_path.name}",
        "components": {
            "model": {
                "source": {"ref": str(model_path.resolve())},
                "dims": dims,
                "inputs": {s.name: _tensor(s) for s in specs},
                "outputs": outputs,
            }
        },
    }
    return entry, dims


def write_adhoc_project(
    model_path: Path, root: Path, device: str, precision: str, shapes: Mapping[str, tuple[int, ...]]
) -> Path:
    """root/catalog/NAME.yaml + root/recipes/NAME.yaml for one target; returns the recipe."""
    name = re.sub(r"[^A-Za-z0-9._-]", "-", model_path.stem) or "model"
    entry, _ = onnx_entry(model_path, name, shapes)
    (root / "catalog").mkdir(parents=True, exist_ok=True)
    (root / "recipes").mkdir(exist_ok=True)
    (root / "catalog" / f"{name}.yaml").write_text(yaml.safe_dump(entry, sort_keys=False))
    recipe = {
        "schema_version": 1,
        "name": name,
        "model": name,
        "description": f"Ad-hoc build of {model_path} from the presets",
        "targets": [{"device": device, "precision": precision}],
    }
    path = root / "recipes" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path
