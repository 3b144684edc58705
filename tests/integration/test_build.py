"""End-to-end builds of sam3-tiny: outputs, manifest, cache, determinism, no torch when cached."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import onnx

from tests.conftest import RECIPES, REPO, cli_subprocess
from winml_recipes import api


def test_build_writes_models_digests_and_manifest(tiny_build) -> None:
    out = tiny_build.output_dir
    assert out.name == "cpu-fp32" and out.parent.name == "sam3-tiny"
    for comp in ("vision_encoder", "prompt_encoder_mask_decoder"):
        model = out / comp / "model.onnx"
        onnx.checker.check_model(str(model), full_check=True)
        assert (out / comp / "graph.yaml").is_file()
    names = sorted(p.name for p in out.iterdir())
    assert names == ["manifest.json", "prompt_encoder_mask_decoder", "vision_encoder"]


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
    verify = steps[2]["metrics"]["outputs"]
    assert set(verify) == {"image_embeddings.0", "image_embeddings.1", "image_embeddings.2"}
    assert all(m["cosine"] > 0.9999 for m in verify.values())


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


def test_no_cache_builds_are_byte_identical(tmp_path) -> None:
    a = api.build(RECIPES / "sam3-tiny.yaml", output_root=tmp_path / "a", use_cache=False)
    b = api.build(RECIPES / "sam3-tiny.yaml", output_root=tmp_path / "b", use_cache=False)
    for comp in a.manifest["components"].values():
        assert {s["status"] for s in comp["steps"]} <= {"ran", "skipped"}
    for name in a.models:
        assert a.models[name].read_bytes() == b.models[name].read_bytes(), name


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
        "export", "normalize", "fix_shapes", "quantize", "verify", "compile"
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
