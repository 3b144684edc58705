"""The spoken sentences shipped with the package (winml_recipes/data/speech), and how speech
becomes a model's audio input.

An input with an `audio:` block and no data of the user's calibrates on the `calibration`
clips and verifies on the `heldout` clips (other sentences). Every file is checked against
the sha256 that ATTRIBUTION.yaml records. The features are computed by the Hugging Face
feature extractor the block names, with the model folder's preprocessor_config.json fields:
a normalized waveform (wav2vec2, HuBERT), AST's filter bank, Whisper's log-mel.
"""

from __future__ import annotations

import functools
import hashlib
import wave
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path

import numpy as np
import yaml

from winml_recipes.datafiles import require_regular_file
from winml_recipes.sdk.contract import IOContract, TensorSpec, resolve_shape
from winml_recipes.sdk.errors import InternalError, PlanError

SPLITS = ("calibration", "heldout")
# feature extractor -> the input it computes
FEATURE_EXTRACTORS = {
    "Wav2Vec2FeatureExtractor": "waveform [batch, samples]",
    "ASTFeatureExtractor": "filter bank [batch, frames, mel bins]",
    "WhisperFeatureExtractor": "log-mel [batch, mel bins, frames]",
}
# preprocessor_config.json fields that are not the extractor's arguments
_NOT_OPTIONS = ("feature_extractor_type", "processor_class")


def speech_dir() -> Path:
    return Path(str(resources.files("winml_recipes.data") / "speech"))


@functools.cache
def attribution() -> tuple[dict[str, str], ...]:
    """Every bundled clip's record: file, text, source, license, sha256."""
    text = (speech_dir() / "ATTRIBUTION.yaml").read_text(encoding="utf-8")
    return tuple(yaml.safe_load(text)["clips"])


@functools.cache
def bundle_digest() -> str:
    """The bundle's identity: the sha256 of its ATTRIBUTION.yaml (which holds every file's)."""
    return hashlib.sha256((speech_dir() / "ATTRIBUTION.yaml").read_bytes()).hexdigest()


@functools.cache
def bundled_speech(split: str) -> tuple[Path, ...]:
    """The checked clips of `split` (calibration or heldout), in a stable order."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
    out = []
    for record in attribution():
        if not record["file"].startswith(f"{split}/"):
            continue
        path = speech_dir() / record["file"]
        require_regular_file(path, "bundled speech")
        if hashlib.sha256(path.read_bytes()).hexdigest() != record["sha256"]:
            raise InternalError(
                f"bundled speech {record['file']} does not match its recorded sha256; "
                "reinstall winml-recipes"
            )
        out.append(path)
    return tuple(out)


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """A 16-bit PCM WAV file as float32 samples in [-1, 1] (channels averaged) and its rate."""
    with wave.open(str(path)) as w:
        if w.getsampwidth() != 2:
            raise PlanError(f"{path.name}: only 16-bit PCM WAV is read (it has "
                            f"{8 * w.getsampwidth()}-bit samples)")  # fmt: skip
        rate, channels = w.getframerate(), w.getnchannels()
        pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768
    return pcm.reshape(-1, channels).mean(axis=1), rate


def resample(x: np.ndarray, rate: int, target: int) -> np.ndarray:
    """Band-limited resampling by FFT."""
    if rate == target:
        return x.astype(np.float32)
    n = round(len(x) * target / rate)
    out = np.fft.irfft(np.fft.rfft(x)[: n // 2 + 1], n) * (n / len(x))
    return out.astype(np.float32)


def bundled_audio_input(contract: IOContract) -> TensorSpec | None:
    """The one audio input the bundled speech feeds when no data is given (None: none or
    several)."""
    found = [s for s in contract.inputs if s.audio is not None]
    return found[0] if len(found) == 1 else None


def features(samples: np.ndarray, rate: int, spec: TensorSpec, dims: dict) -> np.ndarray:
    """One clip as `spec` takes it: resampled to the block's rate, through its feature
    extractor, cropped or padded to the input's shape."""
    assert spec.audio is not None
    block = spec.audio
    shape = resolve_shape(spec, dims)
    wave_in = resample(samples, rate, block.sampling_rate)
    extractor = _extractor(block.feature_extractor, dict(block.options), block.sampling_rate)
    kwargs: dict = {"sampling_rate": block.sampling_rate, "return_tensors": "np"}
    if block.feature_extractor == "Wav2Vec2FeatureExtractor":
        length = shape[-1]
        kwargs.update(padding="max_length", max_length=length, truncation=True)
        wave_in = wave_in[:length]
    out = np.asarray(extractor(wave_in, **kwargs)[_input_name(block.feature_extractor)])
    out = out.astype(np.float32)
    if out.shape[1:] != shape[1:]:
        raise PlanError(
            f"input '{spec.name}': {block.feature_extractor} makes {list(out.shape)}, the "
            f"input is {list(shape)}; make the audio block's options match the model"
        )
    return np.repeat(out, shape[0], axis=0) if shape[0] != out.shape[0] else out


def _input_name(extractor: str) -> str:
    return "input_features" if extractor == "WhisperFeatureExtractor" else "input_values"


def _extractor(name: str, options: dict, rate: int):
    try:
        import transformers
    except ImportError:
        raise PlanError(
            f"audio inputs are computed by transformers' {name}; install it "
            "(pip install 'winml-recipes[export]')"
        ) from None
    if name not in FEATURE_EXTRACTORS:
        raise PlanError(f"audio.feature_extractor {name!r}: one of {', '.join(FEATURE_EXTRACTORS)}")
    kept = {k: v for k, v in options.items() if k not in _NOT_OPTIONS}
    return getattr(transformers, name)(**{**kept, "sampling_rate": rate})


def from_speech(
    files: list[Path],
    contract: IOContract,
    rest: Callable[[], Iterator[dict]],
    samples: int,
    skip: int = 0,
) -> Iterator[dict[str, np.ndarray]]:
    """Feeds: each clip through the audio input's features, beside `rest` (the other inputs'
    seeded feeds)."""
    target = bundled_audio_input(contract)
    assert target is not None
    dims = dict(contract.dims)
    for path, extra in zip(files[skip : skip + samples], rest(), strict=False):
        clip, rate = read_wav(path)
        yield {target.name: features(clip, rate, target, dims), **extra}
