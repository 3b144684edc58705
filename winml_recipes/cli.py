"""Command line: parse arguments, call winml_recipes.api, print, map errors to exit codes."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from winml_recipes.errors import WinmlError

EXIT_USER = 2
EXIT_INTERNAL = 1


class _Group(click.Group):
    """Turns every WinmlError into one line on stderr and its exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except WinmlError as exc:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            click.echo(f"error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except OSError as exc:  # a path that is not writable, not a directory, ...
            if ctx.obj and ctx.obj.get("debug"):
                raise
            where = f"{exc.filename}: " if exc.filename else ""
            click.echo(f"error: {where}{exc.strerror or exc}", err=True)
            sys.exit(EXIT_USER)
        except KeyboardInterrupt:
            click.echo("error: interrupted; the previous output and the cache are intact", err=True)
            sys.exit(130)


def _echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


target_options = [
    click.option("--device", help="Target device (cpu, gpu, npu)."),
    click.option("--precision", help="Target precision (fp32, ...)."),
    click.option(
        "-D", "defines", multiple=True, metavar="KEY=VALUE", help="Template variable (repeatable)."
    ),
    click.option(
        "--catalog",
        "catalog_dir",
        type=click.Path(path_type=Path, file_okay=False),
        help="Catalog directory (default: ../catalog beside the recipe, $WINML_RECIPES_CATALOG).",
    ),
]


def with_target_options(fn):
    for opt in reversed(target_options):
        fn = opt(fn)
    return fn


def _load_kwargs(device, precision, defines, catalog_dir) -> dict[str, Any]:
    from winml_recipes.recipe import parse_defines

    return {
        "device": device,
        "precision": precision,
        "defines": parse_defines(defines),
        "catalog_dir": catalog_dir,
    }


@click.group(cls=_Group)
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
@click.version_option(package_name="winml-recipes")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """Build ONNX models for on-device inference from declarative recipes."""
    ctx.obj = {"debug": debug}


@main.command()
@click.argument("recipes", nargs=-1, required=True, type=click.Path(path_type=Path))
@with_target_options
def validate(recipes, device, precision, defines, catalog_dir) -> None:
    """Render, validate and plan recipes for every declared target (no downloads)."""
    from winml_recipes import api

    failed = 0
    for path in recipes:
        try:
            kwargs = _load_kwargs(device, precision, defines, catalog_dir)
            targets = api.targets_of(path, **kwargs)
            for dev, prec in targets:
                if device in (None, dev) and precision in (None, prec):
                    api.plan(path, fetch=False, **{**kwargs, "device": dev, "precision": prec})
            click.echo(f"ok: {path} ({', '.join(f'{d}/{p}' for d, p in targets)})")
        except WinmlError as exc:
            failed += 1
            click.echo(f"error: {exc}", err=True)
    if failed:
        sys.exit(EXIT_USER)


@main.command()
@click.argument("recipe", type=click.Path(path_type=Path))
@with_target_options
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def plan(recipe, device, precision, defines, catalog_dir, as_json) -> None:
    """Show the steps a build would run, with skip reasons, without running anything."""
    from winml_recipes import api

    the_plan = api.plan(recipe, **_load_kwargs(device, precision, defines, catalog_dir))
    if as_json:
        _echo_json(the_plan.to_dict())
        return
    click.echo(f"{the_plan.recipe.name} -> {the_plan.target.device}/{the_plan.target.precision}")
    for comp in the_plan.components:
        click.echo(f"  {comp.name}  (source: {comp.source.ref})")
        for s in comp.steps:
            opts = f" {json.dumps(s.options, sort_keys=True)}" if s.options else ""
            state = f"skip: {s.skip}" if s.skip else "run"
            click.echo(f"    {s.index + 1}. {s.name}{opts}  [{state}]")


@main.command()
@click.argument("recipe", required=False, type=click.Path(path_type=Path))
@with_target_options
@click.option("--all-targets", is_flag=True, help="Build every target the recipe declares.")
@click.option("--no-cache", is_flag=True, help="Run every step; neither read nor write the cache.")
@click.option(
    "-o",
    "--output",
    "output_root",
    default="build",
    type=click.Path(path_type=Path),
    show_default=True,
    help="Output root: OUTPUT/<recipe>/<device>-<precision>/.",
)
@click.option(
    "--wait",
    "wait_seconds",
    default=600.0,
    show_default=True,
    help="Seconds to wait for another build of the same output.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the manifest(s) as JSON.")
@click.option(
    "--onnx",
    "onnx_file",
    help="Build this ONNX file from the presets instead of a recipe (needs --device).",
)
@click.option(
    "--shape",
    "shapes",
    multiple=True,
    metavar="NAME=DxD...",
    help="With --onnx: an input's shape, e.g. pixel_values=1x3x224x224 (repeatable).",
)
def build(
    recipe,
    device,
    precision,
    defines,
    catalog_dir,
    all_targets,
    no_cache,
    output_root,
    wait_seconds,
    as_json,
    onnx_file,
    shapes,
) -> None:
    """Build a recipe for one target (default: its first) or --all-targets.

    Or build any local ONNX file from the presets: build --onnx model.onnx --device npu.
    """
    from winml_recipes import api
    from winml_recipes.errors import RecipeError

    if onnx_file is not None:
        from winml_recipes.authoring import parse_shapes

        if recipe is not None or all_targets or defines or catalog_dir:
            raise RecipeError(
                "--onnx builds from the presets: drop RECIPE, --all-targets, -D and --catalog"
            )
        if not device:
            raise RecipeError("--onnx needs --device (cpu, gpu, npu)")
        reporter = _reporter(as_json)
        with reporter:
            from winml_recipes.sources import local_model_file

            result = api.build_onnx(
                local_model_file(onnx_file),
                device=device,
                precision=precision,
                shapes=parse_shapes(shapes),
                output_root=output_root,
                use_cache=not no_cache,
                reporter=reporter,
                wait_seconds=wait_seconds,
            )
        if as_json:
            _echo_json(result.manifest)
        else:
            _print_summary(result)
        return
    if shapes:
        raise RecipeError("--shape is only for --onnx; recipes take shapes from the catalog")
    if recipe is None:
        raise RecipeError("missing RECIPE (e.g. recipes/sam3-tiny.yaml) or --onnx FILE")
    kwargs = _load_kwargs(device, precision, defines, catalog_dir)
    if all_targets:
        if device or precision:
            raise RecipeError("--all-targets cannot be combined with --device/--precision")
        targets = api.targets_of(recipe, **kwargs)
    else:
        targets = [(device, precision)]
    manifests = []
    for dev, prec in targets:
        reporter = _reporter(as_json)
        with reporter:
            result = api.build(
                recipe,
                output_root=output_root,
                use_cache=not no_cache,
                reporter=reporter,
                wait_seconds=wait_seconds,
                **{**kwargs, "device": dev, "precision": prec},
            )
        manifests.append(result.manifest)
        if not as_json:
            _print_summary(result)
    if as_json:
        _echo_json(manifests[0] if len(manifests) == 1 else manifests)


def _reporter(quiet: bool):
    from winml_recipes.progress import make_reporter

    return make_reporter(enabled=not quiet and sys.stderr.isatty())


def _print_summary(result) -> None:
    m = result.manifest
    click.echo(
        f"built {m['recipe']['name']} for {m['target']['device']}/{m['target']['precision']}"
        f" in {m['wall_seconds']:.1f}s -> {result.output_dir}"
    )
    for name, comp in m["components"].items():
        statuses = " ".join(f"{s['pass']}:{s['status']}" for s in comp["steps"])
        size = comp["artifact"]["size_bytes"] / 1e6
        click.echo(f"  {name}: {size:.2f} MB  [{statuses}]")
        for s in comp["steps"]:
            outs = s.get("metrics", {}).get("outputs") if s["pass"] == "verify" else None
            for out, met in (outs or {}).items():
                click.echo(
                    f"    {out}: SQNR {met['sqnr_db']:.1f} dB, cosine {met['cosine']:.5f},"
                    f" max_abs {met['max_abs']:.3g}"
                )


@main.command()
@click.option("--json", "as_json", is_flag=True)
def passes(as_json) -> None:
    """List the registered passes with the devices and precisions each supports."""
    from winml_recipes.engine.registry import all_passes, describe_support

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
    if as_json:
        _echo_json(rows)
        return
    for r in rows:
        click.echo(
            f"{r['name']:<12} v{r['version']}  devices: {r['devices']:<14} "
            f"precisions: {r['precisions']:<10} {r['summary']}"
        )


@main.group()
def catalog() -> None:
    """Browse the model catalog."""


def _catalog_dir(path: Path | None) -> Path:
    from winml_recipes.catalog import default_catalog_dir

    return path or default_catalog_dir()


@catalog.command("list")
@click.option("--catalog", "catalog_dir", type=click.Path(path_type=Path, file_okay=False))
@click.option("--json", "as_json", is_flag=True)
def catalog_list(catalog_dir, as_json) -> None:
    """List catalog entries."""
    from winml_recipes.catalog import entry_names, load_entry

    directory = _catalog_dir(catalog_dir)
    entries = [load_entry(n, directory) for n in entry_names(directory)]
    if as_json:
        _echo_json(
            [
                {"name": e.name, "task": e.data["task"], "components": list(e.components)}
                for e in entries
            ]
        )
        return
    for e in entries:
        click.echo(f"{e.name:<16} {e.data['task']:<22} {', '.join(e.components)}")


@catalog.command("show")
@click.argument("name")
@click.option("--catalog", "catalog_dir", type=click.Path(path_type=Path, file_okay=False))
@click.option("--json", "as_json", is_flag=True)
def catalog_show(name, catalog_dir, as_json) -> None:
    """Show one catalog entry (validated)."""
    import yaml

    from winml_recipes.catalog import load_entry

    entry = load_entry(name, _catalog_dir(catalog_dir))
    if as_json:
        _echo_json(entry.data)
    else:
        click.echo(yaml.safe_dump(entry.data, sort_keys=False).rstrip())


@main.command()
@click.argument("name", default="recipe", type=click.Choice(["recipe", "catalog", "manifest"]))
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


@main.command()
@click.argument("model")
@click.option("--json", "as_json", is_flag=True)
def inspect(model, as_json) -> None:
    """Describe an ONNX file (local path or org/repo/file.onnx): quantization, I/O, ops."""
    import yaml

    from winml_recipes.onnx.digest import graph_digest
    from winml_recipes.onnx.io import load_model
    from winml_recipes.onnx.quant import detect_quantization
    from winml_recipes.sources import local_model_file

    shown, model = model, local_model_file(model)

    proto = load_model(model, load_external_data=False)
    digest = graph_digest(proto, base_dir=model.parent)
    if as_json:
        _echo_json(digest)
        return
    quant = detect_quantization(proto)
    click.echo(f"{shown}: " + (f"quantized ({quant.describe()})" if quant.quantized else "float"))
    click.echo(yaml.safe_dump(digest, sort_keys=False).rstrip())


EXIT_NEEDS_REWRITE = 3


@main.command()
@click.argument("model")
@click.option(
    "-o", "--output", type=click.Path(path_type=Path), help="Where to write the float model."
)
@click.option(
    "--check",
    is_flag=True,
    help=f"Write nothing; exit 0 if already float, {EXIT_NEEDS_REWRITE} if rewrites are needed.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def dequantize(model, output, check, as_json) -> None:
    """Rewrite a quantized ONNX model (QDQ, QOperator, dynamic, MatMulNBits) into float.

    MODEL is a local path or a Hub ONNX file (org/repo/path.onnx).
    """
    from winml_recipes.errors import RecipeError
    from winml_recipes.onnx.io import load_model, save_model
    from winml_recipes.quant.dequantize import dequantize_model
    from winml_recipes.sources import local_model_file

    shown, model = model, local_model_file(model)

    if not check and output is None:
        raise RecipeError("dequantize needs -o OUT.onnx (or --check to only report)")
    if output is not None and check:
        raise RecipeError("--check writes nothing: drop -o")
    if output is not None and output.resolve() == Path(model).resolve():
        raise RecipeError("-o must differ from the input model")
    float_model, report = dequantize_model(load_model(model))
    if as_json:
        _echo_json({"model": shown, **report.to_dict(), "summary": report.describe()})
    else:
        click.echo(f"{shown}: {report.describe()}")
    if check:
        sys.exit(EXIT_NEEDS_REWRITE if report.changed else 0)
    save_model(float_model, output)
    if not as_json:
        click.echo(f"wrote {output}" + ("" if report.changed else " (an unchanged copy)"))


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
    """Write a starting catalog entry and recipe for a local or Hub ONNX file (never overwrites)."""
    from winml_recipes.authoring import init_project

    catalog_path, recipe_path = init_project(
        model_ref, name=name, catalog_dir=catalog_dir, recipes_dir=recipes_dir
    )
    click.echo(f"wrote {catalog_path}\nwrote {recipe_path}")
    click.echo(f"next: winml-recipes validate {recipe_path}")


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
    if not entries:
        click.echo(f"{repo_id}: no .onnx files")
        return
    click.echo(f"{repo_id} @ {entries[0].commit}")
    for e in entries:
        click.echo(f"  {e.path:<60} {e.size / 1e6:10.2f} MB")
        for side, size in e.sidecars.items():
            click.echo(f"    + {side:<58} {size / 1e6:10.2f} MB")
