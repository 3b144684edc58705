"""Tiny audio models (random weights, seed 0) saved as a Hub folder ships them: config,
weights, preprocessor_config.json and, for CTC, the tokenizer's vocab.json.

Each has the architecture of a curated catalog entry (wav2vec2 base CTC, a wav2vec2 / HuBERT /
AST audio classifier, the Whisper tiny encoder) at a width that builds in seconds.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np

VERSION = 2
# wav2vec2's feature encoder at a 1/10 width: 3 conv layers (strides 5, 4, 4: 80 samples a
# frame); initializer_range 0.2 keeps the tiny model's logits apart (0.02 ties them)
_WAVEFORM = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=64, conv_dim=(32, 32, 32), conv_stride=(5, 4, 4),
                 conv_kernel=(10, 8, 8), num_conv_pos_embeddings=16,
                 num_conv_pos_embedding_groups=4, initializer_range=0.2)  # fmt: skip
VOCAB = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, "|": 4, "E": 5, "T": 6, "A": 7, "O": 8,
         "N": 9, "I": 10, "H": 11}  # fmt: skip
_W2V_FE = {"feature_extractor_type": "Wav2Vec2FeatureExtractor", "feature_size": 1,
           "sampling_rate": 16000, "padding_value": 0.0, "do_normalize": True,
           "return_attention_mask": False}  # fmt: skip


def _wav2vec2_ctc():
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

    cfg = Wav2Vec2Config(**_WAVEFORM, vocab_size=len(VOCAB), pad_token_id=0)
    model = Wav2Vec2ForCTC(cfg).eval()
    fit_speech_head(model)
    return model, _W2V_FE, VOCAB


# the fitted CTC head: 2 s windows (the build's input), every 0.25 s over each calibration clip
_WINDOW, _HOP, _FRAME, _FIELD, _SPEECH_DB = 32000, 4000, 80, 400, 25.0


def speech_frames(wave: np.ndarray, frames: int) -> np.ndarray:
    """Per output frame (80-sample stride, 400-sample receptive field): True where its energy
    is within 25 dB of the window's loudest frame (speech), False for silence and pauses."""
    at = np.minimum(np.arange(frames)[:, None] * _FRAME + np.arange(_FIELD), len(wave) - 1)
    energy = 10 * np.log10((wave[at] ** 2).mean(1) + 1e-10)
    return energy > energy.max() - _SPEECH_DB


def fit_speech_head(model) -> None:
    """Fit the CTC head (lm_head) by least squares, in place, so its greedy transcript is
    decisive: blank on silence, the token E on speech (one E per voiced stretch).

    A random head is not a test of quantization: on the tiny random model every frame is a
    near tie (about 100 characters a second) and transcripts differ already between the float
    model and the CPU simulation of its QDQ model. A trained CTC head decides almost every frame
    by a wide margin. The random backbone's features carry little that a linear head can
    decide beside speech against silence (measured: a 3-letter head fitted the same way
    separates 48% of the training frames; training the transformer on the clips fits
    them but labels 46-79% of held-out frames; docs/families.md), so the head is fitted to
    that: on the bundled calibration speech (2 s windows, normalized as
    Wav2Vec2FeatureExtractor does), target logits +4 for the frame's label and -4 for every
    other token. Deterministic (float64
    ridge least squares, no iteration), about a second. The held-out clips are not used."""
    import torch

    from winml_recipes.speech import bundled_speech, read_wav

    windows = []
    for path in bundled_speech("calibration"):
        clip = read_wav(path)[0].astype(np.float64)
        for start in range(0, len(clip) - _WINDOW + 1, _HOP):
            w = clip[start : start + _WINDOW]
            windows.append(((w - w.mean()) / np.sqrt(w.var() + 1e-7)).astype(np.float32))
    with torch.no_grad():
        hidden = model.wav2vec2(torch.tensor(np.stack(windows))).last_hidden_state.numpy()
    n, frames, width = hidden.shape
    speech = np.stack([speech_frames(w, frames) for w in windows]).reshape(-1)
    x = np.concatenate([hidden.reshape(-1, width), np.ones((n * frames, 1))], 1).astype(np.float64)
    target = np.full((n * frames, len(VOCAB)), -4.0)
    target[np.arange(n * frames), np.where(speech, VOCAB["E"], VOCAB["<pad>"])] = 4.0
    # ridge: the hidden states are LayerNorm outputs (rows sum to ~0), so plain least
    # squares cancels huge weights (|w| 8e4; the export's parity then fails at 45 dB)
    ridge = 1e-2 * len(x) * np.diag([1.0] * width + [0.0])
    solution = np.linalg.solve(x.T @ x + ridge, x.T @ target)
    with torch.no_grad():
        model.lm_head.weight.copy_(torch.tensor(solution[:-1].T, dtype=torch.float32))
        model.lm_head.bias.copy_(torch.tensor(solution[-1], dtype=torch.float32))


def _wav2vec2_cls():
    from transformers import Wav2Vec2Config, Wav2Vec2ForSequenceClassification

    cfg = Wav2Vec2Config(**_WAVEFORM, num_labels=4)
    return Wav2Vec2ForSequenceClassification(cfg), _W2V_FE, None


def _hubert_cls():
    from transformers import HubertConfig, HubertForSequenceClassification

    cfg = HubertConfig(**_WAVEFORM, num_labels=4)
    return HubertForSequenceClassification(cfg), _W2V_FE, None


def _ast_cls():
    from transformers import ASTConfig, ASTForAudioClassification

    cfg = ASTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, num_mel_bins=32, max_length=64, patch_size=16,
                    frequency_stride=10, time_stride=10, num_labels=4,
                    initializer_range=0.2)  # fmt: skip
    # what ASTFeatureExtractor(num_mel_bins=32, max_length=64).save_pretrained writes
    fe = {"feature_extractor_type": "ASTFeatureExtractor", "feature_size": 1,
          "sampling_rate": 16000, "num_mel_bins": 32, "max_length": 64, "do_normalize": True,
          "mean": -4.2677393, "std": 4.5689974, "padding_value": 0.0,
          "return_attention_mask": False}  # fmt: skip
    return ASTForAudioClassification(cfg), fe, None


def _whisper():
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    cfg = WhisperConfig(vocab_size=256, d_model=32, encoder_layers=2, encoder_attention_heads=2,
                        decoder_layers=1, decoder_attention_heads=2, encoder_ffn_dim=64,
                        decoder_ffn_dim=64, num_mel_bins=16, max_source_positions=50,
                        pad_token_id=0, bos_token_id=1, eos_token_id=2,
                        decoder_start_token_id=1)  # fmt: skip
    # WhisperFeatureExtractor(feature_size=16, chunk_length=1): 1 s, 100 frames of 16 bands
    fe = {"feature_extractor_type": "WhisperFeatureExtractor", "feature_size": 16,
          "sampling_rate": 16000, "padding_value": 0.0, "return_attention_mask": False,
          "n_fft": 400, "hop_length": 160, "chunk_length": 1, "n_samples": 16000,
          "nb_max_frames": 100}  # fmt: skip
    return WhisperForConditionalGeneration(cfg), fe, None


ARCHITECTURES: dict[str, Callable] = {
    "wav2vec2-ctc": _wav2vec2_ctc,
    "wav2vec2-cls": _wav2vec2_cls,
    "hubert-cls": _hubert_cls,
    "ast-cls": _ast_cls,
    "whisper-encoder": _whisper,
}


def saved(arch: str, root: Path) -> Path:
    """A `save_pretrained` folder of the tiny `arch` under `root` (made once)."""
    folder = root / f"{arch}-v{VERSION}"
    if (folder / "config.json").is_file():
        return folder
    import torch

    torch.manual_seed(0)
    model, features, vocab = ARCHITECTURES[arch]()
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.eval().save_pretrained(tmp)
    (tmp / "preprocessor_config.json").write_text(json.dumps(features))
    if vocab is not None:
        (tmp / "vocab.json").write_text(json.dumps(vocab))
        (tmp / "tokenizer_config.json").write_text(json.dumps(
            {"tokenizer_class": "Wav2Vec2CTCTokenizer", "pad_token": "<pad>",
             "word_delimiter_token": "|", "unk_token": "<unk>"}))  # fmt: skip
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    return folder
