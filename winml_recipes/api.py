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


def plan(recipe: Path | str, **kwargs: Any) -> Plan:
    """Validate and plan without running anything."""
    return make_plan(load(recipe, **kwargs))


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
