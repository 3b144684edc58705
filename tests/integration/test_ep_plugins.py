"""Execution providers are plugins: a toy EP from a test package (a dist-info with a
`winml_recipes.eps` entry point, put on PYTHONPATH) builds a target without any edit of
winml_recipes, and a recipe names it per target (`{device: cpu, precision: int8, ep: toy}`)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from tests.conftest import REPO, make_mlp_onnx

TOY = Path(__file__).parents[1] / "plugins" / "toy_ep"

BUILD = """
import json, sys
from winml_recipes import api
out = {}
for ep in (None, "toy"):
    r = api.build(sys.argv[1], device="cpu", precision="int8", ep=ep, output_root=sys.argv[2])
    steps = {s["pass"]: s for s in r.manifest["components"]["model"]["steps"]}
    out[ep or "default"] = {
        "dir": str(r.output_dir),
        "model": str(r.models["model"]),
        "target": r.manifest["target"],
        "ep_rules": steps["quantize"]["metrics"]["ep_rules"],
        "per_channel": steps["quantize"]["metrics"]["per_channel"],
        "verified_on": steps["verify"]["metrics"]["verified_on"],
        "versions": steps["verify"]["metrics"]["execution_provider"].get("versions", {}),
    }
print(json.dumps(out))
"""


def _project(root: Path, targets: str) -> Path:
    (root / "catalog").mkdir(parents=True)
    make_mlp_onnx(root / "catalog" / "mlp.onnx")
    from tests.conftest import MLP_CATALOG

    (root / "catalog" / "mlp.yaml").write_text(MLP_CATALOG.format(ref="./mlp.onnx"))
    (root / "recipes").mkdir()
    recipe = root / "recipes" / "mlp.yaml"
    recipe.write_text(
        "schema_version: 1\nname: mlp\nmodel: mlp\n"
        f"targets:\n{targets}"
        "steps: [normalize, quantize, {verify: {min_sqnr_db: 10}}]\n"
    )
    return recipe


def _run(script: str, *args: str | Path, plugin: bool = True) -> subprocess.CompletedProcess:
    path = [str(REPO), *([str(TOY)] if plugin else [])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    return subprocess.run(
        [sys.executable, "-c", script, *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )


def test_a_toy_ep_from_an_entry_point_builds_its_own_target(tmp_path) -> None:
    recipe = _project(
        tmp_path / "p",
        "  - {device: cpu, precision: int8}\n  - {device: cpu, precision: int8, ep: toy}\n",
    )
    done = _run(BUILD, recipe, tmp_path / "build")
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    default, toy = out["default"], out["toy"]
    # the toy target is its own build, named by its EP, verified on it, with its versions
    assert Path(toy["dir"]).name == "cpu-int8-toy" and Path(default["dir"]).name == "cpu-int8"
    assert toy["target"] == {"device": "cpu", "precision": "int8", "ep": "toy"}
    assert default["target"] == {"device": "cpu", "precision": "int8"}
    assert (toy["verified_on"], default["verified_on"]) == ("toy", "cpu")
    assert toy["versions"]["toy-runtime"] == "0.1"
    # the plugin's quantization rules apply to its target only: per-tensor weights
    assert (toy["ep_rules"], toy["per_channel"]) == ("toy", False)
    assert (default["ep_rules"], default["per_channel"]) == (None, True)
    scales = {}
    for name, row in (("toy", toy), ("default", default)):
        model = onnx.load(row["model"])
        dq = [n for n in model.graph.node if n.op_type == "DequantizeLinear"]
        inits = {t.name: t for t in model.graph.initializer}
        weights = [n for n in dq if n.input[0] in inits]  # DQ of a quantized weight
        scales[name] = max(math.prod(inits[n.input[1]].dims) for n in weights)
    assert scales == {"toy": 1, "default": 8}  # per-tensor vs per-channel (8 hidden units)


def test_without_the_plugin_the_recipe_names_an_unknown_ep(tmp_path) -> None:
    recipe = _project(tmp_path / "p", "  - {device: cpu, precision: int8, ep: toy}\n")
    script = "import sys\nfrom winml_recipes import api\napi.plan(sys.argv[1])"
    done = _run(script, recipe, plugin=False)
    assert done.returncode != 0
    assert "unknown execution provider 'toy'" in done.stderr


@pytest.mark.parametrize("ep", ["qnn", "qnn-htp"])
def test_the_devices_default_ep_named_explicitly_is_the_same_target(ep) -> None:
    from winml_recipes.presets import resolve_target

    named = resolve_target("npu", "w8a16", ep)
    assert named == resolve_target("npu", "w8a16") and str(named) == "npu-w8a16"


def test_an_ep_that_does_not_serve_the_device_is_refused() -> None:
    from winml_recipes.presets import resolve_target
    from winml_recipes.sdk.errors import PlanError

    with pytest.raises(PlanError, match="execution provider 'qnn-htp' does not serve device 'cpu'"):
        resolve_target("cpu", "int8", "qnn")
