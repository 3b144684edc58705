"""`quantize: {mode: auto}` (the cpu/int8 and cpu/uint8 presets): static QDQ unless it misses
the task on held-out samples, then onnxruntime's dynamic quantization where that holds it.

Before: the tiny Wav2Vec2ForCTC (fitted head, tests/audio_models.py) was withheld at
cpu/int8 (static QDQ: sequences 0 of 4, characters 0; exit 3), and so were the tiny
EfficientNet (top-1 0.625) and MobileViT segmentation (pixels 0.896)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.audio_models import saved
from tests.conftest import cli
from winml_recipes.metrics.speech import transcripts
from winml_recipes.runtime.sessions import run_model

pytest.importorskip("transformers")


def _steps(folder: Path) -> dict[str, dict]:
    manifest = json.loads((folder / "manifest.json").read_text())
    return {s["pass"]: s for s in manifest["components"]["model"]["steps"]}


def _init_and_build_cpu_int8(folder: Path, name: str, root: Path) -> tuple[dict, str]:
    """`init FOLDER --name NAME` then `build` at cpu/int8 in `root`: the steps' records and
    the console's output (the build must pass)."""
    done = cli("init", folder, "--name", name)
    assert done.exit_code == 0, done.stderr
    recipe = f"recipes/{name}.yaml"
    done = cli("build", recipe, "--device", "cpu", "--precision", "int8", "-o", "out")
    assert done.exit_code == 0, done.stderr[-1500:]
    return _steps(root / "out" / name / "cpu-int8"), done.stdout


def _bundled_heldout_speech(samples: int) -> list[dict]:
    """The bundled held-out sentences as Wav2Vec2FeatureExtractor makes them (2 s windows),
    computed here, not read from the build."""
    from transformers import Wav2Vec2FeatureExtractor

    from winml_recipes.speech import bundled_speech, read_wav, resample

    extractor = Wav2Vec2FeatureExtractor(do_normalize=True)
    feeds = []
    for path in bundled_speech("heldout"):
        wave, rate = read_wav(path)
        wave = resample(wave, rate, 16000)[:samples]
        values = extractor(wave, sampling_rate=16000, padding="max_length", max_length=samples,
                           truncation=True, return_tensors="np")["input_values"]  # fmt: skip
        feeds.append({"input_values": values.astype(np.float32)})
    return feeds


def test_speech_ctc_at_cpu_int8_is_quantized_dynamically_where_static_misses(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    folder = saved("wav2vec2-ctc", tmp_path / "models")
    steps, said = _init_and_build_cpu_int8(folder, "ctc", tmp_path)
    choice = steps["quantize"]["metrics"]["format_choice"]
    static = choice["tried"][0]
    assert static["candidate"] == "static" and static["missed"], choice
    assert choice["kept"].startswith("dynamic")
    assert steps["quantize"]["metrics"]["mode"] == "dynamic"
    kept = next(t for t in choice["tried"] if t["candidate"] == choice["kept"])
    assert kept["missed"] == [] and kept["matmul_conv_quantized_fraction"] >= 0.5
    assert "quantized dynamic" in said  # the console says what was chosen and why

    # the shipped model is integer-quantized and transcribes the held-out sentences as the
    # torch model does, judged here outside the build
    shipped = tmp_path / "out" / "ctc" / "cpu-int8" / "model" / "model.onnx"
    ops = {n.op_type for n in onnx.load(shipped).graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops
    feeds = _bundled_heldout_speech(32000)
    want = _torch_transcripts(saved("wav2vec2-ctc", tmp_path / "models"), feeds)
    got = [transcripts(o["logits"], 0)[0] for o in run_model(shipped, feeds)]
    assert all(want), "the torch model transcribes every sentence"
    assert sum(w == g for w, g in zip(want, got, strict=True)) >= 3, (want, got)
    values = steps["verify"]["metrics"]["task_metric"]["values"]
    assert values["sequence_agreement"] >= 0.75 and values["character_agreement"] >= 0.9
    # the float model ran once on the held-out sentences: verify read quantize's outputs
    assert choice["samples"] == values["utterances"]  # the same bundled held-out sentences
    forwards = steps["verify"]["metrics"]["reference_forwards"]
    assert forwards == {"computed": 0, "reused": values["utterances"]}
    # the report a person opens says how the model was quantized and why
    shown = _report_text(tmp_path / "out" / "ctc" / "cpu-int8" / "report.html", tmp_path)
    said_why = (
        f"quantized {choice['kept']}: static QDQ misses verify's gates (ctc-sequence-agreement)"
    )
    assert said_why in shown


def _report_text(page: Path, tmp_path: Path) -> str:
    from tests.chromium import Chromium

    browser = Chromium(tmp_path / "profile")
    try:
        browser.open_page()
        browser.navigate(page.as_uri())
        return " ".join(str(browser.evaluate("document.body.innerText")).split())
    finally:
        browser.close()


def _torch_transcripts(folder: Path, feeds: list[dict]) -> list[list[int]]:
    import torch
    from transformers import Wav2Vec2ForCTC

    model = Wav2Vec2ForCTC.from_pretrained(folder).eval()
    with torch.no_grad():
        return [
            transcripts(model(torch.from_numpy(f["input_values"])).logits.numpy(), 0)[0]
            for f in feeds
        ]


def test_static_is_kept_where_it_holds_the_task_scored_on_the_eval_data(
    tmp_path: Path, monkeypatch
) -> None:
    """A classifier whose static model holds top-1 agreement: static is kept after one score,
    on the --eval-data samples (build --onnx passes them to mode auto as held_out)."""
    import torch

    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4),
    ).eval()  # fmt: skip
    torch.onnx.export(model, (torch.randn(1, 3, 16, 16),), "m.onnx", input_names=["x"],
                      output_names=["logits"], dynamo=False)  # fmt: skip
    rng = np.random.default_rng(0)
    np.savez("calib.npz", x=rng.normal(0, 1, (16, 1, 3, 16, 16)).astype(np.float32))
    np.savez("heldout.npz", x=rng.normal(0, 1, (6, 1, 3, 16, 16)).astype(np.float32))
    done = cli("build", "--onnx", "m.onnx", "--device", "cpu", "--precision", "int8",
               "--calibration-data", "calib.npz", "--eval-data", "heldout.npz",
               "--task", "image-classification", "-o", "out")  # fmt: skip
    assert done.exit_code == 0, done.stderr[-1500:]
    steps = _steps(next((tmp_path / "out").glob("*/cpu-int8")))
    quantize = steps["quantize"]["metrics"]
    choice = quantize["format_choice"]
    assert choice["kept"] == "static" and [t["candidate"] for t in choice["tried"]] == ["static"]
    assert choice["samples"] == 6  # the eval data's six samples, not calibration's sixteen
    assert quantize["mode"] == "static" and quantize["format"] == "qdq"
    assert "quantized dynamic" not in done.stdout


@pytest.mark.slow
def test_efficientnet_at_cpu_int8_holds_top1_where_static_qdq_did_not(
    tmp_path: Path, monkeypatch
) -> None:
    """The tiny EfficientNet (tests/image_classifiers.py): its static QDQ model spends one
    8-bit encoding per tensor on channels whose spreads differ 5-21x (top-1 0.625, gate 0.8;
    docs/families.md); dynamic quantization of every Conv and Gemm holds it (measured 1.0)."""
    from tests.image_classifiers import saved as saved_classifier

    monkeypatch.chdir(tmp_path)
    folder = saved_classifier("efficientnet", tmp_path / "models")
    steps, _ = _init_and_build_cpu_int8(folder, "eff", tmp_path)
    choice = steps["quantize"]["metrics"]["format_choice"]
    assert choice["tried"][0]["missed"] and choice["kept"] == "dynamic"
    assert steps["quantize"]["metrics"]["matmul_conv_quantized_fraction"] == 1.0
    assert steps["verify"]["metrics"]["task_metric"]["values"]["top1_agreement"] >= 0.8
