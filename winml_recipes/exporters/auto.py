"""Generic transformers models through the Auto classes, keeping the task head.

The task comes from the config's `architectures` (`BertForSequenceClassification` ->
text-classification, `GPT2LMHeadModel` -> text-generation, ...) and selects the Auto class
that builds exactly that architecture; an architecture whose task this exporter cannot
export is an error naming it and the tasks it can, never a silent fallback to the base
model. Text tasks take `input_ids`, `attention_mask` and `token_type_ids` (each only when
the model's forward takes it), i64 [batch, sequence]; image tasks take `pixel_values` f32
[batch, C, S, S]; audio tasks take Whisper-style log-mel `input_features` f32 [batch, n_mels,
frames] (the config's `num_mel_bins`; frames fixed, the encoder takes no other length), and
an encoder-decoder audio model (WhisperModel, WhisperForConditionalGeneration) exports its
encoder alone (`audio-feature-extraction`: `last_hidden_state`). Decoder-only language models
are exported without a KV cache (`use_cache=False`): one forward over the whole sequence,
logits for every position.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from winml_recipes.exporters import ExporterFamily, heads, speech_heads, vision
from winml_recipes.exporters.fields import MAX_CHANNELS, MAX_COUNT, MAX_SIDE, _numbers, _whole
from winml_recipes.modelfolder import TRUST_REMOTE_CODE
from winml_recipes.sdk.errors import SourceError

if TYPE_CHECKING:
    from winml_recipes.exporters import ExportOutput, ExportRequest

COMPONENTS = ("model",)


@dataclass(frozen=True)
class Task:
    auto_class: str  # transformers Auto class
    outputs: tuple[str, ...]  # output names, in order
    modality: str  # "text" | "image" | "audio"
    suffixes: tuple[str, ...] = ()  # architecture name endings that mean this task


TASKS: dict[str, Task] = {
    "feature-extraction": Task("AutoModel", ("last_hidden_state",), "text", ("Model",)),
    "text-classification": Task(
        "AutoModelForSequenceClassification", ("logits",), "text", ("ForSequenceClassification",)
    ),
    "token-classification": Task(
        "AutoModelForTokenClassification", ("logits",), "text", ("ForTokenClassification",)
    ),
    "fill-mask": Task("AutoModelForMaskedLM", ("logits",), "text", ("ForMaskedLM",)),
    "text-generation": Task(
        "AutoModelForCausalLM", ("logits",), "text", ("ForCausalLM", "LMHeadModel")
    ),
    "image-classification": Task(
        "AutoModelForImageClassification", ("logits",), "image", ("ForImageClassification",)
    ),
    "audio-classification": Task(
        "AutoModelForAudioClassification", ("logits",), "audio", ("ForAudioClassification",)
    ),
    # the encoder of an encoder-decoder audio model (task_of picks it for audio configs)
    "audio-feature-extraction": Task("AutoModel", ("last_hidden_state",), "audio"),
    # dense-prediction vision heads; exporters/vision.py sizes their inputs and outputs
    "depth-estimation": Task(
        "AutoModelForDepthEstimation", ("predicted_depth",), "image", ("ForDepthEstimation",)
    ),
    "semantic-segmentation": Task(
        "AutoModelForSemanticSegmentation", ("logits",), "image", ("ForSemanticSegmentation",)
    ),
    "object-detection": Task(
        "AutoModelForObjectDetection", ("logits", "pred_boxes"), "image", ("ForObjectDetection",)
    ),
    "image-to-image": Task(
        "AutoModelForImageToImage", ("reconstruction",), "image", ("ForImageSuperResolution",)
    ),
    # CTC speech recognizers taking a waveform (speech_heads.py picks it by the model class)
    "automatic-speech-recognition": Task("AutoModelForCTC", ("logits",), "audio"),
    # text, two-tower and image-embedding families (heads.py picks the class and inputs)
    "question-answering": Task(
        "AutoModelForQuestionAnswering",
        ("start_logits", "end_logits"),
        "text",
        ("ForQuestionAnswering",),
    ),
    # a *Model whose class takes pixel_values (DINOv2, SigLIP / CLIP vision towers)
    "image-feature-extraction": Task("AutoModel", ("last_hidden_state", "pooler_output"), "image"),
    "image-embedding": Task(
        "AutoModel", ("image_embeds",), "image", ("VisionModelWithProjection",)
    ),
    "text-embedding": Task("AutoModel", ("text_embeds",), "text", ("TextModelWithProjection",)),
}

TEXT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")

# Example sizes for tracing: batch 2 keeps batch dynamic (FACTS.md); sequence 7 differs
# from every other example dim.
_TRACE_BATCH = 2
_TRACE_SEQUENCE = 7


def _where(req: ExportRequest) -> str:
    return f"auto/{req.component}"


def load_model(req: ExportRequest) -> Any:
    """The eval-mode fp32 transformers model for `req` (pretrained or random weights)."""
    import transformers

    from winml_recipes.exporters import build_config, build_random, load_pretrained

    where = _where(req)
    if req.task not in TASKS:
        raise SourceError(
            f"auto exporter needs task set to one of {', '.join(TASKS)} (got {req.task!r})",
            where=where,
        )
    auto_cls = getattr(transformers, TASKS[req.task].auto_class)
    if req.model_id is not None:
        # the class the config names where it serves the task (T5EncoderModel, not T5Model)
        config = heads.pretrained_config(req.model_id, req.revision, where)
        named = heads.model_class(config, TASKS[req.task])
        return load_pretrained(named or auto_cls, req.model_id, req.revision, where)
    assert req.config is not None
    config = build_config(req.config, None, where)
    named = heads.model_class(config, TASKS[req.task])
    try:
        if named is not None:
            return build_random(lambda: named._from_config(config), req.seed)
        return build_random(
            lambda: auto_cls.from_config(config, trust_remote_code=TRUST_REMOTE_CODE), req.seed
        )
    except ValueError as exc:
        raise SourceError(
            f"model_type '{config.model_type}' has no {auto_cls.__name__} for task "
            f"'{req.task}'; pick a model_type that supports it",
            where=where,
        ) from exc


def _output_module(model: Any, outputs: tuple[str, ...], input_names: tuple[str, ...]) -> Any:
    import torch

    extra = {"use_cache": False} if "use_cache" in _forward_params(model) else {}

    class NamedOutputs(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *inputs: torch.Tensor) -> Any:
            kwargs = dict(zip(input_names, inputs, strict=False))
            result = self.inner(**kwargs, **extra, return_dict=True)
            values = tuple(result[o] for o in outputs)
            return values[0] if len(values) == 1 else values

    return NamedOutputs(model)


def _forward_params(model: Any) -> set[str]:
    return set(inspect.signature(model.forward).parameters)


def export(req: ExportRequest) -> ExportOutput:
    import torch

    from winml_recipes.exporters import torch_export

    model = load_model(req)
    assert req.task is not None
    task = TASKS[req.task]
    gen = torch.Generator().manual_seed(0)
    b = _TRACE_BATCH
    outputs = heads.outputs_of(model.config, task.outputs)
    if task.modality == "text":
        names = heads.text_inputs(model, model.config)
        if "input_ids" not in names:
            raise SourceError(
                f"{type(model).__name__} takes no input_ids; {req.task} here is for text models",
                where=_where(req),
            )
        s = _TRACE_SEQUENCE
        vocab = int(getattr(model.config, "vocab_size", 100))
        type_vocab = max(int(getattr(model.config, "type_vocab_size", 1) or 1), 1)
        examples = {
            "input_ids": torch.randint(0, vocab, (b, s), generator=gen),
            # one padded position in the second row so no all-ones shortcut gets traced
            "attention_mask": torch.tensor([[1] * s, [1] * (s - 2) + [0] * 2]),
            "token_type_ids": torch.randint(0, type_vocab, (b, s), generator=gen),
        }
        args = tuple(examples[n] for n in names)
        dims: dict[int, str] = {0: "batch", 1: "sequence"}
    elif task.modality == "audio" and speech_heads.takes_input_values(model.config):
        names, args, dims = speech_heads.example_inputs(model.config, b, gen)
    elif task.modality == "audio":
        mels, frames = audio_shape(model.config, where=_where(req))
        names = ("input_features",)
        # log-mel features after Whisper's scaling sit in about [-1, 1.5]
        args = (torch.rand(b, mels, frames, generator=gen) * 2.5 - 1,)
        dims = {0: "batch"}
        if req.task == "audio-feature-extraction":
            model = _audio_encoder(model, req)
    else:
        channels = int(getattr(model.config, "num_channels", 3))
        size = getattr(model.config, "image_size", 224)
        h, w = (size, size) if isinstance(size, int) else tuple(size)
        if req.task in vision.TASKS:
            h, w = vision.trace_size(model, req.model_id, req.revision)
        names = ("pixel_values",)
        args = (torch.rand(b, channels, h, w, generator=gen) * 2 - 1,)
        dims = {0: "batch"}
    return torch_export(
        _output_module(model, outputs, names),
        args,
        input_names=names,
        output_names=outputs,
        dynamic_shapes=(tuple(dims for _ in names),),
        opset=req.opset,
    )


def _audio_encoder(model: Any, req: ExportRequest) -> Any:
    """The encoder of an encoder-decoder audio model (the decoder needs token ids and the
    encoder's states: a second model, not exported here); an encoder-only model itself."""
    if not getattr(model.config, "is_encoder_decoder", False):
        return model
    get = getattr(model, "get_encoder", None)
    encoder = get() if callable(get) else None
    if encoder is None:
        raise SourceError(
            f"{type(model).__name__} has no get_encoder(); audio-feature-extraction exports "
            "the encoder of an encoder-decoder audio model",
            where=_where(req),
        )
    return encoder


def is_audio(config: Any) -> bool:
    """A Whisper-style audio config: log-mel features in (`num_mel_bins`)."""
    return bool(getattr(config, "num_mel_bins", 0))


def audio_shape(
    config: Any, feature_extractor: Mapping[str, Any] | None = None, where: str | None = None
) -> tuple[int, int]:
    """(n_mels, frames) of a Whisper-style encoder's `input_features`: the config's
    `num_mel_bins`, and `2 * max_source_positions` frames (two convolutions, the second with
    stride 2; the encoder refuses any other length), else the feature extractor's
    `nb_max_frames`. The feature extractor (`preprocessor_config.json`) must agree."""
    mels = int(getattr(config, "num_mel_bins", 0) or 0)
    positions = int(getattr(config, "max_source_positions", 0) or 0)
    fe = dict(feature_extractor or {})
    frames = 2 * positions if positions else int(fe.get("nb_max_frames") or 0)
    if mels < 1 or frames < 1:
        raise SourceError(
            "audio config needs num_mel_bins and max_source_positions (or a feature extractor "
            "with nb_max_frames) to size input_features",
            where=where,
        )
    for key, want in (("feature_size", mels), ("nb_max_frames", frames)):
        got = fe.get(key)
        if isinstance(got, int) and got != want:
            raise SourceError(
                f"preprocessor_config.json says {key} {got} but the model takes {want} "
                f"(input_features [batch, {mels}, {frames}]); fix one of the two",
                where=where,
            )
    return mels, frames


def audio_description(feature_extractor: Mapping[str, Any] | None) -> str:
    """One line saying how audio becomes `input_features` (from the feature extractor)."""
    fe = dict(feature_extractor or {})
    parts = [
        f"{k} {fe[k]}"
        for k in ("sampling_rate", "n_fft", "hop_length", "chunk_length")
        if isinstance(fe.get(k), int | float)
    ]
    where = f" ({', '.join(parts)})" if parts else ""
    return (
        f"log-mel spectrogram{where}: log10, floored 8 below its max, (x + 4) / 4, as "
        "WhisperFeatureExtractor computes it"
    )


def task_of(config: Any) -> str:
    """The task the config's architectures name; an error for one this exporter cannot do.

    Without `architectures`: image features for image configs, else text features.
    """
    archs = list(getattr(config, "architectures", None) or [])
    if speech_heads.takes_input_values(config):
        return speech_heads.task_of(config)
    if is_audio(config):
        return _audio_task_of(archs)
    heads.refuse_nested(config)
    for arch in archs:
        # longest suffix first: "BertForMaskedLM" must not match "Model"
        for suffix, task in sorted(_SUFFIXES.items(), key=lambda kv: -len(kv[0])):
            if arch.endswith(suffix):
                return heads.head_task(config, task, TASKS[task].modality)
    if archs:
        raise SourceError(
            f"architecture {archs[0]} is not a task the auto exporter can export; it exports "
            + ", ".join(f"{t} ({', '.join('*' + x for x in TASKS[t].suffixes)})" for t in TASKS)
        )
    if getattr(config, "image_size", None) and not getattr(config, "vocab_size", 0):
        return "image-classification"
    return "feature-extraction"


_SUFFIXES = {suffix: name for name, task in TASKS.items() for suffix in task.suffixes}


def _audio_task_of(archs: list[str]) -> str:
    """Audio configs: a classifier keeps its head; the base model or a sequence-to-sequence
    model (WhisperModel, WhisperForConditionalGeneration) exports its encoder."""
    for arch in archs:
        if arch.endswith("ForAudioClassification"):
            return "audio-classification"
        if arch.endswith(("Model", "ForConditionalGeneration")):
            return "audio-feature-extraction"
    if archs:
        raise SourceError(
            f"architecture {archs[0]} is not an audio task the auto exporter can export; it "
            "exports audio-classification (*ForAudioClassification) and the encoder of "
            "audio-feature-extraction (*Model, *ForConditionalGeneration)"
        )
    return "audio-feature-extraction"


def image_block(
    preprocessor: Mapping[str, Any] | None,
    channels: int,
    source: Path | str = "preprocessor_config.json",
) -> dict[str, Any] | None:
    """The catalog's `image:` block from an HF `preprocessor_config.json` (size, mean, std).

    Sizes come as {"height", "width"}, {"shortest_edge"} (a square crop of that side), an int
    or [height, width]; None when the file gives no size. Every value is checked: a one-line
    error names `source` and the field (a zero std, a size 'abc', a dict as mean, ...).
    """
    if not preprocessor:
        return None
    where = str(source)
    key = "crop_size" if preprocessor.get("crop_size") else "size"
    size = preprocessor.get(key)
    if isinstance(size, Mapping):
        if "height" in size and "width" in size:
            hw: list[int] | int = [
                _whole(size["height"], f"{key}.height", where, MAX_SIDE),
                _whole(size["width"], f"{key}.width", where, MAX_SIDE),
            ]
        elif "shortest_edge" in size:
            hw = _whole(size["shortest_edge"], f"{key}.shortest_edge", where, MAX_SIDE)
        else:
            return None
    elif isinstance(size, list) and len(size) == 2:
        hw = [_whole(v, f"{key}[{i}]", where, MAX_SIDE) for i, v in enumerate(size)]
    elif size is None:
        return None
    else:
        hw = _whole(size, key, where, MAX_SIDE)
    mean = _numbers(preprocessor.get("image_mean", 0.0), "image_mean", where, channels, False)
    std = _numbers(preprocessor.get("image_std", 1.0), "image_std", where, channels, True)
    return {"size": hw, "mean": mean, "std": std, "layout": "NCHW"}


def catalog_components(
    config: Any,
    task: str,
    preprocessor: Mapping[str, Any] | None = None,
    *,
    config_path: Path | str = "config.json",
    source: Path | str = "preprocessor_config.json",
    vocab: Mapping[str, Any] | None = None,
) -> dict[str, dict[str, Any]]:
    """The `model` component's I/O contract for a config (and the image preprocessing or
    audio features of its `preprocessor_config.json`, when given), without weights. Numbers
    from the config are checked (a negative channel count is an error naming `config_path`)."""
    where = str(config_path)

    def field(name: str, default: Any, maximum: int = MAX_COUNT) -> int:
        return _whole(getattr(config, name, default), name, where, maximum)

    if TASKS[task].modality == "audio" and speech_heads.takes_input_values(config):
        return {"model": speech_heads.component(config, task, preprocessor, where, _whole, vocab)}
    if TASKS[task].modality == "audio":
        return {"model": _audio_component(config, task, preprocessor, where)}
    if task in vision.TASKS:
        return {"model": vision.component(config, task, preprocessor, where, str(source))}
    if TASKS[task].modality == "image":
        channels = field("num_channels", 3, MAX_CHANNELS)
        pixel: dict[str, Any] = {"dtype": "float32", "range": [-1.0, 1.0]}
        image = image_block(preprocessor, channels, source)
        # The graph is traced at the config's image_size (ViT position embeddings are
        # sized by it); the processor's size is used when the config has none.
        size = getattr(config, "image_size", None) or (image or {}).get("size") or 224
        if isinstance(size, list | tuple) and len(size) == 2:
            h, w = (_whole(v, f"image_size[{i}]", where, MAX_SIDE) for i, v in enumerate(size))
        else:
            h = w = _whole(size, "image_size", where, MAX_SIDE)
        if image is not None:
            image["size"] = size if isinstance(size, int) else [h, w]
            lows = [(0.0 - m) / s for m, s in zip(image["mean"], image["std"], strict=False)]
            highs = [(1.0 - m) / s for m, s in zip(image["mean"], image["std"], strict=False)]
            pixel["range"] = [round(min(lows), 6), round(max(highs), 6)]
            pixel["image"] = image
        image_shapes = {
            "logits": lambda: ["batch", field("num_labels", 2)],
            # tokens: patches (+ a class token, + registers), as the model lays them out
            "last_hidden_state": lambda: ["batch", "tokens", _hidden(config, where)],
            "pooler_output": lambda: ["batch", _hidden(config, where)],
            "image_embeds": lambda: ["batch", field("projection_dim", 0)],
        }
        return {
            "model": {
                "task": task,
                "dims": {"batch": 1},
                "inputs": {"pixel_values": {**pixel, "shape": ["batch", channels, h, w]}},
                "outputs": {
                    o: {"dtype": "float32", "shape": image_shapes[o]()}
                    for o in heads.outputs_of(config, TASKS[task].outputs)
                },
            }
        }
    vocab_range = field("vocab_size", 100)
    inputs: dict[str, Any] = {
        "input_ids": {"dtype": "int64", "shape": ["batch", "sequence"], "range": [0, vocab_range]},
        "attention_mask": {"dtype": "int64", "shape": ["batch", "sequence"], "values": [1]},
        "token_type_ids": {"dtype": "int64", "shape": ["batch", "sequence"], "values": [0]},
    }
    # the inputs the exported graph takes: the same rule as the exporter's (heads.text_inputs)
    cls = heads.model_class(config, TASKS[task])
    if cls is not None:
        names = heads.text_inputs(cls, config)
    else:
        names = ("input_ids", "attention_mask")
        names += ("token_type_ids",) if getattr(config, "type_vocab_size", 0) else ()
    inputs = {n: inputs[n] for n in names}
    shapes = {
        "feature-extraction": lambda: ["batch", "sequence", _hidden(config, where)],
        "text-classification": lambda: ["batch", field("num_labels", 2)],
        "token-classification": lambda: ["batch", "sequence", field("num_labels", 2)],
        "fill-mask": lambda: ["batch", "sequence", field("vocab_size", 0)],
        "text-generation": lambda: ["batch", "sequence", field("vocab_size", 0)],
        "question-answering": lambda: ["batch", "sequence"],
        "text-embedding": lambda: ["batch", field("projection_dim", 0)],
    }
    return {
        "model": {
            "task": task,
            "dims": {"batch": 1, "sequence": 16},
            "inputs": inputs,
            "outputs": {
                o: {"dtype": "float32", "shape": shapes[task]()} for o in TASKS[task].outputs
            },
        }
    }


def _hidden(config: Any, where: str) -> int:
    name = "hidden_size" if getattr(config, "hidden_size", 0) else "d_model"
    return _whole(getattr(config, name, 0), name, where, MAX_COUNT)


def _audio_component(
    config: Any, task: str, preprocessor: Mapping[str, Any] | None, where: str
) -> dict[str, Any]:
    mels, frames = audio_shape(config, preprocessor, where="init")
    if task == "audio-classification":
        output = ["batch", _whole(getattr(config, "num_labels", 2), "num_labels", where, MAX_COUNT)]
    else:  # the encoder's states: one per position after the stride-2 convolution
        output = ["batch", frames // 2, _hidden(config, where)]
    return {
        "task": task,
        "dims": {"batch": 1},
        "inputs": {
            "input_features": {
                "dtype": "float32",
                "shape": ["batch", mels, frames],
                # Whisper's scaling puts speech in about [-1, 1.5] (max/4 + 1 at the top)
                "range": [-1.5, 1.5],
                "description": audio_description(preprocessor),
                **_whisper_audio(preprocessor),
            }
        },
        "outputs": {TASKS[task].outputs[0]: {"dtype": "float32", "shape": output}},
    }


def _whisper_audio(preprocessor: Mapping[str, Any] | None) -> dict[str, Any]:
    """The `audio:` block (the bundled speech through WhisperFeatureExtractor) when the
    folder ships the feature extractor's preprocessor_config.json, else nothing."""
    fe = dict(preprocessor or {})
    if fe.get("feature_extractor_type", "WhisperFeatureExtractor") != "WhisperFeatureExtractor":
        return {}
    if not fe:
        return {}
    options = {k: v for k, v in fe.items() if isinstance(v, bool | int | float | str)}
    rate = int(fe.get("sampling_rate") or 16000)
    block = {"feature_extractor": "WhisperFeatureExtractor", "sampling_rate": rate}
    return {"audio": {**block, "options": options}}


# Every catalog component of an auto entry is the one exported model.
FAMILY = ExporterFamily("auto", COMPONENTS, export, component="model")
