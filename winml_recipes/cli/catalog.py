"""`passes`, `catalog list/show` and `schema`: what this installation knows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from winml_recipes.cli.app import _echo_json, main


@main.command()
@click.option("--json", "as_json", is_flag=True)
def passes(as_json) -> None:
    """List the registered passes (devices, precisions) and the execution providers this
    machine can load (an EP that cannot says why, e.g. which package it needs)."""
    from winml_recipes.sdk.passes import all_passes, describe_support

    rows = []
    for name, cls in all_passes().items():
        devs, precs = describe_support(cls)
        rows.append(
            {
                "name": name,
                "version": cls.version,
                "devices": devs,
                "precisions": precs,
                "summary": cls.summary,
                "module": cls.__module__,
            }
        )
    eps = _execution_providers()
    if as_json:
        _echo_json({"passes": rows, "execution_providers": eps})
        return
    for r in rows:
        click.echo(
            f"{r['name']:<12} v{r['version']}  devices: {r['devices']:<14} "
            f"precisions: {r['precisions']:<10} {r['summary']}"
        )
    click.echo("\nexecution providers (verify runs the candidate on its device's EP):")
    for ep in eps:
        state = "available" if ep["available"] else f"not available: {ep['reason']}"
        versions = ", ".join(f"{k} {v}" for k, v in ep.get("versions", {}).items())
        click.echo(
            f"  {ep['key']:<8} {ep['provider']:<22} devices: {', '.join(ep['devices']) or '-':<5}"
            f" {state}" + (f" ({versions})" if versions else "")
        )


def _execution_providers() -> list[dict[str, Any]]:
    from winml_recipes.presets import device_settings, devices
    from winml_recipes.runtime.providers import execution_providers, identity

    rows = []
    for key in execution_providers():
        used_by = [d for d in devices() if device_settings(d).get("execution_provider") == key]
        rows.append({**identity(key), "devices": used_by})
    return rows


@main.group()
def catalog() -> None:
    """Browse the model catalog."""


def _catalog_dir(path: Path | None) -> Path | None:
    from winml_recipes.catalog import default_catalog_dir

    return path or default_catalog_dir()


@catalog.command("list")
@click.option(
    "--catalog",
    "catalog_dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="The project's catalog, listed with the built-in entries (default: ./catalog).",
)
@click.option("--json", "as_json", is_flag=True)
def catalog_list(catalog_dir, as_json) -> None:
    """List catalog entries: the built-in ones and the project's, and where each comes from."""
    from winml_recipes.catalog import entry_names, load_entry

    directory = _catalog_dir(catalog_dir)
    entries = [load_entry(n, directory) for n in entry_names(directory)]
    if as_json:
        _echo_json(
            [
                {
                    "name": e.name,
                    "task": e.data["task"],
                    "components": list(e.components),
                    "path": str(e.path),
                    "builtin": e.builtin,
                    "overrides": str(e.overrides) if e.overrides else None,
                }
                for e in entries
            ]
        )
        return
    for e in entries:
        origin = "built-in" if e.builtin else str(e.path)
        origin += " (overrides the built-in)" if e.overrides else ""
        click.echo(f"{e.name:<16} {e.data['task']:<22} {', '.join(e.components):<44} {origin}")


@catalog.command("show")
@click.argument("name")
@click.option("--catalog", "catalog_dir", type=click.Path(path_type=Path, file_okay=False))
@click.option("--json", "as_json", is_flag=True)
def catalog_show(name, catalog_dir, as_json) -> None:
    """Show one catalog entry (validated); the project's entry when it overrides a built-in."""
    import yaml

    from winml_recipes.catalog import load_entry, override_note

    entry = load_entry(name, _catalog_dir(catalog_dir))
    if override_note(entry):
        click.echo(f"note: {override_note(entry)}", err=True)
    if as_json:
        _echo_json(entry.data)
    else:
        click.echo(yaml.safe_dump(entry.data, sort_keys=False).rstrip())


@main.command()
@click.argument(
    "name", default="recipe", type=click.Choice(["recipe", "catalog", "manifest", "report"])
)
@click.option("--write", is_flag=True, help="Write every schema into --dir instead of printing.")
@click.option("--dir", "directory", default="schemas", type=click.Path(path_type=Path))
def schema(name, write, directory) -> None:
    """Print a JSON Schema (the recipe schema composes every pass's options)."""
    from winml_recipes import schemas

    if write:
        for path in schemas.write_all(directory):
            click.echo(f"wrote {path}")
    else:
        click.echo(schemas.render(name), nl=False)
