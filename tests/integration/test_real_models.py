"""Real architectures, built as a user brings them: an exported ONNX file, a calibration
npz and a held-out npz, and `build --onnx MODEL --device npu --precision w8a16
--calibration-data calib.npz --eval-data heldout.npz` with no other flag.

Each test asserts the model's TASK metric against the float model on the held-out samples,
run where the build is meant to run (QNN HTP, no CPU fallback, where the EP loads; the
CPU EP's simulation otherwise), not only that the build ran. The models and data are
built here (tests/realmodels.py): a tiny BERT sentence embedder at opset 11 with its
attention mask, a CNN with ReLU6 and HardSwish, a text-line recognizer at opset 12.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from tests import realmodels
from tests.conftest import cli

pytestmark = pytest.mark.export


def _build(model: realmodels.RealModel, out: Path) -> tuple[dict, Path]:
    done = cli(
        "build", "--onnx", model.model, "--device", "npu", "--precision", "w8a16",
        "--calibration-data", model.calib, "--eval-data", model.heldout, "-o", out, "--json",
    )  # fmt: skip
    assert done.exit_code == 0, done.stderr
    manifest = json.loads(done.stdout)
    steps = {s["pass"]: s for s in manifest["components"]["model"]["steps"]}
    return steps, out / "model" / "npu-w8a16" / "model" / "model.onnx"


def prepare_rewrites(steps: dict) -> dict[str, int]:
    """Rule -> nodes replaced by the prepare step (its `htp` stage holds HTP's rewrites)."""
    rewrites = steps.get("prepare", {}).get("metrics", {}).get("rewrites", [])
    return {r["rule"]: r["count"] for r in rewrites}


def _held_out_verification(steps: dict, model: realmodels.RealModel) -> None:
    """Calibrated on the calibration file, verified on the held-out one."""
    assert steps["quantize"]["metrics"]["calibration_source"] == f"npz: {model.calib}"
    assert steps["quantize"]["metrics"]["calibration_samples"] == 16
    assert steps["verify"]["status"] == "ran"


def test_bert_with_attention_mask_at_opset_11(tmp_path: Path) -> None:
    """The issue's "done when": embedding cosine >= 0.99 against float at npu/w8a16 with
    >= 90% of MatMul/Conv quantized. The model is opset 11 with a [batch, sequence] input
    (the sequence length is read from the data), a float32-min additive attention mask
    (`Where(mask, 0, finfo.min)`, whose range left no 16-bit step for the scores) and an
    erf GELU (HTP has no Erf)."""
    model = realmodels.bert(tmp_path / "bert")
    assert next(o.version for o in onnx.load(str(model.model)).opset_import) == 11
    steps, built = _build(model, tmp_path / "o")
    _held_out_verification(steps, model)
    quantize = steps["quantize"]["metrics"]
    assert quantize["matmul_conv_quantized_fraction"] >= 0.9
    assert quantize["kept_float_nonfinite"] == []
    clamped = quantize["clamped_sentinels"]
    assert clamped and all(max(map(abs, c["observed"])) > 1e38 for c in clamped.values())
    assert all(max(map(abs, c["range"])) < 40 for c in clamped.values())
    assert prepare_rewrites(steps)["erf_gelu_to_gelu"] == 2  # one per layer
    score, ran_on = realmodels.task_score(model, built)
    assert score >= model.threshold, f"{model.metric} {score:.4f} on {ran_on}"


def test_bert_without_data_calibrates_on_padded_masks(tmp_path: Path) -> None:
    """Without data, synthetic masks are padded like a tokenizer's (all-ones masks left
    the mask path a range of 0, and its finfo.min constants made HTP fail to finalize)
    and token ids stay below the vocabulary the embedding table has."""
    model = realmodels.bert(tmp_path / "bert", calib=1, heldout=1)
    shapes = [a for n in ("input_ids", "attention_mask", "token_type_ids")
              for a in ("--shape", f"{n}=1x{realmodels.SEQUENCE}")]  # fmt: skip
    done = cli("build", "--onnx", model.model, "--device", "npu", "--precision", "w8a16",
               *shapes, "-o", tmp_path / "o", "--json")  # fmt: skip
    assert done.exit_code == 0, done.stderr
    steps = {s["pass"]: s for s in json.loads(done.stdout)["components"]["model"]["steps"]}
    assert steps["quantize"]["metrics"]["calibration_source"].startswith("synthetic")
    assert steps["quantize"]["metrics"]["clamped_sentinels"]  # masked positions were seen
    assert steps["verify"]["metrics"]["outputs"]["sentence_embedding"]["cosine"] >= 0.99


def test_cnn_with_relu6_and_hardswish(tmp_path: Path) -> None:
    """ReLU6 -> Clip and HardSwish (inlined to HardSigmoid * x by the normalization): the
    top-1 class of every held-out image is the float model's."""
    model = realmodels.cnn(tmp_path / "cnn")
    ops = {n.op_type for n in onnx.load(str(model.model)).graph.node}
    assert {"Clip", "HardSwish"} <= ops
    steps, built = _build(model, tmp_path / "o")
    _held_out_verification(steps, model)
    score, ran_on = realmodels.task_score(model, built)
    assert score >= model.threshold, f"{model.metric} {score:.4f} on {ran_on}"


def test_text_recognizer_at_opset_12(tmp_path: Path) -> None:
    """CNN + self-attention + a BatchNormalization over the sequence, per-step CTC logits
    at opset 12. The BatchNormalization no Conv absorbs was wrong on HTP (6.9 dB against
    32 dB simulated); as Mul + Add it is right. Greedy-decoded lines read as the float
    model reads them (character agreement)."""
    model = realmodels.recognizer(tmp_path / "rec")
    assert next(o.version for o in onnx.load(str(model.model)).opset_import) == 12
    steps, built = _build(model, tmp_path / "o")
    _held_out_verification(steps, model)
    assert prepare_rewrites(steps)["batchnorm_to_mul_add"] == 1
    score, ran_on = realmodels.task_score(model, built)
    assert score >= model.threshold, f"{model.metric} {score:.4f} on {ran_on}"
