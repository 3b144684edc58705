"""The cache never serves a stale or damaged result, and an interrupted swap is undone."""

from __future__ import annotations

import json
import os
import shutil

import onnx
import pytest
import yaml

from tests.conftest import cli, make_mlp_onnx
from winml_recipes import api

TWO_STAGE = """\
schema_version: 1
name: chain
task: feature-extraction
license: mit
components:
  first:
    source: {ref: ./first.onnx}
    dims: {batch: 2}
    inputs: {x: {dtype: float32, shape: [batch, 4], range: [-1.0, 1.0]}}
    outputs: {y: {shape: [batch, 3]}}
  second:
    source: {ref: ./second.onnx}
    dims: {batch: 2}
    inputs: {y: {dtype: float32, shape: [batch, 3], range: [-1.0, 1.0]}}
    outputs: {out: {shape: [batch, 3]}}
"""

RECIPE = """\
schema_version: 1
name: chain
model: chain
targets: [{device: cpu, precision: int8}]
components:
  first: {steps: [{quantize: {per_channel: false}}]}
  second:
    steps:
      - quantize: {per_channel: false, calibration: {inputs_from: first}}
"""


def _second_model(path) -> None:
    """y -> MatMul -> out, renaming the MLP's I/O so it consumes the first's output."""
    make_mlp_onnx(path, seed=1)
    model = onnx.load(str(path))
    model.graph.input[0].name = "y"
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 3
    w1 = next(t for t in model.graph.initializer if t.name == "w1")
    w1.dims[0] = 3
    w1.raw_data = w1.raw_data[: 3 * w1.dims[1] * 4]
    model.graph.node[0].input[0] = "y"
    model.graph.output[0].name = "out"
    model.graph.node[-1].output[0] = "out"
    onnx.save(model, str(path))


def _project(root):
    (root / "catalog").mkdir(parents=True)
    (root / "recipes").mkdir()
    make_mlp_onnx(root / "catalog" / "first.onnx")
    _second_model(root / "catalog" / "second.onnx")
    (root / "catalog" / "chain.yaml").write_text(TWO_STAGE)
    (root / "recipes" / "chain.yaml").write_text(RECIPE)
    return root / "recipes" / "chain.yaml"


def _statuses(result, comp):
    return {s["pass"]: s["status"] for s in result.manifest["components"][comp]["steps"]}


def test_changing_the_upstream_contract_invalidates_downstream_calibration(tmp_path) -> None:
    recipe = _project(tmp_path)
    cache = tmp_path / "cache"
    api.build(recipe, output_root=tmp_path / "a", cache_dir=cache)
    catalog = tmp_path / "catalog" / "chain.yaml"
    entry = yaml.safe_load(catalog.read_text())
    entry["components"]["first"]["inputs"]["x"]["range"] = [-0.01, 0.01]
    catalog.write_text(yaml.safe_dump(entry))
    again = api.build(recipe, output_root=tmp_path / "b", cache_dir=cache)
    # The second component's model did not change, but its calibration data did.
    assert _statuses(again, "second")["quantize"] == "ran"
    fresh = api.build(recipe, output_root=tmp_path / "c", use_cache=False)
    assert again.models["second"].read_bytes() == fresh.models["second"].read_bytes()


def test_a_damaged_cache_entry_is_rebuilt_not_trusted(tmp_path) -> None:
    recipe = _project(tmp_path)
    cache = tmp_path / "cache"
    first = api.build(recipe, output_root=tmp_path / "a", cache_dir=cache)
    key = next(s for s in first.manifest["components"]["first"]["steps"])["cache_key"]
    (cache / key[:2] / key / "model.onnx").unlink()
    again = api.build(recipe, output_root=tmp_path / "b", cache_dir=cache)
    assert _statuses(again, "first")["quantize"] == "ran"
    assert again.models["first"].read_bytes() == first.models["first"].read_bytes()
    stored = json.loads((cache / key[:2] / key / "result.json").read_text())
    assert (cache / key[:2] / key / "model.onnx").stat().st_size == stored["files"]["model.onnx"]


@pytest.mark.parametrize("damage", ["zeroed", "garbage", "symlink"])
def test_a_tampered_same_size_cache_entry_is_rebuilt(tmp_path, damage) -> None:
    """Same size, other bytes (zeroed weights, garbage) or a link: never served."""
    recipe = _project(tmp_path)
    cache = tmp_path / "cache"
    first = api.build(recipe, output_root=tmp_path / "a", cache_dir=cache)
    key = next(s for s in first.manifest["components"]["first"]["steps"])["cache_key"]
    stored = cache / key[:2] / key / "model.onnx"
    good = stored.read_bytes()
    if damage == "zeroed":  # the weights zeroed, the protobuf framing kept
        proto = onnx.load_from_string(good)
        weights = max((i.raw_data for i in proto.graph.initializer), key=len)
        assert len(weights) >= 8 and good.count(weights) == 1
        bad = good.replace(weights, bytes(len(weights)))
        assert len(bad) == len(good) and bad != good
        stored.write_bytes(bad)
    elif damage == "garbage":
        stored.write_bytes(os.urandom(len(good)))
    else:
        decoy = tmp_path / "decoy.onnx"
        decoy.write_bytes(good)
        stored.unlink()
        stored.symlink_to(decoy)
    again = api.build(recipe, output_root=tmp_path / "b", cache_dir=cache)
    assert _statuses(again, "first")["quantize"] == "ran"
    assert again.models["first"].read_bytes() == good
    assert not stored.is_symlink() and stored.read_bytes() == good  # the entry was replaced


def test_a_swap_cut_between_renames_gets_the_previous_output_back(tmp_path) -> None:
    recipe = _project(tmp_path)
    first = api.build(recipe, output_root=tmp_path / "out")
    out = first.output_dir
    before = (out / "manifest.json").read_text()
    os.rename(out, out.parent / f".old-{out.name}-99999")  # as if killed mid-swap
    # The next build fails while running (an impossible threshold): the previous output is
    # back in place all the same, and nothing else is left over.
    recipe.write_text(
        RECIPE.replace(
            "first: {steps: [{quantize: {per_channel: false}}]}",
            "first: {steps: [normalize, {verify: {min_sqnr_db: 300}}]}",
        )
    )
    failed = cli("build", recipe, "-o", tmp_path / "out")
    assert failed.exit_code == 3, failed.output  # the quality gate
    assert (out / "manifest.json").read_text() == before
    assert not list(out.parent.glob(".old-*"))


def test_unwritable_output_is_one_line_exit_2(tmp_path) -> None:
    recipe = _project(tmp_path)
    blocker = tmp_path / "afile"
    blocker.write_text("not a directory")
    result = cli("build", recipe, "-o", blocker)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "afile" in lines[0], lines
    shutil.rmtree(tmp_path / "catalog")


SWAP_INTERRUPTED = """
import os, signal, sys
from pathlib import Path
from winml_recipes import api
from winml_recipes.engine import run

real_rename, calls = os.rename, []

def rename(src, dst):
    real_rename(src, dst)
    calls.append(dst)
    if len(calls) == 1:  # Ctrl-C right between the two renames of the swap
        os.kill(os.getpid(), signal.SIGINT)

run.os.rename = rename
try:
    api.build(sys.argv[1], output_root=sys.argv[2])
except KeyboardInterrupt:
    print("interrupted after", len(calls), "renames")
"""


def test_ctrl_c_between_the_swap_renames_is_held_until_the_swap_is_done(tmp_path) -> None:
    import subprocess
    import sys

    recipe = _project(tmp_path)
    first = api.build(recipe, output_root=tmp_path / "out")
    before = (first.output_dir / "manifest.json").read_text()
    recipe.write_text(
        recipe.read_text().replace("model: chain\n", "model: chain\ndescription: v2\n")
    )
    done = subprocess.run(
        [sys.executable, "-c", SWAP_INTERRUPTED, str(recipe), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.stdout.strip() == "interrupted after 2 renames", done.stderr
    after = (first.output_dir / "manifest.json").read_text()
    assert after != before and "description: v2" in after  # the new output, whole
    assert sorted(p.name for p in first.output_dir.parent.iterdir()) == [first.output_dir.name]


def test_a_build_cleans_what_killed_builds_of_other_targets_left(tmp_path) -> None:
    """Staging folders of other targets go, unless a build of that target is running."""
    from winml_recipes.engine.lock import exclusive
    from winml_recipes.engine.run import lock_path_for

    recipe = _project(tmp_path)
    first = api.build(recipe, output_root=tmp_path / "out")
    root = first.output_dir.parent
    killed = root / ".staging-npu-w8a16-424242"  # a killed build of another target
    (killed / "first").mkdir(parents=True)
    (killed / "first" / "model.onnx").write_bytes(b"half")
    running = root / ".staging-gpu-fp16-434343"  # another target, being built right now
    running.mkdir()
    with exclusive(lock_path_for(root / "gpu-fp16"), root / "gpu-fp16", wait_seconds=1):
        api.build(recipe, output_root=tmp_path / "out")
        assert running.exists()
    assert not killed.exists()
    api.build(recipe, output_root=tmp_path / "out")
    assert sorted(p.name for p in root.iterdir()) == [first.output_dir.name]


def test_cache_info_prune_and_verify(tmp_path, monkeypatch) -> None:
    from tests.conftest import make_mlp_project
    from winml_recipes.engine.cache import StepCache

    cache = tmp_path / "cache"
    monkeypatch.setenv("WINML_RECIPES_CACHE", str(cache))
    recipe = make_mlp_project(tmp_path / "p", steps="[normalize, fix_shapes]")
    api.build(recipe, output_root=tmp_path / "out", cache_dir=cache)
    info = json.loads(cli("cache", "info", "--json").stdout)
    assert info["root"] == str(cache) and info["entries"] == 2 and info["entry_bytes"] > 0
    # damage one entry: verify removes it and keeps the other
    entries = sorted(p for p in cache.glob("??/*") if p.is_dir())
    model = next(e / "model.onnx" for e in entries if (e / "model.onnx").exists())
    model.write_bytes(b"\0" * model.stat().st_size)
    assert cli("cache", "verify").stdout.strip() == "1 entries intact, 1 damaged entries removed"
    assert StepCache(cache).stats()["entries"] == 1
    # prune to nothing, then a build recomputes
    done = cli("cache", "prune", "--max-size", "0MB")
    assert done.exit_code == 0 and done.stdout.startswith("removed 1 items"), done.output
    assert StepCache(cache).stats()["entries"] == 0
    bad = cli("cache", "prune", "--max-size", "lots")
    assert bad.exit_code == 2 and "--max-size" in bad.stderr


def test_prune_removes_the_least_recently_used_first(tmp_path) -> None:
    from winml_recipes.engine.cache import StepCache

    cache = StepCache(tmp_path / "cache")
    for i, key in enumerate(["a" * 64, "b" * 64, "c" * 64]):
        files = tmp_path / f"f{i}"
        files.mkdir()
        (files / "blob").write_bytes(b"x" * 1000)
        cache.put(key, files, {"metrics": {}})
        os.utime(cache.root / key[:2] / key / "result.json", (1000 + i, 1000 + i))
    cache.get("a" * 64)  # used now: the newest
    done = cache.prune(2500)
    assert done["removed"] == 1
    left = {p.name[0] for p in cache.root.glob("??/*")}
    assert left == {"a", "c"}  # b was the least recently used
