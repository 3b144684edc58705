"""`inspect` and `dequantize`: look at and rewrite one ONNX file."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from winml_recipes.cli.app import _echo_json, main


@main.command()
@click.argument("model")
@click.option("--json", "as_json", is_flag=True)
def inspect(model, as_json) -> None:
    """Describe an ONNX file (local path or org/repo/file.onnx): quantization, I/O, ops."""
    import yaml

    from winml_recipes.hub import local_model_file
    from winml_recipes.onnx.digest import graph_digest
    from winml_recipes.onnx.io import load_model
    from winml_recipes.onnx.quant import detect_quantization

    shown, model = model, local_model_file(model)

    proto = load_model(model, load_external_data=False, sidecars_required=True)
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
    from winml_recipes.hub import local_model_file
    from winml_recipes.onnx.io import load_model, save_model
    from winml_recipes.outputroot import check_output_file
    from winml_recipes.quant.dequantize import dequantize_model
    from winml_recipes.sdk.errors import RecipeError

    shown, model = model, local_model_file(model)

    if not check and output is None:
        raise RecipeError("dequantize needs -o OUT.onnx (or --check to only report)")
    if output is not None and check:
        raise RecipeError("--check writes nothing: drop -o")
    if output is not None and output.resolve() == Path(model).resolve():
        raise RecipeError("-o must differ from the input model")
    if output is not None:  # a folder, read-only or full: one line before any other
        check_output_file(output, 2 * Path(model).stat().st_size + 2**20)
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
