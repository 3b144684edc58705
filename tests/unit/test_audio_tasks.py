"""Audio task heads through `init`: the modality from the model class, the inputs from the
folder's feature extractor, the CTC blank from its tokenizer; the CTC metric; the bundled
speech those inputs are fed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.audio_models import saved
from winml_recipes.authoring import init_project
from winml_recipes.catalog import load_file
from winml_recipes.metrics.speech import SequenceAgreement
from winml_recipes.sdk.contract import IOContract, TensorSpec
from winml_recipes.sdk.errors import WinmlError
from winml_recipes.sdk.metrics import metric_for

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("audio-models")


def _init(folder: Path, root: Path) -> dict:
    catalog, _ = init_project(str(folder), name=folder.name, catalog_dir=root / "catalog",
                              recipes_dir=root / "recipes")  # fmt: skip
    return yaml.safe_load(catalog.read_text())


# arch -> task, input, its shape, feature extractor, output, its shape
EXPECTED = {
    "wav2vec2-ctc": ("automatic-speech-recognition", "input_values", ["batch", "samples"],
                     "Wav2Vec2FeatureExtractor", "logits", ["batch", 398, 12]),
    "wav2vec2-cls": ("audio-classification", "input_values", ["batch", "samples"],
                     "Wav2Vec2FeatureExtractor", "logits", ["batch", 4]),
    "hubert-cls": ("audio-classification", "input_values", ["batch", "samples"],
                   "Wav2Vec2FeatureExtractor", "logits", ["batch", 4]),
    "ast-cls": ("audio-classification", "input_values", ["batch", 64, 32],
                "ASTFeatureExtractor", "logits", ["batch", 4]),
    "whisper-encoder": ("audio-feature-extraction", "input_features", ["batch", 16, 100],
                        "WhisperFeatureExtractor", "last_hidden_state", ["batch", 50, 32]),
}  # fmt: skip


@pytest.mark.parametrize("arch", list(EXPECTED))
def test_init_reads_the_audio_head_and_its_features(arch: str, models: Path, tmp_path) -> None:
    """Wav2Vec2ForCTC was refused, the wav2vec2 / HuBERT classifiers were written as text
    classification with input_ids, AST was refused ('audio config needs num_mel_bins and
    max_source_positions'); Whisper's input had no audio block (random features)."""
    task, name, shape, extractor, output, out_shape = EXPECTED[arch]
    entry = _init(saved(arch, models), tmp_path)
    model = entry["components"]["model"]
    assert (entry["task"], list(model["inputs"]), list(model["outputs"])) == (
        task,
        [name],
        [output],
    )
    spec = model["inputs"][name]
    assert spec["shape"] == shape and spec["audio"]["feature_extractor"] == extractor
    assert spec["audio"]["sampling_rate"] == 16000
    assert model["outputs"][output]["shape"] == out_shape
    if task == "automatic-speech-recognition":
        # 2 s at 16 kHz through kernels 10, 8, 8 with strides 5, 4, 4: 398 frames;
        # the blank is <pad>, id 0
        assert model["dims"]["samples"] == 32000 and model["outputs"]["logits"]["ctc_blank"] == 0


def test_init_refuses_a_speech_model_without_a_head_it_exports(tmp_path: Path) -> None:
    from transformers import Wav2Vec2Config

    Wav2Vec2Config(architectures=["Wav2Vec2ForPreTraining"]).save_pretrained(tmp_path / "m")
    with pytest.raises(WinmlError) as info:
        _init(tmp_path / "m", tmp_path)
    message = str(info.value)
    assert "\n" not in message
    assert "Wav2Vec2ForPreTraining takes speech (input_values)" in message
    assert "automatic-speech-recognition (*ForCTC)" in message


def test_init_refuses_a_ctc_blank_the_vocab_contradicts(models: Path, tmp_path: Path) -> None:
    import shutil

    folder = tmp_path / "ctc"
    shutil.copytree(saved("wav2vec2-ctc", models), folder)
    vocab = json.loads((folder / "vocab.json").read_text())
    vocab["<pad>"], vocab["<unk>"] = 3, 0
    (folder / "vocab.json").write_text(json.dumps(vocab))
    with pytest.raises(WinmlError, match=r"pad_token_id 0 but vocab\.json gives '<pad>' id 3"):
        _init(folder, tmp_path)


def _logits(lines: list[list[int]], vocab: int = 6, blank: int = 0) -> np.ndarray:
    """Logits [1, frames, vocab] whose greedy CTC reads each line (blanks between tokens)."""
    frames = 2 * max(len(x) for x in lines) + 1
    out = np.zeros((len(lines), frames, vocab), np.float32)
    for r, line in enumerate(lines):
        ids = [blank] * frames
        for k, t in enumerate(line):
            ids[2 * k + 1] = t
        out[r, np.arange(frames), ids] = 5.0
    return out


def _metric(blank: int = 0) -> SequenceAgreement:
    contract = IOContract(outputs=(TensorSpec("logits", "float32", ("batch", 9, 6),
                                              ctc_blank=blank),))  # fmt: skip
    metric = metric_for("automatic-speech-recognition", contract)
    assert isinstance(metric, SequenceAgreement)
    return metric


def test_sequence_agreement_fails_lines_that_differ_though_characters_agree() -> None:
    want = [[1, 2, 3, 4, 5, 1, 2, 3, 4, 5], [2, 3, 2, 3, 4, 4, 5, 1, 2, 3]]
    got = [[*line[:-1], 1 + line[-1] % 5] for line in want]  # one character off per line
    metric = _metric()
    ref = [{"logits": _logits([w])} for w in want]
    values = metric.values(ref, [{"logits": _logits([g])} for g in got])
    assert values["sequence_agreement"] == 0.0 and values["character_agreement"] == 0.9
    failing = [k for k, g in metric.gates.items() if values[k] < g.threshold]
    assert failing == ["sequence_agreement"]
    same = metric.values(ref, [{"logits": _logits([w])} for w in want])
    assert same["sequence_agreement"] == 1.0 and same["character_agreement"] == 1.0


def test_sequence_agreement_drops_the_models_own_blank() -> None:
    """Blank 3 (the contract's ctc_blank): read as blank 0, the 3s would be characters."""
    line = [1, 2, 1, 5]
    ref = [{"logits": _logits([line], blank=3)}]
    cand = [{"logits": _logits([[*line[:2], 4, 5]], blank=3)}]
    values = _metric(blank=3).values(ref, cand)
    assert values["characters"] == 4.0 and values["character_agreement"] == 0.75


def test_bundled_speech_feeds_an_audio_input(models: Path, tmp_path: Path) -> None:
    """Without data, an input with an audio block is fed the bundled held-out sentences
    through its feature extractor (never the contract's random range)."""
    from winml_recipes.feeds import describe_source, feeds_for, take
    from winml_recipes.speech import attribution, bundled_speech

    assert len(bundled_speech("calibration")) == 6 and len(bundled_speech("heldout")) == 4
    texts = {r["file"].split("/")[0]: set() for r in attribution()}
    for r in attribution():
        texts[r["file"].split("/")[0]].add(r["text"])
    assert not texts["calibration"] & texts["heldout"]
    for arch, shape in (("wav2vec2-ctc", (1, 16000)), ("ast-cls", (1, 64, 32)),
                        ("whisper-encoder", (1, 16, 100))):  # fmt: skip
        root = tmp_path / arch
        catalog, _ = init_project(
            str(saved(arch, models)),
            name=arch,
            catalog_dir=root / "catalog",
            recipes_dir=root / "recipes",
        )
        component = load_file(catalog).components["model"]
        contract = component.contract
        if arch == "wav2vec2-ctc":
            contract = IOContract(contract.inputs, contract.outputs, {"batch": 1, "samples": 16000})
        feeds = take(feeds_for(None, contract, root, {}, 8, 0), 8)
        assert describe_source(None, contract, held_out=True) == "bundled speech (heldout set)"
        assert len(feeds) == 4
        x = next(iter(feeds[0].values()))
        assert x.shape == shape and x.dtype == np.float32
        assert not np.allclose(x, next(iter(feeds[1].values())))
        if arch == "wav2vec2-ctc":  # do_normalize: zero mean, unit variance over the clip
            assert abs(float(x.mean())) < 1e-3 and abs(float(x.std()) - 1) < 1e-2


def test_the_manifest_contract_keeps_audio_and_the_blank(models: Path, tmp_path: Path) -> None:
    """`compare` and `run` feed a build from its manifest: the audio block (the bundled
    speech through the feature extractor) and the CTC blank survive the record."""
    from winml_recipes.buildfolder import contract_from_record
    from winml_recipes.engine.identity import contract_key
    from winml_recipes.engine.run import contract_record

    catalog, _ = init_project(
        str(saved("wav2vec2-ctc", models)),
        name="ctc",
        catalog_dir=tmp_path / "catalog",
        recipes_dir=tmp_path / "recipes",
    )
    contract = load_file(catalog).components["model"].contract
    record = contract_record(contract)
    back = contract_from_record({"inputs": record.inputs, "outputs": record.outputs,
                                 "dims": record.dims})  # fmt: skip
    assert back.inputs[0].audio == contract.inputs[0].audio is not None
    assert back.outputs[0].ctc_blank == 0
    # a spec without them keys as before they existed
    plain = IOContract(inputs=(TensorSpec("x", "float32", (1, 3)),))
    assert "audio" not in contract_key(plain)["inputs"][0]


def test_the_tiny_ctc_head_decides_its_frames_like_a_trained_head(models: Path) -> None:
    """The fixture's CTC head is fitted (tests/audio_models.fit_speech_head), so quantizing
    the model is judged on decisions, not near ties: on each held-out sentence (2 s, as the
    build feeds it) nearly every frame's best token leads the second by a tenth of that
    frame's logit spread, and the greedy transcript is short (a trained English model emits
    ~15 characters a second). The random head (stop 39) led by that much on 53-60% of
    frames and spelled 193-240 tokens per sentence; every transcript differed after
    quantization already in the CPU simulation. Fitted: 99.7-100%, 1-2 tokens."""
    torch = pytest.importorskip("torch")
    from transformers import Wav2Vec2ForCTC

    from winml_recipes.metrics.speech import transcripts
    from winml_recipes.speech import bundled_speech, read_wav

    model = Wav2Vec2ForCTC.from_pretrained(saved("wav2vec2-ctc", models)).eval()
    for path in bundled_speech("heldout"):
        wave = read_wav(path)[0][:32000]
        wave = ((wave - wave.mean()) / np.sqrt(wave.var() + 1e-7)).astype(np.float32)
        with torch.no_grad():
            logits = model(torch.from_numpy(wave)[None]).logits[0].numpy()
        top = np.sort(logits, -1)
        lead = (top[:, -1] - top[:, -2]) / (top[:, -1] - top[:, 0])
        assert (lead >= 0.1).mean() >= 0.95, path.name
        assert 1 <= len(transcripts(logits[None], blank=0)[0]) <= 30, path.name
