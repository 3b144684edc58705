"""Shared fixtures: an isolated cache per session, the repo paths, a CLI runner."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

REPO = Path(__file__).resolve().parents[1]


def known_names() -> tuple[str, str, str]:
    """Passes, devices and precisions as error messages list them."""
    from winml_recipes.presets import devices, precisions
    from winml_recipes.sdk.passes import all_passes

    return ", ".join(all_passes()), ", ".join(devices()), ", ".join(precisions())


RECIPES = REPO / "recipes"
# The built-in catalog and partials ship inside the package (winml_recipes/data).
DATA = REPO / "winml_recipes" / "data"
CATALOG = DATA / "catalog"
PARTIALS = DATA / "partials"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`@pytest.mark.ep_device("openvino")`: the test needs that EP to offer a device here.
    Where it offers none (onnxruntime-ep-openvino on an AMD host, say), the test does not
    run and its reason names why; the behaviour without the device is tested on every host
    (tests/integration/test_openvino_no_device.py)."""
    wanted = {m.args[0] for item in items for m in item.iter_markers("ep_device") if m.args}
    if not wanted:
        return
    from winml_recipes.runtime.providers import availability

    absent = {key: availability(key) for key in wanted}
    for item in items:
        for mark in item.iter_markers("ep_device"):
            found = absent[mark.args[0]]
            if not found.available:
                item.add_marker(
                    pytest.mark.skip(
                        reason=f"needs a device of the {mark.args[0]} EP, none here: {found.reason}"
                    )
                )


@pytest.fixture(scope="session", autouse=True)
def session_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One step cache for the whole session (exports are reused), never the user's."""
    cache = tmp_path_factory.mktemp("cache")
    os.environ["WINML_RECIPES_CACHE"] = str(cache)
    # The per-layer plot costs seconds per npu build; report tests ask for it (layers=True).
    os.environ["WINML_RECIPES_REPORT_LAYERS"] = "0"
    os.environ.pop("WINML_RECIPES_CATALOG", None)
    return cache


def cli(*args: str | Path) -> Result:
    """Run the CLI in-process; stderr is kept apart from stdout."""
    from winml_recipes.cli import main

    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def cli_subprocess(
    *args: str | Path, cwd: Path | None = None, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run `python -m winml_recipes` in a real process (exit codes, signals, imports)."""
    return subprocess.run(
        [sys.executable, "-m", "winml_recipes", *map(str, args)],
        cwd=cwd or REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="session")
def tiny_build(tmp_path_factory: pytest.TempPathFactory):
    """sam3-tiny built once for cpu/fp32 (export included); shared by read-only tests."""
    from winml_recipes import api

    out = tmp_path_factory.mktemp("tiny-build")
    return api.build(RECIPES / "sam3-tiny.yaml", output_root=out)


def make_mlp_onnx(path: Path, *, seed: int = 0, hidden: int = 8) -> Path:
    """A small float MLP (MatMul, Add, Relu, MatMul) with a dynamic `batch` dim."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w1 = numpy_helper.from_array(rng.standard_normal((4, hidden)).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32), "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((hidden, 3)).astype(np.float32), "w2")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
            helper.make_node("Add", ["h", "b1"], ["hb"], name="add1"),
            helper.make_node("Relu", ["hb"], ["r"], name="relu1"),
            helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2"),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        initializer=[w1, b1, w2],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, str(path))
    return path


MLP_CATALOG = """\
schema_version: 1
name: mlp
task: feature-extraction
license: mit
components:
  model:
    source: {{ref: {ref}}}
    dims: {{batch: 2}}
    inputs:
      x: {{dtype: float32, shape: [batch, 4], range: [-1.0, 1.0]}}
    outputs:
      y: {{shape: [batch, 3]}}
"""


def make_mlp_project(root: Path, steps: str = "[normalize, verify]", extra: str = "") -> Path:
    """root/catalog/mlp.yaml + root/recipes/mlp.yaml around a local MLP; returns the recipe."""
    (root / "catalog").mkdir(parents=True, exist_ok=True)
    (root / "recipes").mkdir(exist_ok=True)
    make_mlp_onnx(root / "catalog" / "mlp.onnx")
    (root / "catalog" / "mlp.yaml").write_text(MLP_CATALOG.format(ref="./mlp.onnx"))
    recipe = root / "recipes" / "mlp.yaml"
    recipe.write_text(
        "schema_version: 1\nname: mlp\nmodel: mlp\n"
        "targets:\n  - {device: cpu, precision: fp32}\n  - {device: npu, precision: fp32}\n"
        f"steps: {steps}\n{extra}"
    )
    return recipe


def sqnr_against_float_sam3(float_models: dict, built_models: dict, seed: int = 4242) -> dict:
    """Output SQNR (dB) of built SAM 3 graphs against the float sam3-tiny, on fresh inputs:
    the bundled held-out photographs verification does not use (it takes the first 4).

    The decoder is fed embeddings from the float vision encoder, as in use.
    """
    from winml_recipes import api
    from winml_recipes.bundled import bundled_images
    from winml_recipes.feeds import from_images, synthetic, take
    from winml_recipes.onnx.metrics import compare_runs
    from winml_recipes.runtime.sessions import run_model
    from winml_recipes.sdk.contract import IOContract

    entry = api.load(RECIPES / "sam3-tiny.yaml").catalog
    enc = entry.components["vision_encoder"].contract
    dec = entry.components["prompt_encoder_mask_decoder"].contract
    images = take(from_images(list(bundled_images("heldout"))[4:], enc, 4, seed), 4)
    embeddings = run_model(float_models["vision_encoder"], images)
    own = IOContract(tuple(i for i in dec.inputs if i.name not in embeddings[0]), (), dec.dims)
    prompts = [
        {**p, **e} for p, e in zip(take(synthetic(own, 4, seed), 4), embeddings, strict=True)
    ]
    out = {}
    for comp, feeds in (("vision_encoder", images), ("prompt_encoder_mask_decoder", prompts)):
        metrics = compare_runs(
            run_model(float_models[comp], feeds), run_model(built_models[comp], feeds)
        )
        out.update({name: m["sqnr_db"] for name, m in metrics.items()})
    return out


@pytest.fixture(scope="session")
def tiny_npu_build(tmp_path_factory: pytest.TempPathFactory):
    """sam3-tiny built once for npu/w8a16 (QNN HTP, compiled); shared by read-only tests."""
    from winml_recipes import api

    out = tmp_path_factory.mktemp("tiny-npu-build")
    result = api.build(RECIPES / "sam3-tiny.yaml", device="npu", precision="w8a16", output_root=out)
    api.run(result.output_dir)  # the picture the report shows (it runs nothing itself)
    api.report(result.output_dir, layers=True)  # the per-layer plot, off for the other builds
    return result
