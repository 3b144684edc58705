"""`validate` and `plan`: check recipes and show the steps a build would run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from winml_recipes.cli.app import EXIT_USER, _echo_json, _load_kwargs, main, with_target_options
from winml_recipes.sdk.errors import WinmlError


@main.command()
@click.argument("recipes", nargs=-1, required=True, type=click.Path(path_type=Path))
@with_target_options
def validate(recipes, device, precision, ep, defines, catalog_dir, source) -> None:
    """Render, validate and plan recipes for every declared target (no downloads)."""
    from winml_recipes import api
    from winml_recipes.catalog import override_note

    failed = 0
    for path in recipes:
        try:
            kwargs = _load_kwargs(device, precision, ep, defines, catalog_dir, source)
            recipe = api.load(path, **kwargs)
            for t in recipe.targets:
                if (device in (None, t.device) and precision in (None, t.precision)
                        and ep in (None, t.ep, t.execution_provider)):  # fmt: skip
                    chosen = {"device": t.device, "precision": t.precision, "ep": t.ep or None}
                    api.plan(path, fetch=False, **{**kwargs, **chosen})
            click.echo(f"ok: {path} ({', '.join(t.label for t in recipe.targets)})")
            if override_note(recipe.catalog):
                click.echo(f"note: {override_note(recipe.catalog)}", err=True)
        except WinmlError as exc:
            failed += 1
            click.echo(f"error: {exc}", err=True)
    if failed:
        sys.exit(EXIT_USER)


@main.command()
@click.argument("recipe", type=click.Path(path_type=Path))
@with_target_options
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def plan(recipe, device, precision, ep, defines, catalog_dir, source, as_json) -> None:
    """Show the steps a build would run, with skip reasons, without running anything."""
    from winml_recipes import api

    kwargs = _load_kwargs(device, precision, ep, defines, catalog_dir, source)
    the_plan = api.plan(recipe, **kwargs)
    if as_json:
        _echo_json(the_plan.to_dict())
        return
    click.echo(f"{the_plan.recipe.name} -> {the_plan.target.label}")
    for comp in the_plan.components:
        click.echo(f"  {comp.name}  (source: {comp.source.ref})")
        for s in comp.steps:
            opts = f" {json.dumps(s.options, sort_keys=True)}" if s.options else ""
            state = f"skip: {s.skip}" if s.skip else "run"
            click.echo(f"    {s.index + 1}. {s.name}{opts}  [{state}]")
        for note in comp.notes:
            click.echo(f"    note: {note}")
    first = [f"{c.name} 1-{c.checked_first}" for c in the_plan.components if c.checked_first]
    if first:  # fail-fast steps (Pass.fail_fast) and those before them
        click.echo(f"  checked first, before any other step: {', '.join(first)}")
