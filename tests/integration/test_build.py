"""End-to-end builds of sam3-tiny: outputs, manifest, cache, determinism, no torch when cached."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import onnx
import pytest

from tests.conftest import RECIPES, REPO, cli, cli_subprocess, make_mlp_project
from winml_recipes import api


def test_build_writes_models_digests_and_manifest(tiny_build) -> None:
    out = tiny_build.output_dir
    assert out.name == "cpu-fp32" and out.parent.name == "sam3-tiny"
    for comp in ("vision_encoder", "prompt_encoder_mask_decoder"):
        model = out / comp / "model.onnx"
        onnx.checker.check_model(str(model), full_check=True)
        assert (out / comp / "graph.yaml").is_file()
    names = sorted(p.name for p in out.iterdir())
    # the float model is the shipped one (fp32): no float-reference folder
    assert names == [
        "manifest.json",
        "prompt_encoder_mask_decoder",
        "report.html",
        "vision_encoder",
    ]


def test_manifest_validates_against_schema(tiny_build) -> None:
    schema = json.loads((REPO / "schemas" / "manifest.schema.json").read_text())
    manifest = json.loads((tiny_build.output_dir / "manifest.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(manifest)
    assert manifest["versions"]["onnxruntime"]
    assert manifest["recipe"]["rendered"].startswith("# yaml-language-server")
    steps = manifest["components"]["vision_encoder"]["steps"]
    assert [s["pass"] for s in steps] == ["export", "normalize", "verify"]
    assert steps[1]["status"] == "skipped" and "normalized" in steps[1]["reason"]
    parity = steps[0]["metrics"]["torch_parity"]  # onnxruntime vs torch on batch-2 inputs
    assert set(parity) == {"image_embeddings.0", "image_embeddings.1", "image_embeddings.2"}
    assert all(p["sqnr_db"] > 100 for p in parity.values()), parity
    # The export is the reference and nothing changed it: comparing it with itself would
    # score 200 dB whatever the code did, so verify says so instead.
    assert steps[2]["status"] == "skipped" and "no step changed it" in steps[2]["reason"]


def test_outputs_match_contract_shapes(tiny_build) -> None:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(tiny_build.models["vision_encoder"]))
    x = np.random.default_rng(0).uniform(-1, 1, (2, 3, 112, 112)).astype(np.float32)
    outs = sess.run(None, {"pixel_values": x})
    assert [o.shape for o in outs] == [(2, 4, 32, 32), (2, 8, 16, 16), (2, 32, 8, 8)]


def test_cached_rebuild_runs_nothing_and_keeps_bytes(tiny_build, tmp_path) -> None:
    again = api.build(RECIPES / "sam3-tiny.yaml", output_root=tmp_path)
    for comp in again.manifest["components"].values():
        assert {s["status"] for s in comp["steps"]} <= {"cached", "skipped"}
    for name, path in again.models.items():
        assert path.read_bytes() == tiny_build.models[name].read_bytes()


# suite wall time: the goldens pin the emitted graphs in CI; this rebuilds everything twice
@pytest.mark.slow
def test_no_cache_builds_are_byte_identical(tiny_build, tmp_path) -> None:
    """A build that runs every step again gives the bytes of the session's earlier build."""
    a = api.build(RECIPES / "sam3-tiny.yaml", output_root=tmp_path / "a", use_cache=False)
    for comp in a.manifest["components"].values():
        assert {s["status"] for s in comp["steps"]} <= {"ran", "skipped"}
    assert a.models.keys() == tiny_build.models.keys()
    for name in a.models:
        assert a.models[name].read_bytes() == tiny_build.models[name].read_bytes(), name


def test_export_is_shared_across_targets_but_not_target_steps(tiny_build, tmp_path) -> None:
    npu = api.build(
        RECIPES / "sam3-tiny.yaml", device="npu", precision="w8a16", output_root=tmp_path
    )
    steps = {s["pass"]: s for s in npu.manifest["components"]["vision_encoder"]["steps"]}
    assert steps["export"]["status"] == "cached"
    graph = onnx.load(str(npu.models["vision_encoder"]))
    dims = [d.dim_value for d in graph.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 3, 112, 112]


def test_cached_build_does_not_import_torch(tiny_build, tmp_path) -> None:
    code = (
        "import sys\n"
        "from winml_recipes import api\n"
        f"api.build({str(RECIPES / 'sam3-tiny.yaml')!r}, output_root={str(tmp_path)!r})\n"
        "print('torch' in sys.modules, 'transformers' in sys.modules)\n"
    )
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True
    )
    assert done.stdout.split() == ["False", "False"]


def test_cli_build_json_and_plan(tiny_build, tmp_path) -> None:
    done = cli_subprocess("build", RECIPES / "sam3-tiny.yaml", "-o", tmp_path, "--json")
    assert done.returncode == 0, done.stderr
    manifest = json.loads(done.stdout)
    assert manifest["target"] == {"device": "cpu", "precision": "fp32"}
    plan = cli_subprocess(
        "plan", RECIPES / "sam3-tiny.yaml", "--device", "npu", "--precision", "w8a16", "--json"
    )
    assert plan.returncode == 0, plan.stderr
    steps = json.loads(plan.stdout)["components"]["vision_encoder"]["steps"]
    assert [s["pass"] for s in steps] == [
        "export", "normalize", "fix_shapes", "prepare", "preflight", "quantize", "verify",
        "compile",
    ]  # fmt: skip


def test_builds_without_fcntl(tmp_path) -> None:
    """Windows has no fcntl: the build path must not need it (simulated by blocking it)."""
    import subprocess
    import sys

    from tests.conftest import make_mlp_project

    recipe = make_mlp_project(tmp_path)
    code = (
        "import sys\n"
        "sys.modules['fcntl'] = None  # import fcntl -> ImportError, as on Windows\n"
        "from winml_recipes import api\n"
        f"r = api.build({str(recipe)!r}, output_root={str(tmp_path / 'out')!r})\n"
        "print(r.output_dir.name)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["cpu-fp32"]


def test_over_budget_stops_before_any_step_runs(tmp_path: Path, monkeypatch) -> None:
    recipe = make_mlp_project(tmp_path / "p", steps="[normalize, quantize, verify]")
    recipe.write_text(recipe.read_text().replace("npu, precision: fp32", "cpu, precision: int8"))
    cache = tmp_path / "cache"
    monkeypatch.setenv("WINML_RECIPES_CACHE", str(cache))
    result = cli(
        "build", recipe, "--device", "cpu", "--precision", "int8", "-o", tmp_path / "out",
        "--memory-budget", "100MB",
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    # The first step to run is checked from the source on disk, before anything is written.
    assert lines[0].startswith(f"error: {recipe}:7: model/normalize [cpu/int8]: needs about 0.4 GB")
    assert "over the memory budget of 0.1 GB" in lines[0]
    assert not (tmp_path / "out").exists()
    assert not cache.exists() or not any(cache.rglob("*.onnx"))


def test_each_encoder_forward_is_done_once(tiny_build, tmp_path: Path) -> None:
    """The decoder calibrates on the embeddings the encoder's calibration computed, and is
    verified on those its verification computed: the manifest counts both."""
    npu = api.build(
        RECIPES / "sam3-tiny.yaml", device="npu", precision="w8a16", output_root=tmp_path
    )
    enc = {s["pass"]: s for s in npu.manifest["components"]["vision_encoder"]["steps"]}
    dec = {s["pass"]: s for s in npu.manifest["components"]["prompt_encoder_mask_decoder"]["steps"]}
    encoder_images = enc["quantize"]["metrics"]["calibration_samples"]  # 24 bundled photos
    # 64 decoder samples, 4 prompts per image (the recipe's samples_per_upstream): 16 images,
    # all among the encoder's: none is encoded again
    decoder_images = dec["quantize"]["metrics"]["calibration_samples"] // 4
    assert 0 < decoder_images <= encoder_images
    forwards = dec["quantize"]["metrics"]["upstream_forwards"]
    # quantize's divergence check runs one held-out sample on the target: one photo more,
    # whose embeddings the encoder's verification computed (reused, not encoded again)
    checked = 1 if dec["quantize"]["metrics"]["divergence_repair"]["checked"] else 0
    assert forwards == {"reused": decoder_images + checked, "computed": 0}
    verified = dec["verify"]["metrics"]["upstream_forwards"]
    assert dec["verify"]["metrics"]["samples"] == 4 * enc["verify"]["metrics"]["samples"]
    assert verified == {"reused": enc["verify"]["metrics"]["samples"], "computed": 0}


def test_outputs_with_external_data_load_with_onnx(tmp_path: Path) -> None:
    """onnx refuses external data with several hard links; the output's sidecar is a copy."""
    recipe = make_mlp_project(tmp_path / "p", steps="[fix_shapes]")
    source = tmp_path / "p" / "catalog" / "mlp.onnx"
    model = onnx.load(str(source))
    for value in (*model.graph.input, *model.graph.output):  # static: fix_shapes is skipped
        value.type.tensor_type.shape.dim[0].dim_value = 2
    # Named like our outputs, so the output is the source file's copy (not a rewrite).
    onnx.save_model(
        model,
        str(source.with_name("model.onnx")),
        save_as_external_data=True,
        location="model.onnx_data",
        size_threshold=0,
    )
    catalog = source.with_name("mlp.yaml")
    catalog.write_text(catalog.read_text().replace("./mlp.onnx", "./model.onnx"))
    for out in ("a", "b"):  # a fresh build, then one served from the cache
        built = api.build(recipe, output_root=tmp_path / out, cache_dir=tmp_path / "cache")
        model = built.models["model"]
        sidecar = model.with_name("model.onnx_data")
        assert sidecar.stat().st_nlink == 1
        loaded = onnx.load(str(model))  # raises on a linked sidecar
        assert {t.name for t in loaded.graph.initializer} == {"w1", "b1", "w2"}
