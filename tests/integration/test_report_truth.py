"""What a person reads about a build, from a real `build --onnx` of a small MLP for
npu/w8a16 on QNN HTP (real processes, real sessions): every console line fits 80 columns;
the emulator is named where a target result is shown; `perf` sizes its runs and prints no
percentile from too few; `run` says its cost first; report.html is made from what verify
recorded, opening no session, with captions and a header that fit the model; a build
whose compile failed gets a page that leads with the failure (headless Chromium)."""

from __future__ import annotations

import json
import platform
import re
from pathlib import Path

import numpy as np
import pytest

from tests.chromium import INSTALL, Chromium, chromium_path
from tests.conftest import MLP_CATALOG, cli_subprocess, make_mlp_onnx

EMULATED = platform.machine().lower() in {"x86_64", "amd64"}
NAME = "QNN HTP (emulated on x86_64)" if EMULATED else "QNN HTP"
LAYERS_ON = {"WINML_RECIPES_REPORT_LAYERS": "1"}
CONSOLE = {
    "WINML_RECIPES_COLUMNS": "80"
}  # an 80-column terminal (a pipe is not wrapped without it)


def _fits(text: str) -> list[str]:
    return [line for line in text.splitlines() if len(line) > 80]


@pytest.fixture(scope="module")
def onnx_build(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """`build --onnx mlp.onnx --device npu --precision w8a16 -o out`, run in its folder."""
    work = tmp_path_factory.mktemp("truth")
    make_mlp_onnx(work / "mlp.onnx", hidden=16)
    done = cli_subprocess(
        "build", "--onnx", "mlp.onnx", "--device", "npu", "--precision", "w8a16", "-o", "out",
        cwd=work, env={**LAYERS_ON, **CONSOLE},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return {"work": work, "out": work / "out" / "mlp" / "npu-w8a16", "build": done}


def test_the_build_prints_80_columns_and_names_the_emulator(onnx_build) -> None:
    build = onnx_build["build"]
    assert _fits(build.stdout + build.stderr) == []
    text = " ".join(line.strip() for line in build.stdout.splitlines())
    assert f"verified on {NAME} (onnxruntime" in text
    verify = next(
        s
        for s in json.loads((onnx_build["out"] / "manifest.json").read_text())["components"][
            "model"
        ]["steps"]
        if s["pass"] == "verify"
    )
    assert verify["metrics"]["target_name"] == NAME
    assert verify["metrics"].get("emulated_on") == ("x86_64" if EMULATED else None)


def test_perf_sizes_its_runs_by_a_budget_in_80_columns(onnx_build) -> None:
    """Each row measures one run, says it, and times what its share of the budget holds;
    a percentile is printed only from the runs it needs (P90: 10, P99: 100)."""
    done = cli_subprocess("perf", "out/mlp/npu-w8a16", "--budget", "2",
                          cwd=onnx_build["work"], env=CONSOLE)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert _fits(done.stdout + done.stderr) == []
    assert f"mlp/npu-w8a16 on {NAME}:" in done.stdout.splitlines()
    said = " ".join(line.strip() for line in done.stderr.splitlines())
    assert "2 rows, a budget of 2 s for their runs (1.0 s each;" in said
    chosen = re.findall(r"one run ([\d.e-]+) s; \d+ warm-up and (\d+) timed runs", said)
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith("model ")]
    assert len(chosen) == len(rows) == 2, (said, done.stdout)  # model.onnx, model_ctx.onnx
    for (first, runs), row in zip(chosen, rows, strict=True):
        # what the row's 1 s share holds after its measured first run, at least one
        assert 1 <= int(runs) <= max(1, int((1.0 - float(first)) / float(first))), said
        assert row[-1] == runs  # component file create P50 P90 P99 peak runs
        assert (row[4] == "-") == (int(runs) < 10) and (row[5] == "-") == (int(runs) < 100)


def test_run_says_its_cost_first_and_names_the_emulator(onnx_build) -> None:
    work = onnx_build["work"]
    np.savez(work / "in.npz", x=np.linspace(-1, 1, 4, dtype=np.float32).reshape(1, 4))
    done = cli_subprocess("run", "out/mlp/npu-w8a16", "--npz", "in.npz", "-o", "ran",
                          cwd=work, env=CONSOLE)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert _fits(done.stdout + done.stderr) == []
    said = " ".join(line.strip() for line in done.stderr.splitlines())
    assert "run: model: about " in said and f"s on {NAME} (verify took " in said
    shown = " ".join(line.strip() for line in done.stdout.splitlines())
    assert f"model on {NAME} (model_ctx.onnx)" in shown


def test_the_report_reads_what_verify_recorded_and_opens_no_session(
    onnx_build, monkeypatch
) -> None:
    import onnxruntime as ort

    from winml_recipes import api

    opened: list[object] = []
    real = ort.InferenceSession

    class Counted(real):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kwargs) -> None:
            opened.append(args[0] if args else kwargs)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", Counted)
    text = api.report(onnx_build["out"]).read_text(encoding="utf-8")
    assert opened == []  # no second pass on the emulator, nor on the CPU
    assert text.count('class="layer-plot"') == 1  # from verify's record
    assert "photo and prompt" not in text  # no SAM caption on an MLP
    assert "the first verify measured" in text
    assert "winml-adhoc" not in text  # the temporary recipe is gone: the model is named
    assert "built with <code>winml-recipes build --onnx " in text and "mlp.onnx</code>" in text
    assert f"verified on <b>{NAME}</b>" in text
    assert (onnx_build["out"] / "report.html").read_text(encoding="utf-8") == text  # the build's


def _failing_compile_project(root: Path) -> Path:
    (root / "catalog").mkdir(parents=True)
    (root / "recipes").mkdir()
    make_mlp_onnx(root / "catalog" / "mlp.onnx", hidden=16)
    (root / "catalog" / "mlp.yaml").write_text(MLP_CATALOG.format(ref="./mlp.onnx"))
    recipe = root / "recipes" / "mlp.yaml"
    recipe.write_text(  # verify passes; QNN refuses to compile for a SoC that does not exist
        "schema_version: 1\nname: mlp\nmodel: mlp\n"
        "targets:\n  - {device: npu, precision: w8a16}\n"
        "steps: [normalize, fix_shapes, quantize, {verify: {min_sqnr_db: 20}}, "
        "{compile: {soc_model: 99999}}]\n"
    )
    return recipe


@pytest.mark.slow  # a second build (about 20 s idle)
def test_a_failed_compile_page_leads_with_the_failure(tmp_path: Path) -> None:
    if chromium_path() is None:
        pytest.fail(f"headless Chromium is needed for this test: {INSTALL}")
    recipe = _failing_compile_project(tmp_path)
    done = cli_subprocess("build", recipe, "-o", tmp_path / "out", env=LAYERS_ON)
    assert done.returncode == 2, done.stderr
    failed = tmp_path / "out" / "mlp" / "npu-w8a16.failed"
    page = failed / "report.html"
    text = page.read_text(encoding="utf-8")
    assert "every gate passed" not in text
    browser = Chromium(tmp_path / "profile")
    try:
        browser.open_page()
        browser.navigate(page.as_uri())
        first = json.loads(
            browser.evaluate(
                "JSON.stringify((() => { const v = document.querySelector('.verdict');"
                "const r = v.getBoundingClientRect();"
                "return {text: v.textContent, y: r.y, background: getComputedStyle(v)"
                ".backgroundColor, error: v.parentElement.nextElementSibling.textContent,"
                "firstHeading: document.querySelector('h2').getBoundingClientRect().y}; })())"
            )
        )
    finally:
        browser.close()
    assert first["text"] == "build FAILED at model/compile"
    assert first["y"] < first["firstHeading"]  # it leads the page, above every section
    assert first["background"] == "rgb(253, 230, 231)"  # the failure's red, not the pass green
    assert "model/compile" in first["error"] and "refused" in first["error"]


def test_the_plot_flags_where_the_target_departs_from_the_simulation(tmp_path, monkeypatch):
    """Plain QDQ (no HTP rules) of a scatter graph: HTP gets ScatterElements wrong where the
    CPU simulation is right (test_qnn). verify records the layers, and the report's plot
    marks that layer in red and names it; headless Chromium draws the mark."""
    from tests.integration.test_qnn import project, scatter_graph
    from winml_recipes import api

    if chromium_path() is None:
        pytest.fail(f"headless Chromium is needed for this test: {INSTALL}")
    monkeypatch.setenv("WINML_RECIPES_REPORT_LAYERS", "1")
    model = scatter_graph(tmp_path / "scatter.onnx")
    quantize = (  # left as HTP gets it wrong: no rules, no divergence repair
        "{quantize: {ep_rules: false, repair_divergence: false,"
        " op_types: [Add, Slice, Div, ScatterElements, Mul]}}"
    )
    lax = "{verify: {min_sqnr_db: -200, min_cosine: -1, task: {}}}"
    recipe = project(tmp_path, model, "[0.0, 100.0]", f"[{quantize}, {lax}]")
    result = api.build(recipe, device="npu", precision="w8a16", output_root=tmp_path / "out")
    verify = next(s for s in result.manifest["components"]["model"]["steps"]
                  if s["pass"] == "verify")  # fmt: skip
    assert verify["metrics"]["layers"]["first_divergence"] == "sc"
    page = result.output_dir / "report.html"
    text = page.read_text(encoding="utf-8")
    assert "where the target departs from the simulation; the first: sc (ScatterElements)" in text
    browser = Chromium(tmp_path / "profile")
    try:
        browser.open_page()
        browser.navigate(page.as_uri())
        marks = json.loads(
            browser.evaluate(
                "JSON.stringify([...document.querySelectorAll('svg.layer-plot circle.departs')]"
                ".map(c => { const r = c.getBoundingClientRect(); return {x: r.x + scrollX,"
                " y: r.y + scrollY, width: r.width, height: r.height,"
                " title: c.querySelector('title').textContent}; }))"
            )
        )
        assert marks, "no layer is marked in the plot"
        shot = browser.screenshot({k: marks[0][k] + (-4 if k in "xy" else 8) for k in
                                   ("x", "y", "width", "height")})  # fmt: skip
    finally:
        browser.close()
    assert "target departs from the simulation" in marks[0]["title"]
    from io import BytesIO

    from PIL import Image

    with Image.open(BytesIO(shot)) as img:
        pixels = np.asarray(img.convert("RGB")).reshape(-1, 3).astype(int)
    red = np.all(np.abs(pixels - (0xD0, 0x02, 0x1B)) < 60, axis=1).sum()
    assert red > 10, "the mark is not drawn"
