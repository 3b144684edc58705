"""`init` and `hub ls`: start a project from a model, find ONNX files on the Hub."""

from __future__ import annotations

from pathlib import Path

import click

from winml_recipes.cli.app import _echo_json, main
from winml_recipes.untrusted import printable


@main.command()
@click.argument("model_ref")
@click.option("--name", help="Entry and recipe name (default: the file name).")
@click.option(
    "--catalog",
    "catalog_dir",
    default="catalog",
    type=click.Path(path_type=Path),
    show_default=True,
)
@click.option(
    "--recipes",
    "recipes_dir",
    default="recipes",
    type=click.Path(path_type=Path),
    show_default=True,
)
def init(model_ref, name, catalog_dir, recipes_dir) -> None:
    """Write a starting catalog entry, recipe and schemas in any folder (never overwrites).

    MODEL_REF: a local .onnx or HF directory, a Hub ONNX file org/repo/path.onnx, or an HF
    model id. Prints the commands that validate and build the project from here.
    """
    import yaml

    from winml_recipes.authoring import init_project, next_commands, task_line

    catalog_path, recipe_path = init_project(
        model_ref, name=name, catalog_dir=catalog_dir, recipes_dir=recipes_dir
    )
    click.echo(f"wrote {catalog_path}\nwrote {recipe_path}")
    entry = yaml.safe_load(catalog_path.read_text(encoding="utf-8"))
    click.echo(task_line(entry, change=f"the task in {catalog_path.name}"))
    for command in next_commands(catalog_path, recipe_path):
        click.echo(f"next: {command}")


@main.group()
def hub() -> None:
    """Discover ONNX files on the Hugging Face Hub."""


@hub.command("ls")
@click.argument("repo_id")
@click.option("--revision", help="Branch, tag or commit (default: main).")
@click.option("--json", "as_json", is_flag=True)
def hub_ls(repo_id, revision, as_json) -> None:
    """List a repo's .onnx files with sizes and their external-data sidecars."""
    from winml_recipes.hub import list_onnx

    entries = list_onnx(repo_id, revision)
    if as_json:
        _echo_json(
            [
                {
                    "ref": e.ref,
                    "path": e.path,
                    "size": e.size,
                    "sidecars": e.sidecars,
                    "commit": e.commit,
                }
                for e in entries
            ]
        )
        return
    # Paths come from the server: escaped, so a newline in one cannot forge a line.
    if not entries:
        click.echo(f"{printable(repo_id)}: no .onnx files")
        return
    click.echo(f"{printable(repo_id)} @ {printable(entries[0].commit)}")
    for e in entries:
        click.echo(f"  {printable(e.path):<60} {e.size / 1e6:10.2f} MB")
        for side, size in e.sidecars.items():
            click.echo(f"    + {printable(side):<58} {size / 1e6:10.2f} MB")
