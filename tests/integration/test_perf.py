"""Real sam3-tiny builds (cpu/fp32, npu/w8a16): `perf` on the CPU EP and QNN HTP, the
build's next-step lines, and the README's loading snippet run against the npu build.

Real sessions in fresh processes, few iterations (the numbers are not checked against a
threshold, only their structure and order: no timed assertions).
"""

from __future__ import annotations

import json
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import RECIPES, REPO, cli
from winml_recipes import api
from winml_recipes.eps.qnn import EMULATED_HTP

ITERATIONS = ("--iterations", "5", "--warmup", "1")


@pytest.fixture(scope="module")
def tiny_builds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`build/` holding sam3-tiny cpu/fp32 and npu/w8a16 (exports from the cache), and the
    npu build's console output beside it."""
    work = tmp_path_factory.mktemp("perf-work")
    recipe = RECIPES / "sam3-tiny.yaml"
    api.build(recipe, device="cpu", precision="fp32", output_root=work / "build")
    done = cli("build", recipe, "--device", "npu", "--precision", "w8a16", "-o", work / "build")
    assert done.exit_code == 0, done.output
    (work / "npu-build.txt").write_text(done.stdout)
    return work / "build"


def _rows(report: dict, build: str) -> dict[tuple[str, str], dict]:
    return {
        (r["component"], Path(r["files"][0]).name): r
        for r in report["rows"]
        if r["build"] == f"sam3-tiny/{build}"
    }


def test_perf_times_components_pipeline_and_compiled_models(tiny_builds: Path) -> None:
    root = tiny_builds / "sam3-tiny"
    done = cli("perf", root / "cpu-fp32", root / "npu-w8a16", *ITERATIONS, "--json")
    assert done.exit_code == 0, done.output
    report = json.loads(done.stdout)  # stderr: the estimates
    cpu, npu = _rows(report, "cpu-fp32"), _rows(report, "npu-w8a16")
    enc, dec = "vision_encoder", "prompt_encoder_mask_decoder"
    assert set(cpu) == {(enc, "model.onnx"), (dec, "model.onnx"), ("pipeline", "model.onnx")}
    assert set(npu) == {
        (enc, "model.onnx"),
        (enc, "model_ctx.onnx"),
        (dec, "model.onnx"),
        (dec, "model_ctx.onnx"),
        ("pipeline", "model_ctx.onnx"),
    }
    for row in [*cpu.values(), *npu.values()]:
        lat = row["latency_ms"]
        assert 0 < lat["min"] <= lat["p50"] <= lat["max"], row
        assert lat["p90"] is None and lat["p99"] is None  # 5 runs: too few to say them
        assert row["session_create_s"] > 0 and row["throughput_per_s"] > 0
        assert row["peak_rss_mb"] > 0 and row["added_rss_mb"] >= 0
        assert row["iterations"] == 5
    assert {r["ep"] for r in cpu.values()} == {"cpu"}
    assert {r["ep"] for r in npu.values()} == {"qnn-htp"}
    # The compiled model is one EPContext node on QNN; the uncompiled one is the QDQ graph.
    assert npu[(enc, "model_ctx.onnx")]["placement"] == {"QNNExecutionProvider": 1}
    assert npu[(enc, "model.onnx")]["placement"]["QNNExecutionProvider"] > 100
    assert npu[(enc, "model_ctx.onnx")]["compiled"] and not npu[(enc, "model.onnx")]["compiled"]
    # The pipeline runs both deployable files; the decoder reads the encoder's outputs.
    assert npu[("pipeline", "model_ctx.onnx")]["files"] == [
        f"{enc}/model_ctx.onnx",
        f"{dec}/model_ctx.onnx",
    ]
    emulated = platform.machine().lower() in {"x86_64", "amd64"}
    assert all(r["emulated"] is emulated for r in npu.values())
    assert not any(r["emulated"] for r in cpu.values())
    if emulated:
        assert {r.get("note") for r in npu.values()} == {EMULATED_HTP}


def test_perf_table_from_a_recipe_lists_every_built_target(tiny_builds: Path) -> None:
    done = cli("perf", RECIPES / "sam3-tiny.yaml", "-o", tiny_builds, *ITERATIONS)
    assert done.exit_code == 0, done.output
    lines = done.stdout.splitlines()
    header = lines[0].split()
    for column in ("P50", "P90", "P99", "create", "runs", "peak"):
        assert column in header, lines[0]
    end = next(i for i, line in enumerate(lines) if line.startswith(("* ", "5 timed")))
    assert all(len(line) <= 80 for line in lines[:end])  # the table fits 80 columns
    body = [line for line in lines[2:] if ".onnx" in line]
    assert len(body) == 8, done.output  # cpu: 2 components + pipeline; npu: 2 x 2 + pipeline
    assert sum("model_ctx.onnx" in line for line in body) == 3
    assert all(line.split()[-1] == "5" for line in body)  # --iterations 5
    emulated = platform.machine().lower() in {"x86_64", "amd64"}
    npu = "QNN HTP (emulated on x86_64)" if emulated else "QNN HTP"
    assert "sam3-tiny/npu-w8a16 on " + npu + ":" in lines and "sam3-tiny/cpu-fp32 on cpu:" in lines
    if emulated:
        assert f"* {EMULATED_HTP}" in lines
    # targets of the recipe that were not built are named, not silently left out
    assert any(line.startswith("note: sam3-tiny npu/uint8: not built") for line in lines)


def test_perf_on_cpu_skips_the_compiled_model_and_says_why(tiny_builds: Path) -> None:
    report = api.perf([tiny_builds / "sam3-tiny" / "npu-w8a16"], ep="cpu", iterations=2, warmup=0)
    files = [(r["component"], r["files"]) for r in report["rows"]]
    assert all("model_ctx.onnx" not in f for _, fs in files for f in fs), files
    assert not any(r["emulated"] for r in report["rows"])
    assert sum("model_ctx.onnx is compiled for qnn-htp" in n for n in report["notes"]) == 2


def test_perf_on_a_folder_without_a_manifest_is_one_line(tmp_path: Path) -> None:
    done = cli("perf", tmp_path)
    assert done.exit_code == 2
    assert done.output.strip().splitlines() == [
        f"error: {tmp_path}: no manifest.json here; pass a build folder "
        "(build/<recipe>/<device>-<precision>)"
    ]


def test_a_build_prints_the_deployable_files_and_the_next_commands(tiny_builds: Path) -> None:
    out = tiny_builds / "sam3-tiny" / "npu-w8a16"
    lines = (tiny_builds.parent / "npu-build.txt").read_text().splitlines()
    enc, dec = "vision_encoder/model_ctx.onnx", "prompt_encoder_mask_decoder/model_ctx.onnx"
    assert lines[-2:] == [
        f"deploy: {enc}, {dec} (in {out}, with the files beside them)",
        f"next: winml-recipes run {out} --image PHOTO.jpg --point X,Y; winml-recipes perf {out}",
    ]
    assert (out / enc).is_file() and (out / dec).is_file()


def test_the_readme_loading_snippet_runs_on_the_npu_build(tiny_builds: Path) -> None:
    """The Python block of README's "Load the result", as written, in a fresh process
    whose working folder holds build/sam3-tiny/npu-w8a16."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Load the result", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1 and "model_ctx.onnx" in blocks[0]
    done = subprocess.run(
        [sys.executable, "-c", blocks[0]],
        cwd=tiny_builds.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    printed = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"pred_masks \(1, 1, 3, 32, 32\) best mask [012]", printed), printed
