"""Hugging Face architectures from tiny configs (seeded random weights), as a user brings
them: a `save_pretrained` folder, then `winml-recipes init FOLDER` and `build` of the
recipe it writes. The folders are kept in the corpus cache."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.corpus import fetch

HF_VERSION = 2  # 2: whisper-encoder ships its feature extractor's preprocessor_config.json

TEXT = dict(vocab_size=256, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=64, max_position_embeddings=64)  # fmt: skip
IMAGE_PREPROCESSOR = {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                      "do_normalize": True, "do_resize": True}  # fmt: skip


def _bert():
    from transformers import BertConfig, BertForSequenceClassification

    return BertForSequenceClassification(BertConfig(**TEXT, num_labels=3)), None


def _distilbert():
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    cfg = DistilBertConfig(vocab_size=256, dim=32, n_layers=2, n_heads=2, hidden_dim=64,
                           max_position_embeddings=64, num_labels=3)  # fmt: skip
    return DistilBertForSequenceClassification(cfg), None


def _roberta():
    from transformers import RobertaConfig, RobertaForSequenceClassification

    cfg = RobertaConfig(**{**TEXT, "max_position_embeddings": 66}, num_labels=3)
    return RobertaForSequenceClassification(cfg), None


def _vit():
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(image_size=64, patch_size=16, hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=2, intermediate_size=64, num_labels=10)  # fmt: skip
    return ViTForImageClassification(cfg), IMAGE_PREPROCESSOR


def _resnet():
    from transformers import ResNetConfig, ResNetForImageClassification

    cfg = ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                       layer_type="basic", num_labels=10)  # fmt: skip
    # ResNetConfig has no image_size: the exporter traces at 224, so the preprocessor says
    # 224 too (a smaller size here makes init's catalog disagree with the export: see report)
    return ResNetForImageClassification(cfg), {**IMAGE_PREPROCESSOR,
                                               "size": {"shortest_edge": 224}}  # fmt: skip


def _convnext():
    from transformers import ConvNextConfig, ConvNextForImageClassification

    cfg = ConvNextConfig(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2, image_size=64,
                         num_labels=10)  # fmt: skip
    return ConvNextForImageClassification(cfg), {**IMAGE_PREPROCESSOR,
                                                 "size": {"shortest_edge": 64}}  # fmt: skip


def _mobilenetv2():
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    # initializer_range 0.02 (the default) leaves logits of 1e-26 at this width: a dead model
    cfg = MobileNetV2Config(image_size=64, depth_multiplier=0.35, num_labels=10,
                            initializer_range=0.25)  # fmt: skip
    return MobileNetV2ForImageClassification(cfg), IMAGE_PREPROCESSOR


def _whisper_encoder():
    """The encoder of a tiny Whisper (WhisperForAudioClassification: the encoder and a head)."""
    from transformers import WhisperConfig, WhisperForAudioClassification

    cfg = WhisperConfig(vocab_size=256, d_model=32, encoder_layers=2, encoder_attention_heads=2,
                        decoder_layers=1, decoder_attention_heads=2, encoder_ffn_dim=64,
                        decoder_ffn_dim=64, num_mel_bins=16, max_source_positions=50,
                        num_labels=4, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                        decoder_start_token_id=1)  # fmt: skip
    # what WhisperFeatureExtractor(feature_size=16, chunk_length=1).save_pretrained writes
    # (1 s at 16 kHz: 100 frames of 16 mel bands), as a whisper checkpoint ships it
    features = {"feature_size": 16, "sampling_rate": 16000, "padding_value": 0.0,
                "return_attention_mask": False, "n_fft": 400, "hop_length": 160,
                "chunk_length": 1, "n_samples": 16000, "nb_max_frames": 100,
                "feature_extractor_type": "WhisperFeatureExtractor"}  # fmt: skip
    return WhisperForAudioClassification(cfg), features


ARCHITECTURES: dict[str, Callable] = {
    "bert": _bert, "distilbert": _distilbert, "roberta": _roberta, "vit": _vit,
    "resnet": _resnet, "convnext": _convnext, "mobilenetv2": _mobilenetv2,
    "whisper-encoder": _whisper_encoder,
}  # fmt: skip


def saved(arch: str, root: Path | None = None) -> Path:
    """A `save_pretrained` folder of the tiny `arch` (seed 0), made once in the corpus cache."""
    folder = (root or fetch.corpus_dir()) / "hf" / f"{arch}-v{HF_VERSION}"
    return save_once(folder, ARCHITECTURES[arch])


def save_once(folder: Path, make: Callable[[], tuple[Any, dict | None]]) -> Path:
    """`folder` as a `save_pretrained` folder of `make()`'s model (seed 0) and its
    preprocessor config, written once: built in a temporary folder, then renamed."""
    if (folder / "config.json").is_file():
        return folder
    import torch

    torch.manual_seed(0)
    model, preprocessor = make()
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.eval().save_pretrained(tmp)
    if preprocessor is not None:
        (tmp / "preprocessor_config.json").write_text(json.dumps(preprocessor))
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    return folder


# --------------------------------------------------------------------------- user exports

SEQUENCE = 16


def _inputs_of(arch: str, model) -> tuple[str, ...]:
    import inspect

    if arch == "whisper-encoder":
        return ("input_features",)
    if model.main_input_name == "pixel_values":
        return ("pixel_values",)
    params = inspect.signature(model.forward).parameters
    return tuple(n for n in ("input_ids", "attention_mask", "token_type_ids") if n in params)


def _samples(arch: str, model, names: tuple[str, ...], count: int) -> list[dict]:
    """Real-ish inputs: padded token sequences, scikit-image photographs, espeak-ng speech."""
    import numpy as np

    from tests.corpus import inputs

    rng = np.random.default_rng(7)
    out = []
    for k in range(count):
        if names == ("pixel_values",):
            size = int(getattr(model.config, "image_size", 224))
            img = inputs.crop(rng, inputs.photo(inputs.PHOTOS[k % len(inputs.PHOTOS)]),
                              (size, size))  # fmt: skip
            x = (img.astype(np.float32) / 255 - 0.5) / 0.5
            out.append({"pixel_values": x.transpose(2, 0, 1)[None].copy()})
        elif names == ("input_features",):
            from tests.corpus.models import _mel

            frames = 2 * model.config.max_source_positions
            wav = inputs.speech(inputs.SENTENCES[k % len(inputs.SENTENCES)])
            mel = np.log10(np.maximum(_mel(wav, model.config.num_mel_bins), 1e-10))
            mel = np.maximum(mel, mel.max() - 8.0)
            mel = (mel + 4.0) / 4.0  # Whisper's log-mel scaling
            mel = np.pad(mel, ((0, max(0, frames - len(mel))), (0, 0)))[:frames]
            out.append({"input_features": mel.T[None].astype(np.float32)})
        else:
            n = int(rng.integers(4, SEQUENCE - 1))
            ids = np.zeros(SEQUENCE, np.int64)
            ids[0], ids[1 : n + 1], ids[n + 1] = 1, 5 + rng.zipf(1.3, n) % 250, 2
            mask = (np.arange(SEQUENCE) <= n + 1).astype(np.int64)
            feed = {"input_ids": ids[None], "attention_mask": mask[None],
                    "token_type_ids": np.zeros((1, SEQUENCE), np.int64)}  # fmt: skip
            out.append({k2: feed[k2] for k2 in names})
    return out


def user_export(arch: str, root: Path | None = None) -> tuple[Path, Path, Path]:
    """The tiny model exported as a user would (`torch.onnx.export`, its default dynamo
    exporter, logits only), with calib.npz (16) and heldout.npz (8): made once."""
    import numpy as np

    folder = (root or fetch.corpus_dir()) / "hf" / f"{arch}-v{HF_VERSION}-export"
    paths = (folder / "model.onnx", folder / "calib.npz", folder / "heldout.npz")
    if all(p.is_file() for p in paths):
        return paths
    import torch
    from transformers import AutoConfig, AutoModelForAudioClassification
    from transformers import AutoModelForImageClassification as Img
    from transformers import AutoModelForSequenceClassification as Seq

    src = saved(arch, root)
    config = AutoConfig.from_pretrained(src)
    arch_name = config.architectures[0]
    cls = Img if "Image" in arch_name else AutoModelForAudioClassification if (
        "Audio" in arch_name) else Seq  # fmt: skip
    model = cls.from_pretrained(src, attn_implementation="eager").eval()
    names = _inputs_of(arch, model)
    samples = _samples(arch, model, names, 24)

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *args):
            return self.model(**dict(zip(names, args, strict=True))).logits

    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    example = tuple(torch.from_numpy(samples[0][n]) for n in names)
    with torch.no_grad():
        torch.onnx.export(
            Logits().eval(), example, str(tmp / "model.onnx"), input_names=list(names),
            output_names=["logits"], dynamo=True,
        )  # fmt: skip
    stack = lambda xs: {n: np.stack([s[n] for s in xs]) for n in names}  # noqa: E731
    np.savez(tmp / "calib.npz", **stack(samples[:16]))
    np.savez(tmp / "heldout.npz", **stack(samples[16:]))
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    return paths
