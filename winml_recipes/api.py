"""The Python API. The CLI is a thin shell over these functions (one code path)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from winml_recipes.engine.cache import StepCache
from winml_recipes.engine.plan import Plan, make_plan
from winml_recipes.engine.run import BuildResult, Reporter, run_plan
from winml_recipes.recipe import Recipe, load_recipe


def load(
    recipe: Path | str,
    *,
    device: str | None = None,
    precision: str | None = None,
    defines: dict[str, Any] | None = None,
    catalog_dir: Path | None = None,
) -> Recipe:
    """Render, parse and validate a recipe for one target (default: its first target)."""
    return load_recipe(
        recipe, device=device, precision=precision, defines=defines, catalog_dir=catalog_dir
    )


def targets_of(recipe: Path | str, **kwargs: Any) -> list[tuple[str, str]]:
    r = load(recipe, **kwargs)
    return [(t.device, t.precision) for t in r.targets]


def plan(recipe: Path | str, *, fetch: bool = True, **kwargs: Any) -> Plan:
    """Validate and plan without running anything (fetch=False: no Hub downloads)."""
    return make_plan(load(recipe, **kwargs), fetch=fetch)


def build(
    recipe: Path | str,
    *,
    output_root: Path | str = "build",
    use_cache: bool = True,
    cache_dir: Path | None = None,
    reporter: Reporter | None = None,
    wait_seconds: float = 600.0,
    **kwargs: Any,
) -> BuildResult:
    """Build one target of a recipe; returns the output directory and manifest."""
    the_plan = plan(recipe, **kwargs)
    return run_plan(
        the_plan,
        output_root=Path(output_root),
        cache=StepCache(cache_dir, enabled=use_cache),
        reporter=reporter,
        wait_seconds=wait_seconds,
    )


def build_onnx(
    model: Path | str,
    *,
    device: str,
    precision: str | None = None,
    shapes: dict[str, tuple[int, ...]] | None = None,
    **kwargs: Any,
) -> BuildResult:
    """Build a local ONNX file from the presets, without writing a recipe.

    A catalog entry and a recipe are generated into a temporary directory and built
    through the same loader, validator and engine as any recipe.
    """
    import tempfile

    from winml_recipes.authoring import write_adhoc_project
    from winml_recipes.errors import SourceError
    from winml_recipes.presets import default_precision, resolve_target

    model = Path(model)
    if not model.is_file():
        raise SourceError("file not found; check the path", where=str(model))
    precision = precision or default_precision(device)
    resolve_target(device, precision)
    with tempfile.TemporaryDirectory(prefix="winml-adhoc-") as tmp:
        recipe = write_adhoc_project(model, Path(tmp), device, precision, shapes or {})
        return build(recipe, device=device, precision=precision,
                     catalog_dir=Path(tmp) / "catalog", **kwargs)  # fmt: skip
