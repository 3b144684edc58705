"""Passes on real models: normalize once, fix_shapes, verify thresholds, plugins, auto export."""

from __future__ import annotations

import json
import sys
import textwrap

import onnx
import pytest

from tests.conftest import cli, make_mlp_onnx, make_mlp_project
from winml_recipes import __version__, api
from winml_recipes.onnx.stamp import is_normalized, read_stamp


def _steps(result, component: str = "model") -> dict:
    return {s["pass"]: s for s in result.manifest["components"][component]["steps"]}


def test_normalize_runs_on_unstamped_source_and_stamps(tmp_path) -> None:
    recipe = make_mlp_project(tmp_path)
    result = api.build(recipe, output_root=tmp_path / "build", use_cache=False)
    steps = _steps(result)
    assert steps["normalize"]["status"] == "ran"
    model = onnx.load(str(result.models["model"]))
    assert is_normalized(model)
    assert read_stamp(model)["tool"] == f"winml-recipes {__version__} normalize/ort"


def test_built_model_as_source_is_not_normalized_twice(tmp_path) -> None:
    first = api.build(make_mlp_project(tmp_path / "a"), output_root=tmp_path / "build-a")
    # Use the normalized output as the source of a second project.
    recipe = make_mlp_project(tmp_path / "b")
    (tmp_path / "b" / "catalog" / "mlp.onnx").write_bytes(first.models["model"].read_bytes())
    plan = api.plan(recipe)
    normalize = plan.components[0].steps[0]
    assert normalize.skip == "already normalized (stamp matches the graph fingerprint)"
    second = api.build(recipe, output_root=tmp_path / "build-b")
    assert _steps(second)["normalize"]["status"] == "skipped"


def test_model_edited_after_normalization_is_normalized_again(tmp_path) -> None:
    first = api.build(make_mlp_project(tmp_path / "a"), output_root=tmp_path / "build-a")
    model = onnx.load(str(first.models["model"]))
    model.graph.node[-1].name = "renamed_by_another_tool"  # stamp still there, graph changed
    recipe = make_mlp_project(tmp_path / "b")
    onnx.save(model, str(tmp_path / "b" / "catalog" / "mlp.onnx"))
    assert read_stamp(model) is not None and not is_normalized(model)
    assert api.plan(recipe).components[0].steps[0].skip is None


def test_force_normalizes_a_stamped_model(tmp_path) -> None:
    recipe = make_mlp_project(tmp_path, steps="[normalize, {normalize: {force: true}}, verify]")
    result = api.build(recipe, output_root=tmp_path / "build")
    statuses = [s["status"] for s in result.manifest["components"]["model"]["steps"]]
    assert statuses[0] in ("ran", "cached") and statuses[1:] == ["ran", "ran"]


def test_onnxscript_backend_keeps_outputs(tmp_path) -> None:
    recipe = make_mlp_project(tmp_path, steps="[{normalize: {backend: onnxscript}}, verify]")
    result = api.build(recipe, output_root=tmp_path / "build")
    outputs = _steps(result)["verify"]["metrics"]["outputs"]
    assert outputs["y"]["max_abs"] < 1e-5


def test_fix_shapes_uses_catalog_dims_and_overrides(tmp_path) -> None:
    recipe = make_mlp_project(tmp_path, steps="[{fix_shapes: {dims: {batch: 5}}}]")
    result = api.build(recipe, output_root=tmp_path / "build")
    model = onnx.load(str(result.models["model"]))
    shape = [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim]
    assert shape == [5, 3]
    assert _steps(result)["fix_shapes"]["metrics"] == {"fixed": {"batch": 5}}


def test_verify_below_threshold_fails_and_writes_only_evidence(tmp_path) -> None:
    recipe = make_mlp_project(tmp_path, steps="[normalize, {verify: {min_sqnr_db: 250}}]")
    result = cli("build", recipe, "-o", tmp_path / "build")
    assert result.exit_code == 3  # a quality gate, not bad input
    failed = tmp_path / "build" / "mlp" / "cpu-fp32.failed"
    # where: the recipe line of the step, the component/step and the target; the evidence
    assert result.stderr.strip() == (
        f"error: {recipe}:7: model/verify [cpu/fp32]: verification on cpu failed: "
        f"y: SQNR 200 dB (gate >= 250 dB, margin -50 dB) FAIL; evidence kept in {failed}/"
    )
    assert not (tmp_path / "build" / "mlp" / "cpu-fp32").exists()
    assert (failed / "manifest.json").is_file()


def test_verify_checks_output_shapes_against_contract(tmp_path) -> None:
    recipe = make_mlp_project(tmp_path)
    catalog = tmp_path / "catalog" / "mlp.yaml"
    catalog.write_text(
        catalog.read_text().replace("y: {shape: [batch, 3]}", "y: {shape: [batch, 7]}")
    )
    result = cli("build", recipe, "-o", tmp_path / "build")
    assert result.exit_code == 2
    assert "output 'y' has shape [2, 3], the catalog says [2, 7]" in result.stderr


PLUGIN = """
from pathlib import Path
from winml_recipes.sdk.passes import Pass
from winml_recipes.sdk.types import StepResult

class NpuOnly(Pass):
    name = "npu_only"
    version = 3
    summary = "A third-party pass for tests."
    devices = frozenset({"npu"})
    options_schema = {"type": "object", "additionalProperties": False,
                      "properties": {"level": {"type": "integer", "default": 1}}}

    def run(self, src, out_dir, options, ctx):
        return StepResult(None, {"level": options["level"], "device": ctx.target.device})
"""


@pytest.fixture
def plugin_on_path(tmp_path, monkeypatch):
    """Install a pass through a real entry point (a dist-info on sys.path)."""
    site = tmp_path / "site"
    (site / "npu_plugin_pkg").mkdir(parents=True)
    (site / "npu_plugin_pkg" / "__init__.py").write_text(textwrap.dedent(PLUGIN))
    dist = site / "npu_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: npu-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[winml_recipes.passes]\nnpu_only = npu_plugin_pkg:NpuOnly\n"
    )
    monkeypatch.syspath_prepend(str(site))
    from winml_recipes.sdk import passes as registry

    saved = dict(registry._REGISTRY)
    monkeypatch.setattr(registry, "_loaded", False)
    yield
    registry._REGISTRY.clear()
    registry._REGISTRY.update(saved)
    sys.modules.pop("npu_plugin_pkg", None)


def test_entry_point_pass_is_registered_planned_and_refused_on_cpu(plugin_on_path, tmp_path):
    listed = cli("passes", "--json")
    rows = {r["name"]: r for r in json.loads(listed.stdout)["passes"]}
    assert rows["npu_only"]["devices"] == "npu" and rows["npu_only"]["version"] == 3
    recipe = make_mlp_project(tmp_path, steps="[npu_only]")
    npu = api.build(recipe, device="npu", precision="fp32", output_root=tmp_path / "b")
    assert _steps(npu)["npu_only"]["metrics"] == {"level": 1, "device": "npu"}
    refused = cli("plan", recipe, "--device", "cpu")
    assert refused.exit_code == 2
    assert "pass 'npu_only' does not support cpu/fp32 (devices: npu; precisions: any)" in (
        refused.stderr
    )


AUTO_CATALOG = """\
schema_version: 1
name: {name}
task: {task}
license: apache-2.0
family: auto
components:
  model:
    task: {task}
    source:
      seed: 0
      config: {config}
    dims: {dims}
    inputs: {inputs}
    outputs: {outputs}
"""


@pytest.mark.parametrize(
    ("name", "task", "config", "dims", "inputs", "outputs"),
    [
        (
            "tiny-bert",
            "feature-extraction",
            "{model_type: bert, hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 2,"
            " intermediate_size: 64, vocab_size: 100}",
            "{batch: 1, sequence: 8}",
            "{input_ids: {dtype: int64, shape: [batch, sequence], range: [0, 100]},"
            " attention_mask: {dtype: int64, shape: [batch, sequence], values: [1]},"
            " token_type_ids: {dtype: int64, shape: [batch, sequence], values: [0]}}",
            "{last_hidden_state: {shape: [batch, sequence, 32]}}",
        ),
        (
            "tiny-convnext",
            "image-classification",
            "{model_type: convnext, hidden_sizes: [8, 16], depths: [1, 1], num_stages: 2,"
            " image_size: 32, num_labels: 5}",
            "{batch: 1}",
            "{pixel_values: {dtype: float32, shape: [batch, 3, 32, 32], range: [-1.0, 1.0]}}",
            "{logits: {shape: [batch, 5]}}",
        ),
    ],
)
def test_auto_family_builds_from_catalog(tmp_path, name, task, config, dims, inputs, outputs):
    (tmp_path / "catalog").mkdir()
    (tmp_path / "recipes").mkdir()
    (tmp_path / "catalog" / f"{name}.yaml").write_text(
        AUTO_CATALOG.format(
            name=name, task=task, config=config, dims=dims, inputs=inputs, outputs=outputs
        )
    )
    recipe = tmp_path / "recipes" / f"{name}.yaml"
    recipe.write_text(
        f"schema_version: 1\nname: {name}\nmodel: {name}\n"
        "targets: [{device: cpu, precision: fp32}]\n"
    )  # no steps: the presets decide
    result = api.build(recipe, output_root=tmp_path / "build")
    steps = _steps(result)
    assert [s for s in steps] == ["export", "normalize", "verify"]
    assert steps["export"]["status"] == "ran"
    # nothing changed the exported model: its check is the export's parity with torch
    assert all(m["sqnr_db"] >= 60 for m in steps["export"]["metrics"]["torch_parity"].values())
    assert steps["verify"]["status"] == "skipped"


def test_verify_outputs_must_name_real_outputs(tmp_path) -> None:
    recipe = make_mlp_project(tmp_path, steps="[{verify: {outputs: {yy: {min_sqnr_db: 1}}}}]")
    result = cli("plan", recipe)
    assert result.exit_code == 2
    assert "verify.outputs: 'yy' is not an output of model (did you mean 'y'?)" in result.stderr


def test_inspect_of_a_missing_onnx_file_says_so(tmp_path) -> None:
    result = cli("inspect", "nonexistent.onnx")
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: nonexistent.onnx: file not found; check the path"


def test_image_block_must_fit_the_input(tmp_path) -> None:
    recipe = make_mlp_project(tmp_path)
    catalog = tmp_path / "catalog" / "mlp.yaml"
    catalog.write_text(
        catalog.read_text().replace(
            "x: {dtype: float32, shape: [batch, 4], range: [-1.0, 1.0]}",
            "x: {dtype: float32, shape: [batch, 3, 16, 16], image: {size: 32}}",
        )
    )
    result = cli("validate", recipe)
    assert result.exit_code == 2
    assert "image: size [32, 32] does not match the input's NCHW shape" in result.stderr


def test_fix_shapes_matches_exporter_dim_names_by_position(tmp_path) -> None:
    """The model calls its batch dim `s99` (torch dynamo) and the other `?`; the catalog
    calls position 0 `batch`: positions decide, names need not agree."""
    import onnx

    recipe = make_mlp_project(tmp_path, steps="[fix_shapes, verify]")
    model_path = tmp_path / "catalog" / "mlp.onnx"
    model = onnx.load(str(model_path))
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "s99"
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "s99"
    onnx.save(model, str(model_path))
    result = api.build(recipe, output_root=tmp_path / "out")
    assert _steps(result)["fix_shapes"]["metrics"] == {"fixed": {"s99": 2}}
    built = onnx.load(str(result.models["model"]))
    assert [d.dim_value for d in built.graph.input[0].type.tensor_type.shape.dim] == [2, 4]


GEMM_CATALOG = """\
schema_version: 1
name: gemm
task: feature-extraction
license: mit
components:
  model:
    source: {ref: ./gemm.onnx}
    dims: {b: 1}
    inputs:
      x: {dtype: float32, shape: [1, 8, 16]}
      z: {dtype: float32, shape: [b, 4, 16]}
    outputs:
      y1: {shape: [1, 8, 16]}
      y2: {shape: [b, 4, 32]}
"""


def test_normalize_then_fix_shapes_loads_again(tmp_path) -> None:
    """onnxruntime fuses the static MatMul+Add at normalize and the other one only once
    fix_shapes made it static: its constants must not collide ("Attempt to replace the
    existing tensor" before the renaming)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["m1"]),
            helper.make_node("Add", ["m1", "b1"], ["y1"]),
            helper.make_node("MatMul", ["z", "w2"], ["m2"]),
            helper.make_node("Add", ["m2", "b2"], ["y2"]),
        ],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, ["b", 4, 16]),
        ],
        [
            helper.make_tensor_value_info("y1", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("y2", TensorProto.FLOAT, None),
        ],
        [
            numpy_helper.from_array(rng.normal(size=(16, 16)).astype(np.float32), "w1"),
            numpy_helper.from_array(rng.normal(size=(16, 32)).astype(np.float32), "w2"),
            numpy_helper.from_array(rng.normal(size=16).astype(np.float32), "b1"),
            numpy_helper.from_array(rng.normal(size=32).astype(np.float32), "b2"),
        ],
    )
    (tmp_path / "catalog").mkdir()
    (tmp_path / "recipes").mkdir()
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.save(model, str(tmp_path / "catalog" / "gemm.onnx"))
    (tmp_path / "catalog" / "gemm.yaml").write_text(GEMM_CATALOG)
    recipe = tmp_path / "recipes" / "gemm.yaml"
    recipe.write_text(
        "schema_version: 1\nname: gemm\nmodel: gemm\n"
        "targets: [{device: cpu, precision: fp32}]\n"
        "steps: [normalize, fix_shapes, {verify: {min_sqnr_db: 100}}]\n"
    )
    result = api.build(recipe, output_root=tmp_path / "out")
    steps = _steps(result)
    assert steps["normalize"]["metrics"]["initializers_renamed"] >= 2
    assert steps["verify"]["metrics"]["outputs"]["y2"]["sqnr_db"] >= 100


def test_quantizer_external_data_is_adopted(tmp_path, monkeypatch) -> None:
    """onnxruntime's quantizer writes `model.onnx.data` for large models (over 1 GiB; forced
    here with 8 KB weights): the step adopts it as `model.onnx_data` and the build ships it."""
    import winml_recipes.quant.ort as ort_module

    monkeypatch.setattr(ort_module, "LARGE_MODEL_BYTES", 0)
    recipe = make_mlp_project(tmp_path, steps="[quantize, {verify: {min_sqnr_db: 10}}]")
    make_mlp_onnx(tmp_path / "catalog" / "mlp.onnx", hidden=2048)  # weights over 1 KB
    text = recipe.read_text().replace("precision: fp32}", "precision: uint8}", 1)
    recipe.write_text(text)
    result = api.build(recipe, device="cpu", precision="uint8", output_root=tmp_path / "out")
    out = result.models["model"].parent
    assert sorted(p.name for p in out.iterdir()) == ["graph.yaml", "model.onnx"]
    assert _steps(result)["quantize"]["status"] == "ran"


def test_normalize_keeps_the_outer_values_an_if_body_reads(tmp_path) -> None:
    """silero-vad's decoder: an If branch reads an outer Constant. onnxruntime's optimizer
    turns the Constant into an initializer, which normalize renames; the branch kept the
    old name ("input '/Constant_output_0' ... cannot be found in any scope")."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper

    f = TensorProto.FLOAT
    then = helper.make_graph(
        [helper.make_node("Add", ["x", "c"], ["t"])], "then", [],
        [helper.make_tensor_value_info("t", f, [2])],
    )  # fmt: skip
    other = helper.make_graph(
        [helper.make_node("Sub", ["x", "c"], ["e"])], "else", [],
        [helper.make_tensor_value_info("e", f, [2])],
    )  # fmt: skip
    graph = helper.make_graph(
        [
            helper.make_node("Constant", [], ["c"], value=helper.make_tensor("v", f, [2], [1, 2])),
            helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
            helper.make_node("Greater", ["s", "zero"], ["pos"]),
            helper.make_node("If", ["pos"], ["y"], then_branch=then, else_branch=other),
        ],
        "g",
        [helper.make_tensor_value_info("x", f, [2])],
        [helper.make_tensor_value_info("y", f, [2])],
        [helper.make_tensor("zero", f, [], [0.0])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    recipe = make_mlp_project(tmp_path / "p", steps="[{normalize: {force: true}}]")
    catalog = tmp_path / "p" / "catalog" / "mlp.yaml"
    catalog.write_text(
        "schema_version: 1\nname: mlp\ntask: unknown\nlicense: mit\ncomponents:\n  model:\n"
        f"    source: {{ref: {path}}}\n    inputs:\n"
        "      x: {dtype: float32, shape: [2], range: [-1.0, 1.0]}\n"
        "    outputs:\n      y: {shape: [2]}\n"
    )
    recipe.write_text(recipe.read_text().replace("npu, precision: fp32", "cpu, precision: fp32"))
    result = api.build(recipe, output_root=tmp_path / "o")
    built = str(result.models["model"])
    onnx.checker.check_model(onnx.load(built))
    session = ort.InferenceSession(built, providers=["CPUExecutionProvider"])
    x = np.array([1.0, 2.0], np.float32)
    c = np.array([1.0, 2.0], np.float32)
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], x + c)
    np.testing.assert_array_equal(session.run(None, {"x": -x})[0], -x - c)


def test_build_onnx_trusts_the_float_run_over_a_declared_output_shape(tmp_path) -> None:
    """A file that declares an output shape it does not compute (ddddocr's recognizer):
    the generated entry's shape is advisory, so the build verifies at the float model's
    shape and says so in one line; a curated entry stays strict (the test above)."""
    path = make_mlp_onnx(tmp_path / "mlp.onnx")
    model = onnx.load(str(path))
    model.graph.output[0].type.tensor_type.shape.dim[1].dim_value = 7  # computes 3
    onnx.save(model, str(path))
    result = cli("build", "--onnx", path, "--device", "cpu", "--precision", "int8",
                 "-o", tmp_path / "build")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert (
        "note: the model file declares output shapes its float run contradicts ('y' [1, 7] "
        "declared, [1, 3] run); verified at the shapes the float model runs"
    ) in result.stdout
    (manifest,) = (tmp_path / "build").glob("*/cpu-int8/manifest.json")
    steps = json.loads(manifest.read_text())["components"]["model"]["steps"]
    verify = next(s for s in steps if s["pass"] == "verify")
    assert verify["metrics"]["output_shapes_declared"] == {"y": {"declared": [1, 7], "ran": [1, 3]}}
