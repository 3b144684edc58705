"""Models that take speech as `input_values`: wav2vec2-style waveforms and AST filter banks.

The modality comes from the architecture's class (its `main_input_name` is `input_values`),
never from the head's name alone: `Wav2Vec2ForSequenceClassification` is audio
classification of a waveform, not text classification. Two inputs:

- waveform (wav2vec2, HuBERT, WavLM, ...): f32 [batch, samples] at the feature extractor's
  sampling rate, zero-mean unit-variance when it says `do_normalize`;
- filter bank (AST): f32 [batch, max_length, num_mel_bins] from ASTFeatureExtractor.

Heads: `*ForCTC` (automatic-speech-recognition: logits [batch, frames, vocab], blank = the
pad token) and `*ForSequenceClassification` / `*ForAudioClassification` (logits
[batch, labels]). Anything else taking `input_values` is refused in one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from winml_recipes.sdk.errors import SourceError

ASR = "automatic-speech-recognition"
CLASSIFY = "audio-classification"
HEADS = {"ForCTC": ASR, "ForSequenceClassification": CLASSIFY, "ForAudioClassification": CLASSIFY}
SECONDS = 2  # default waveform length: the bundled sentences last 2.5 to 3.5 s


def takes_input_values(config: Any) -> bool:
    """Whether the config's architecture (else model type) takes speech as `input_values`."""
    import transformers

    for arch in list(getattr(config, "architectures", None) or []):
        cls = getattr(transformers, arch, None)
        if cls is not None:
            return getattr(cls, "main_input_name", None) == "input_values"
    return is_filter_bank(config) or _is_waveform_config(config)


def is_filter_bank(config: Any) -> bool:
    """AST: log-mel filter banks [batch, max_length, num_mel_bins]."""
    return bool(getattr(config, "num_mel_bins", 0) and getattr(config, "max_length", 0))


def _is_waveform_config(config: Any) -> bool:
    return bool(getattr(config, "conv_dim", None) and getattr(config, "conv_stride", None))


def task_of(config: Any) -> str:
    """The task of an `input_values` model's head, or a one-line refusal naming it."""
    archs = list(getattr(config, "architectures", None) or [])
    for arch in archs:
        for suffix, task in HEADS.items():
            if arch.endswith(suffix) and not (task == ASR and is_filter_bank(config)):
                return task
    named = archs[0] if archs else f"a {config.model_type} config naming no architectures"
    raise SourceError(
        f"{named} takes speech (input_values) but is not a head init can export; it exports "
        "automatic-speech-recognition (*ForCTC) and audio-classification "
        "(*ForSequenceClassification, *ForAudioClassification) of such models"
    )


def frames_after_convs(config: Any, samples: int) -> int:
    """Frames a wav2vec2-style conv feature encoder makes of `samples` waveform samples."""
    length = samples
    for kernel, stride in zip(config.conv_kernel, config.conv_stride, strict=True):
        length = (length - kernel) // stride + 1
    return length


def example_inputs(config: Any, batch: int, gen: Any) -> tuple[tuple[str, ...], tuple, dict]:
    """(input names, trace inputs, dynamic dims) for torch.onnx.export."""
    import torch

    if is_filter_bank(config):
        shape = (batch, int(config.max_length), int(config.num_mel_bins))
        return ("input_values",), (torch.randn(*shape, generator=gen) * 0.5,), {0: "batch"}
    # a length other than the default's, so the samples dim stays dynamic
    samples = 16000 + 320 * 7
    wave_in = torch.randn(batch, samples, generator=gen)
    return ("input_values",), (wave_in,), {0: "batch", 1: "samples"}


def component(
    config: Any,
    task: str,
    preprocessor: Mapping[str, Any] | None,
    where: str,
    whole: Any,
    vocab: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The catalog component (I/O contract, audio block) of an `input_values` model.

    `whole(value, field, where, maximum)` checks a number read from the config."""
    fe = dict(preprocessor or {})
    rate = int(fe.get("sampling_rate") or getattr(config, "sampling_rate", 16000) or 16000)
    options = {k: v for k, v in fe.items() if isinstance(v, bool | int | float | str)}
    if is_filter_bank(config):
        frames = whole(getattr(config, "max_length", 0), "max_length", where, 1 << 16)
        mels = whole(getattr(config, "num_mel_bins", 0), "num_mel_bins", where, 1024)
        for key, want in (("max_length", frames), ("num_mel_bins", mels)):
            if key in fe and fe[key] != want:
                raise SourceError(
                    f"preprocessor_config.json says {key} {fe[key]} but the model takes {want}; "
                    "fix one of the two",
                    where=where,
                )
        spec = {
            "dtype": "float32",
            "shape": ["batch", frames, mels],
            "range": [-2.0, 2.0],
            "description": "log-mel filter bank (Kaldi fbank, 25 ms windows, 10 ms hop), "
            "(x - mean) / (2 * std) as ASTFeatureExtractor computes it",
            "audio": {
                "feature_extractor": "ASTFeatureExtractor",
                "sampling_rate": rate,
                "options": options,
            },
        }
        dims = {"batch": 1}
    else:
        spec = {
            "dtype": "float32",
            "shape": ["batch", "samples"],
            "range": [-4.0, 4.0],
            "description": f"mono waveform at {rate} Hz"
            + (", zero mean and unit variance" if fe.get("do_normalize", True) else ""),
            "audio": {
                "feature_extractor": "Wav2Vec2FeatureExtractor",
                "sampling_rate": rate,
                "options": options,
            },
        }
        dims = {"batch": 1, "samples": SECONDS * rate}
    if task == ASR:
        vocab_size = whole(getattr(config, "vocab_size", 0), "vocab_size", where, 1 << 24)
        frames_out = frames_after_convs(config, dims["samples"])
        output = {
            "dtype": "float32",
            "shape": ["batch", frames_out, vocab_size],
            "ctc_blank": _blank(config, vocab, where),
        }
    else:
        labels = whole(getattr(config, "num_labels", 2), "num_labels", where, 1 << 24)
        output = {"dtype": "float32", "shape": ["batch", labels]}
    return {
        "task": task,
        "dims": dims,
        "inputs": {"input_values": spec},
        "outputs": {"logits": output},
    }


def _blank(config: Any, vocab: Mapping[str, Any] | None, where: str) -> int:
    """The CTC blank: the config's pad_token_id (what the model's CTC loss uses), checked
    against the tokenizer's vocab.json where the folder has one."""
    pad = getattr(config, "pad_token_id", None)
    if not isinstance(pad, int) or isinstance(pad, bool) or pad < 0:
        raise SourceError(
            "config.json has no pad_token_id; a CTC model's blank is its pad token: set it",
            where=where,
        )
    token = (vocab or {}).get("pad_token")
    ids = (vocab or {}).get("vocab") or {}
    if isinstance(token, str) and token in ids and ids[token] != pad:
        raise SourceError(
            f"config.json says pad_token_id {pad} but vocab.json gives {token!r} id "
            f"{ids[token]}; the CTC blank must be one: fix one of the two",
            where=where,
        )
    return pad
