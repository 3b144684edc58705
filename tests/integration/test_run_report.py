"""`run` on a built sam3-tiny npu/w8a16 (QNN HTP) and the build's report.html, the latter
opened in headless Chromium (Debian's package): it must load with no error, render the
plot and the picture, and fetch nothing from the network."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.chromium import INSTALL, Chromium, chromium_path
from tests.conftest import cli
from winml_recipes import pictures
from winml_recipes.bundled import images_dir

PHOTO = images_dir() / "heldout" / "rocket_0.jpg"


def _run(build_dir: Path, out: Path, *extra: str) -> dict:
    result = cli(
        "run", build_dir, "--image", PHOTO, "--point", "60,40", "-o", out, "--json", *extra
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _changed_fraction(panel: Image.Image, plain: Image.Image) -> float:
    a = np.asarray(panel, dtype=np.int16)
    b = np.asarray(plain, dtype=np.int16)
    return float(np.mean(np.abs(a - b).max(axis=2) > 30))


@pytest.mark.parametrize("mode", ["--compiled", "--uncompiled"])
def test_run_draws_float_and_npu_masks_with_their_iou(tiny_npu_build, tmp_path, mode) -> None:
    summary = _run(tiny_npu_build.output_dir, tmp_path, mode)
    model = "model_ctx.onnx" if mode == "--compiled" else "model.onnx"
    for comp in ("vision_encoder", "prompt_encoder_mask_decoder"):
        assert summary["target_run"][comp]["ran_on"] == "qnn-htp"
        assert summary["target_run"][comp]["model"] == f"{comp}/{model}"
        assert summary["float_run"][comp] == {
            "model": f"float-reference/{comp}/model.onnx",
            "ran_on": "cpu",
        }
    # (60, 40) of the 384 px photo is (17.5, 11.67) in the model's 112 px frame
    np.testing.assert_allclose(summary["points"][0]["model_xy"], [17.5, 40 * 112 / 384])
    iou = summary["task_metric"]["values"]["mask_iou"]
    assert 0.5 < iou < 1.0  # the NPU's mask is close to float's, not the same model twice
    sqnr = summary["components"]["prompt_encoder_mask_decoder"]["pred_masks"]["sqnr_db"]
    assert 10 < sqnr < 60

    png = Path(summary["picture"])
    assert png == tmp_path / "rocket_0.png"
    with Image.open(png) as img:
        picture = img.convert("RGB")
    side, gap = pictures.PANEL, pictures.GUTTER
    assert picture.size[0] == 4 * side + 5 * gap  # photo, float, target, difference
    assert picture.size[1] > pictures.TITLE + side + 3 * pictures.LINE  # caption lines
    with Image.open(PHOTO) as photo:
        plain = photo.convert("RGB").resize((side, side))

    def panel(i: int) -> Image.Image:
        x = gap + i * (side + gap)
        return picture.crop((x, pictures.TITLE, x + side, pictures.TITLE + side))

    assert _changed_fraction(panel(0), plain) < 0.03  # the photo, only the prompts drawn
    assert _changed_fraction(panel(1), plain) > 0.05  # float mask overlaid
    assert _changed_fraction(panel(2), plain) > 0.05  # NPU mask overlaid
    diff = np.asarray(panel(3), dtype=np.int16)
    red = np.all(np.abs(diff - pictures.ONLY_FLOAT_RGB) < 3, axis=2).sum()
    blue = np.all(np.abs(diff - pictures.ONLY_TARGET_RGB) < 3, axis=2).sum()
    assert red + blue > 0  # IoU < 1: some pixels differ, and the difference panel shows them
    with np.load(tmp_path / "outputs.npz") as data:
        assert {"float/prompt_encoder_mask_decoder/pred_masks",
                "target/prompt_encoder_mask_decoder/pred_masks"} <= set(data.files)  # fmt: skip
    assert json.loads((tmp_path / "summary.json").read_text())["picture"] == str(png)


def test_compiled_and_uncompiled_runs_agree_on_htp(tiny_npu_build, tmp_path) -> None:
    """compile recorded bit-exactness; `run` must pick the files it says it ran."""
    _run(tiny_npu_build.output_dir, tmp_path / "a", "--compiled")
    _run(tiny_npu_build.output_dir, tmp_path / "b", "--uncompiled")
    with np.load(tmp_path / "a" / "outputs.npz") as a, np.load(tmp_path / "b" / "outputs.npz") as b:
        masks = "target/prompt_encoder_mask_decoder/pred_masks"
        np.testing.assert_array_equal(a[masks], b[masks])
        assert not np.array_equal(a[masks], a["float/prompt_encoder_mask_decoder/pred_masks"])


def test_run_errors_are_one_line(tiny_npu_build, tmp_path) -> None:
    result = cli("run", tiny_npu_build.output_dir, "--point", "1,2", "--point", "3,4",
                 "--point", "5,6", "-o", tmp_path)  # fmt: skip
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "error: --point given 3 times; this build takes at most 2 points (its shapes are static)"
    )
    result = cli("run", tmp_path, "-o", tmp_path / "x")
    assert result.exit_code == 2 and "no manifest.json here" in result.stderr


def test_every_build_writes_a_self_contained_report(tiny_npu_build) -> None:
    text = (tiny_npu_build.output_dir / "report.html").read_text(encoding="utf-8")
    assert "Content-Security-Policy" in text and "default-src 'none'" in text
    assert not re.search(r"https?:", text)  # no address to fetch, anywhere
    assert "<script" not in text.lower() and "<link" not in text.lower()
    sources = re.findall(r'\b(?:src|href)="([^"]*)"', text)
    assert sources and all(s.startswith("data:image/png;base64,") for s in sources)
    assert text.count('class="layer-plot"') == 2  # both components' per-layer plots
    assert "mask_iou" in text and "every gate passed" in text
    # the picture is the last `run`'s; the plot says its sample
    assert text.index("<h2>Run on a held-out photo") < text.index("<h2>Per-layer SQNR")
    assert "The last <code>winml-recipes run</code> of this build, on <code>rocket_0.jpg" in text
    assert text.count("sample: computed by the report on request, on one seeded sample") == 2
    # a compiled model_ctx.onnx of about 1 kB reads as such, not as 0.00 MB
    files = text[text.index("<h2>Files") :]
    ctx = re.search(r"vision_encoder/model_ctx\.onnx</code></td><td><span[^>]*>([^<]*)<", files)
    assert ctx and re.fullmatch(r"\d[\d.]* (B|kB)", ctx.group(1)), ctx


def test_a_float_build_report_says_what_it_did_not_do(tiny_build) -> None:
    """cpu/fp32 verifies nothing and has no quantized activations: the banner is not a
    pass, and the sections that have nothing say so in one line, pointing at nothing."""
    text = (tiny_build.output_dir / "report.html").read_text(encoding="utf-8")
    assert '<span class="verdict none">no gates checked: no component was verified</span>' in text
    assert "Not computed: a fp32 build has no quantized activations to compare." in text
    assert "--layers" not in text  # asking for the plot of a float build gives nothing
    placement = text[text.index("<h2>Node placement") : text.index("<h2>Steps")]
    assert "<table" not in placement and "not recorded: the placement is what verify" in placement
    files = text[text.index("<h2>Files") : text.index("<h2>Versions")]
    assert re.search(r">\d[\d.]* kB<", files) and ">0.00<" not in files


def test_report_renders_in_headless_chromium(tiny_npu_build, tmp_path) -> None:
    if chromium_path() is None:
        pytest.fail(f"headless Chromium is needed for this test: {INSTALL}")
    report = tiny_npu_build.output_dir / "report.html"
    browser = Chromium(tmp_path / "profile")
    try:
        browser.open_page()
        browser.navigate(report.as_uri())
        state = browser.evaluate(
            "JSON.stringify({"
            "images: [...document.images].map(i => [i.complete, i.naturalWidth, i.naturalHeight]),"
            "plots: [...document.querySelectorAll('svg.layer-plot')].map(s => {"
            "  const r = s.getBoundingClientRect();"
            "  return {x: r.x + scrollX, y: r.y + scrollY, width: r.width, height: r.height,"
            "          lines: s.querySelectorAll('polyline').length}; }),"
            "title: document.title,"
            "aligned: [...document.querySelectorAll('td')].filter(td => td.querySelector('.num'))"
            "  .map(td => getComputedStyle(td).textAlign)})"
        )
        state = json.loads(state)
        plot = state["plots"][0]
        shot = browser.screenshot({k: plot[k] for k in ("x", "y", "width", "height")})
        image = state["images"]
        picture = json.loads(
            browser.evaluate(
                "JSON.stringify((() => { const r = document.images[0].getBoundingClientRect();"
                "return {x: r.x + scrollX, y: r.y + scrollY, width: r.width, height: r.height};"
                "})())"
            )
        )
        picture_shot = browser.screenshot(picture)
        events = list(browser.events)
    finally:
        browser.close()
    requests = [e["params"]["request"]["url"] for e in events
                if e["method"] == "Network.requestWillBeSent"]  # fmt: skip
    assert requests and all(u.startswith(("file:", "data:")) for u in requests), requests
    errors = [e["params"] for e in events if e["method"] == "Runtime.exceptionThrown"] + [
        e["params"]["entry"] for e in events
        if e["method"] == "Log.entryAdded" and e["params"]["entry"]["level"] == "error"
    ]  # fmt: skip
    assert not errors, errors
    assert state["title"].startswith("sam3-tiny npu/w8a16")
    assert len(state["aligned"]) > 50 and set(state["aligned"]) == {"right"}  # the numbers
    assert image == [[True, 4 * pictures.PANEL + 5 * pictures.GUTTER, image[0][2]]]
    assert len(state["plots"]) == 2 and all(p["lines"] == 2 and p["height"] > 100
                                            for p in state["plots"])  # fmt: skip
    with Image.open(io.BytesIO(shot)) as img:
        pixels = np.asarray(img.convert("RGB")).reshape(-1, 3)
    colours = {tuple(p) for p in pixels[:: max(1, len(pixels) // 50000)]}
    assert len(colours) > 20, "the plot area is (nearly) blank"
    # the target's line (#2060d0) and the simulation's (#e07b00) are drawn
    for rgb in ((0x20, 0x60, 0xD0), (0xE0, 0x7B, 0x00)):
        assert np.all(np.abs(pixels.astype(int) - rgb) < 40, axis=1).sum() > 50, rgb
    with Image.open(io.BytesIO(picture_shot)) as img:
        shown = np.asarray(img.convert("RGB")).reshape(-1, 3)
    assert len(np.unique(shown, axis=0)) > 1000, "the run picture did not render"


class _Counted:
    """Counts the onnxruntime sessions created while installed (each a real session)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import onnxruntime as ort

        real = ort.InferenceSession
        self.paths: list[str] = []
        counted = self

        class Session(real):  # type: ignore[misc, valid-type]
            def __init__(self, model, *args, **kwargs) -> None:
                counted.paths.append(model if isinstance(model, str) else "<bytes>")
                super().__init__(model, *args, **kwargs)

        monkeypatch.setattr(ort, "InferenceSession", Session)


def test_report_runs_the_build_only_within_the_memory_budget(
    tiny_npu_build, tmp_path, monkeypatch
) -> None:
    """The per-layer plot asked for (--layers) whose target run is estimated over the
    budget opens no session and says why in one line; without it the report opens none
    at all (the picture is the last `run`'s), and the plot asked within it does."""
    import shutil

    from winml_recipes.report import write_report

    build = tmp_path / "build"
    shutil.copytree(tiny_npu_build.output_dir, build)
    sessions = _Counted(monkeypatch)
    text = write_report(build, layers=True, budget_mb=200).read_text(encoding="utf-8")
    assert sessions.paths == []
    assert "not computed: running vision_encoder needs about" in text
    assert "over the memory budget of 0.2 GB" in text
    assert 'class="layer-plot"' not in text
    text = write_report(build, budget_mb=8000).read_text(encoding="utf-8")
    assert sessions.paths == [] and "data:image/png" in text  # run's picture, read
    text = write_report(build, layers=True, budget_mb=8000).read_text(encoding="utf-8")
    assert len(sessions.paths) >= 4 and text.count('class="layer-plot"') == 2


def test_report_does_not_prepare_what_verify_ran_on_the_simulation(tmp_path, monkeypatch) -> None:
    """verify `on_target: false` (a graph too big to prepare here): the build's report does
    not prepare it on QNN HTP either; `run` still can."""
    from winml_recipes import api

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        (Path(__file__).parents[2] / "recipes" / "sam3-tiny.yaml")
        .read_text(encoding="utf-8")
        .replace(
            '      - verify: {% include "sam3-quality.yaml" %}',
            "      - verify: {on_target: false, min_sqnr_db: 20, min_cosine: 0.99}",
            1,
        )
        .replace("name: sam3-tiny", "name: sam3-tiny-simulated", 1),
        encoding="utf-8",
    )
    result = api.build(recipe, device="npu", precision="w8a16", output_root=tmp_path / "out")
    encoder = result.manifest["components"]["vision_encoder"]["steps"]
    assert next(s for s in encoder if s["pass"] == "verify")["metrics"]["verified_on"] == (
        "cpu-simulation"
    )
    built = (result.output_dir / "report.html").read_text(encoding="utf-8")  # the build's
    assert "Not recorded: " in built and 'class="layer-plot"' not in built
    sessions = _Counted(monkeypatch)
    text = api.report(result.output_dir, layers=True).read_text(encoding="utf-8")
    assert sessions.paths == []
    assert "vision_encoder was verified on the CPU simulation (verify: on_target false)" in text
