"""The CLI for CI: one line per step without a terminal, --keep-going, a JSON report that is
always written (on failure too), exit codes that tell a quality gate from bad input, and the
matrix command on a pool of processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import cli, cli_subprocess, make_mlp_onnx, make_mlp_project

# cpu/fp32 fails its quality gate (nothing reaches 250 dB); npu/fp32 passes.
GATED = (
    "{{ '[normalize, {verify: {min_sqnr_db: 250}}]' if device == 'cpu' "
    "else '[normalize, fix_shapes, verify]' }}"
)


def _gated(tmp_path: Path) -> Path:
    return make_mlp_project(tmp_path, steps=GATED)


def valid_report(path: Path) -> dict:
    """The report file, checked against the report schema the project ships."""
    import jsonschema

    from tests.conftest import REPO

    report = json.loads(path.read_text())
    schema = json.loads((REPO / "schemas" / "report.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(report)
    return report


def _presets(tmp_path: Path) -> Path:
    """The MLP project with no steps: each target's presets (npu fixes shapes)."""
    recipe = make_mlp_project(tmp_path)
    recipe.write_text(recipe.read_text().split("steps:")[0])
    return recipe


def test_all_targets_stops_at_the_first_failure_and_json_reports_it(tmp_path) -> None:
    recipe = _gated(tmp_path)
    out = tmp_path / "build"
    result = cli("build", recipe, "--all-targets", "-o", out, "--json")
    assert result.exit_code == 3, result.output  # a quality gate, not bad input
    report = json.loads(result.stdout)
    assert (report["status"], report["exit_code"]) == ("failed", 3)
    cpu, npu = report["targets"]
    assert (cpu["device"], cpu["status"], cpu["exit_code"]) == ("cpu", "failed", 3)
    assert cpu["failing_step"] == "model/verify"
    assert cpu["error"].startswith(f"{recipe}:7 (line of the rendered recipe): model/verify "
                                   "[cpu/fp32]: verification on cpu")  # fmt: skip
    assert cpu["manifest_path"] is None
    assert cpu["evidence_dir"] == str(out / "mlp" / "cpu-fp32.failed")  # what it made so far
    assert (npu["device"], npu["status"]) == ("npu", "not run")
    assert "--keep-going" in npu["error"]
    assert sorted(p.name for p in (out / "mlp").iterdir()) == ["cpu-fp32.failed"]


def test_keep_going_builds_the_rest_and_the_report_file_lists_both(tmp_path) -> None:
    recipe = _gated(tmp_path)
    out, report_path = tmp_path / "build", tmp_path / "ci" / "report.json"
    result = cli(
        "build", recipe, "--all-targets", "--keep-going", "-o", out, "--report", report_path
    )
    assert result.exit_code == 3, result.output
    # the failure: one line on stderr naming the recipe line, the step and the target
    assert result.stderr.splitlines() == [
        f"error: {recipe}:7 (line of the rendered recipe): model/verify [cpu/fp32]: "
        "verification on cpu failed: "
        f"y: SQNR 200 dB (gate >= 250 dB, margin -50 dB) FAIL; evidence kept in "
        f"{out / 'mlp' / 'cpu-fp32.failed'}/"
    ]
    assert "built mlp for npu/fp32 in" in result.stdout
    report = valid_report(report_path)
    cpu, npu = report["targets"]
    assert (cpu["status"], npu["status"]) == ("failed", "ok")
    manifest = json.loads(Path(npu["manifest_path"]).read_text())
    assert manifest["target"] == {"device": "npu", "precision": "fp32"}
    assert npu["output_dir"] == str(out / "mlp" / "npu-fp32")
    assert npu["metrics"]["size_mb"] > 0
    assert npu["metrics"]["steps_ran"] + npu["metrics"]["steps_cached"] >= 2
    assert not (out / "mlp" / "cpu-fp32").exists()
    assert (out / "mlp" / "cpu-fp32.failed" / "model" / "model.onnx").is_file()


def test_report_of_a_good_build_and_json_stays_the_manifest(tmp_path) -> None:
    recipe = _presets(tmp_path)
    report_path = tmp_path / "report.json"
    result = cli("build", recipe, "-o", tmp_path / "b", "--json", "--report", report_path)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["target"] == {"device": "cpu", "precision": "fp32"}
    report = json.loads(report_path.read_text())
    assert (report["status"], report["exit_code"], report["executor"]) == ("ok", 0, "local")
    assert [(t["device"], t["status"]) for t in report["targets"]] == [("cpu", "ok")]


def test_a_piped_build_prints_one_line_per_step(tmp_path) -> None:
    """One line per step; a step both targets share (same pass, options and input) runs
    once and its line names both."""
    recipe = _presets(tmp_path)
    done = cli_subprocess("build", recipe, "--all-targets", "-o", tmp_path / "b")
    assert done.returncode == 0, done.stderr
    steps = [line for line in done.stdout.splitlines() if line.startswith("mlp ")]
    assert [line.split(" [")[0] for line in steps] == [
        "mlp cpu/fp32, npu/fp32 model: export",
        "mlp cpu/fp32, npu/fp32 model: normalize",
        "mlp cpu/fp32 model: verify",
        "mlp npu/fp32 model: fix_shapes",
        "mlp npu/fp32 model: prepare",
        "mlp npu/fp32 model: verify",
    ]
    assert steps[0].split(" [")[1].startswith("skipped] in ")
    assert all(line.endswith(" s") for line in steps)
    assert done.stderr == ""


def test_bad_input_in_one_recipe_of_a_matrix_fails_alone_exit_2(tmp_path) -> None:
    good = _presets(tmp_path)
    bad = good.with_name("bad.yaml")
    bad.write_text(good.read_text() + "stepz: []\n")
    report_path = tmp_path / "r.json"
    result = cli(
        "matrix", good, bad, "--targets", "npu/fp32", "-o", tmp_path / "b",
        "--report", report_path,
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    report = json.loads(report_path.read_text())
    assert [(Path(t["recipe"]).name, t["status"]) for t in report["targets"]] == [
        ("bad.yaml", "failed"),
        ("mlp.yaml", "ok"),
    ]
    assert "unknown key 'stepz'" in report["targets"][0]["error"]
    assert result.stdout.splitlines()[-1].startswith("1/2 built with local in ")


def test_matrix_on_a_pool_builds_every_target(tmp_path) -> None:
    recipe = _presets(tmp_path)
    done = cli_subprocess(
        "matrix", recipe, "--executor", "pool", "--jobs", "2", "-o", tmp_path / "b", "--json"
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["executor"] == "pool"
    assert [(t["device"], t["status"]) for t in report["targets"]] == [
        ("cpu", "ok"),
        ("npu", "ok"),
    ]
    for t in report["targets"]:
        assert Path(t["manifest_path"]).is_file()
    # step lines went to stderr (stdout is the report), prefixed with the target
    assert "mlp npu/fp32 model: verify [" in done.stderr


def test_unknown_target_and_misplaced_options_are_bad_input(tmp_path) -> None:
    recipe = make_mlp_project(tmp_path)
    result = cli("matrix", recipe, "--targets", "gpu/fp16", "-o", tmp_path / "b")
    assert result.exit_code == 2
    assert result.stderr == "error: --targets: no recipe declares gpu/fp16\n"
    result = cli("build", recipe, "--executor", "pool", "-o", tmp_path / "b")
    assert result.exit_code == 2
    assert "--all-targets" in result.stderr
    assert not (tmp_path / "b").exists()


def test_ctrl_c_cancels_a_pool_matrix_and_keeps_outputs_and_cache(tmp_path) -> None:
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) while a pool
    worker is inside a step: exit 130, the report says interrupted, the previous output and
    the cache are as they were, no staging folder is left."""
    from tests.integration.test_bad_input import SLOW_CLI, SLOW_RECIPE, cache_entries, snapshot

    make_mlp_project(tmp_path)
    recipe = tmp_path / "recipes" / "slow.yaml"
    recipe.write_text(SLOW_RECIPE)
    script = tmp_path / "slow_cli.py"
    script.write_text(SLOW_CLI)
    marker, release, cache = tmp_path / "marker", tmp_path / "release", tmp_path / "cache"
    env = {
        **os.environ,
        "WINML_RECIPES_CACHE": str(cache),
        "SLOW_MARKER": str(marker),
        "SLOW_RELEASE": str(release),
    }
    out, report_path = tmp_path / "out", tmp_path / "report.json"
    release.touch()
    first = subprocess.run(
        [sys.executable, script, "build", recipe, "-o", out, "-D", "tag=v1"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    target = out / "slow" / "cpu-fp32"
    before, cached_before = snapshot(target), cache_entries(cache)
    release.unlink()
    marker.unlink()
    proc = subprocess.Popen(
        [sys.executable, script, "matrix", recipe, "-o", out, "-D", "tag=v2",
         "--executor", "pool", "--jobs", "2", "--report", report_path],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the slow step never started"
            time.sleep(0.05)
        worker = int(marker.read_text())
        assert worker != proc.pid  # the step runs in a pool process
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert (
        err.splitlines()[-1] == "error: interrupted; the previous output and the cache are intact"
    )
    report = valid_report(report_path)
    assert (report["status"], report["exit_code"]) == ("interrupted", 130)
    assert [t["status"] for t in report["targets"]] == ["not run"]
    assert snapshot(target) == before
    assert cache_entries(cache) == cached_before
    assert sorted(p.name for p in target.parent.glob(".*") if not p.name.endswith(".lock")) == []
    assert not psutil.pid_exists(worker) or psutil.Process(worker).status() == "zombie"


def test_a_task_expects_what_the_last_build_of_its_target_estimated(tmp_path, monkeypatch) -> None:
    from winml_recipes.exec.resources import DEFAULT_TASK_MB, expected_memory_mb
    from winml_recipes.exec.task import TargetTask

    monkeypatch.setenv("WINML_RECIPES_CACHE", str(tmp_path / "cache"))  # steps run: estimates

    recipe = _presets(tmp_path)
    task = TargetTask(str(recipe), "cpu", "fp32", output_root=str(tmp_path / "b"))
    assert expected_memory_mb(task) == DEFAULT_TASK_MB  # a tiny model, never built
    assert cli("build", recipe, "-o", tmp_path / "b").exit_code == 0
    manifest_path = tmp_path / "b" / "mlp" / "cpu-fp32" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    step = manifest["components"]["model"]["steps"][-1]
    assert step["memory_estimate_mb"] < DEFAULT_TASK_MB
    step["memory_estimate_mb"] = 20000  # as a full-size calibration would record
    manifest_path.write_text(json.dumps(manifest))
    assert expected_memory_mb(task) == 20000


def test_compiled_epcontext_bytes_do_not_depend_on_where_the_build_ran(tmp_path) -> None:
    """onnxruntime names an EP's partitions (the EPContext node and the bytes of its binary)
    with a hash of the model's path: two stores must still give the same files."""
    from winml_recipes import api
    from winml_recipes.exec.reproducible import fingerprint

    recipe = _presets(tmp_path)
    recipe.write_text(recipe.read_text().replace("npu, precision: fp32", "npu, precision: uint8"))
    outs = []
    for name in ("a", "b"):
        report = api.matrix(
            [recipe],
            targets="npu/uint8",
            output_root=tmp_path / name,
            cache_dir=tmp_path / f"{name}-cache",
        )
        assert report.exit_code == 0, report.outcomes[0].error
        outs.append(tmp_path / name / "mlp" / "npu-uint8")
    a, b = fingerprint(outs[0]), fingerprint(outs[1])
    assert "model/model_ctx_qnn.bin" in a
    assert a == b


def test_a_task_on_a_model_on_disk_expects_its_steps_own_estimates(tmp_path) -> None:
    """Before any build: the plan's step estimates (what the memory budget checks) decide.
    A 154 MB MLP quantized at cpu/int8 is estimated above the small-task default."""
    from winml_recipes.engine.budget import EstimateInputs
    from winml_recipes.engine.plan import make_plan
    from winml_recipes.exec.resources import DEFAULT_TASK_MB, expected_memory_mb
    from winml_recipes.exec.task import TargetTask
    from winml_recipes.recipe import load_recipe

    recipe = _presets(tmp_path)
    recipe.write_text(recipe.read_text().replace("npu, precision: fp32", "cpu, precision: int8"))
    make_mlp_onnx(tmp_path / "catalog" / "mlp.onnx", hidden=5_500_000)
    task = TargetTask(str(recipe), "cpu", "int8", output_root=str(tmp_path / "b"))
    expected = expected_memory_mb(task)
    plan = make_plan(load_recipe(recipe, device="cpu", precision="int8"), fetch=False)
    (comp,) = plan.components
    (quantize,) = [s for s in comp.steps if s.name == "quantize"]
    inputs = EstimateInputs(plan.target, comp.contract, None)
    own = quantize.impl.estimate_memory(comp.source.path, quantize.config, inputs)
    assert own is not None and own.mb > DEFAULT_TASK_MB
    assert expected >= own.mb


@pytest.mark.slow  # suite wall time: test_ray's killed worker covers the retry in CI
def test_a_pool_worker_killed_mid_task_has_its_task_run_again(tmp_path) -> None:
    """SIGKILL the pool worker while it quantizes: the pool breaks, the target runs again
    on a fresh pool (reading the export the dead worker cached) and builds."""
    import threading

    from tests.conftest import RECIPES
    from winml_recipes import api

    out = tmp_path / "b"
    killed: list[int] = []
    stop = threading.Event()

    def kill_when_quantizing() -> None:
        deadline = time.monotonic() + 300
        while not stop.is_set() and time.monotonic() < deadline:
            for step in (tmp_path / "cache" / "work").glob("*/*/??-quantize"):
                pid = int(step.parent.parent.name.split("-")[0])  # named after the worker
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_when_quantizing)
    killer.start()
    try:
        report = api.matrix([RECIPES / "sam3-tiny.yaml"], targets="cpu/int8", executor="pool",
                            jobs=1, output_root=out, cache_dir=tmp_path / "cache")  # fmt: skip
    finally:
        stop.set()
        killer.join()
    assert killed, "the worker was never seen quantizing"
    (outcome,) = report.outcomes
    assert outcome.status == "ok", outcome.error
    (rerun,) = [t for t in report.tasks if t["attempts"] > 1]
    assert "quantize" in rerun["label"] and rerun["worker_pid"] not in (None, killed[0])
    assert (out / "sam3-tiny" / "cpu-int8" / "vision_encoder" / "model.onnx").is_file()
