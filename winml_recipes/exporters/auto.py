"""Generic transformers models through the Auto classes, keeping the task head.

The task comes from the config's `architectures` (`BertForSequenceClassification` ->
text-classification, `GPT2LMHeadModel` -> text-generation, ...) and selects the Auto class
that builds exactly that architecture; an architecture whose task this exporter cannot
export is an error naming it and the tasks it can, never a silent fallback to the base
model. Text tasks take `input_ids`, `attention_mask` and `token_type_ids` (each only when
the model's forward takes it), i64 [batch, sequence]; image tasks take `pixel_values` f32
[batch, C, S, S]. Decoder-only language models are exported without a KV cache
(`use_cache=False`): one forward over the whole sequence, logits for every position.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from winml_recipes.exporters import ExporterFamily
from winml_recipes.sdk.errors import SourceError

if TYPE_CHECKING:
    from winml_recipes.exporters import ExportOutput, ExportRequest

COMPONENTS = ("model",)


@dataclass(frozen=True)
class Task:
    auto_class: str  # transformers Auto class
    outputs: tuple[str, ...]  # output names, in order
    modality: str  # "text" | "image"
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
        return load_pretrained(auto_cls, req.model_id, req.revision, where)
    assert req.config is not None
    config = build_config(req.config, None, where)
    try:
        return build_random(lambda: auto_cls.from_config(config), req.seed)
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
    if task.modality == "text":
        params = _forward_params(model)
        names = tuple(n for n in TEXT_INPUTS if n in params)
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
    else:
        channels = int(getattr(model.config, "num_channels", 3))
        size = getattr(model.config, "image_size", 224)
        h, w = (size, size) if isinstance(size, int) else tuple(size)
        names = ("pixel_values",)
        args = (torch.rand(b, channels, h, w, generator=gen) * 2 - 1,)
        dims = {0: "batch"}
    return torch_export(
        _output_module(model, task.outputs, names),
        args,
        input_names=names,
        output_names=task.outputs,
        dynamic_shapes=(tuple(dims for _ in names),),
        opset=req.opset,
    )


def task_of(config: Any) -> str:
    """The task the config's architectures name; an error for one this exporter cannot do.

    Without `architectures`: image features for image configs, else text features.
    """
    archs = list(getattr(config, "architectures", None) or [])
    for arch in archs:
        # longest suffix first: "BertForMaskedLM" must not match "Model"
        for suffix, task in sorted(_SUFFIXES.items(), key=lambda kv: -len(kv[0])):
            if arch.endswith(suffix):
                return task
    if archs:
        raise SourceError(
            f"architecture {archs[0]} is not a task the auto exporter can export; it exports "
            + ", ".join(f"{t} ({', '.join('*' + x for x in TASKS[t].suffixes)})" for t in TASKS)
        )
    if getattr(config, "image_size", None) and not getattr(config, "vocab_size", 0):
        return "image-classification"
    return "feature-extraction"


_SUFFIXES = {suffix: name for name, task in TASKS.items() for suffix in task.suffixes}


def image_block(preprocessor: Mapping[str, Any] | None, channels: int) -> dict[str, Any] | None:
    """The catalog's `image:` block from an HF `preprocessor_config.json` (size, mean, std).

    Sizes come as {"height", "width"}, {"shortest_edge"} (a square crop of that side) or an
    int; None when the file says nothing usable.
    """
    if not preprocessor:
        return None
    size = preprocessor.get("crop_size") or preprocessor.get("size")
    if isinstance(size, Mapping):
        if "height" in size and "width" in size:
            hw: list[int] | int = [int(size["height"]), int(size["width"])]
        elif "shortest_edge" in size:
            hw = int(size["shortest_edge"])
        else:
            return None
    elif isinstance(size, int):
        hw = size
    else:
        return None
    mean = [float(v) for v in preprocessor.get("image_mean", [0.0] * channels)]
    std = [float(v) for v in preprocessor.get("image_std", [1.0] * channels)]
    return {"size": hw, "mean": mean, "std": std, "layout": "NCHW"}


def catalog_components(
    config: Any, task: str, preprocessor: Mapping[str, Any] | None = None
) -> dict[str, dict[str, Any]]:
    """The `model` component's I/O contract for a config (and the image preprocessing of
    its `preprocessor_config.json`, when given), without weights."""
    if TASKS[task].modality == "image":
        channels = int(getattr(config, "num_channels", 3))
        pixel: dict[str, Any] = {"dtype": "float32", "range": [-1.0, 1.0]}
        image = image_block(preprocessor, channels)
        # The graph is traced at the config's image_size (ViT position embeddings are
        # sized by it); the processor's size is used when the config has none.
        size = getattr(config, "image_size", None) or (image or {}).get("size") or 224
        h, w = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
        if image is not None:
            image["size"] = size if isinstance(size, int) else [h, w]
            lows = [(0.0 - m) / s for m, s in zip(image["mean"], image["std"], strict=False)]
            highs = [(1.0 - m) / s for m, s in zip(image["mean"], image["std"], strict=False)]
            pixel["range"] = [round(min(lows), 6), round(max(highs), 6)]
            pixel["image"] = image
        return {
            "model": {
                "task": task,
                "dims": {"batch": 1},
                "inputs": {"pixel_values": {**pixel, "shape": ["batch", channels, h, w]}},
                "outputs": {
                    "logits": {"dtype": "float32", "shape": ["batch", int(config.num_labels)]}
                },
            }
        }
    inputs: dict[str, Any] = {
        "input_ids": {
            "dtype": "int64",
            "shape": ["batch", "sequence"],
            "range": [0, int(getattr(config, "vocab_size", 100))],
        },
        "attention_mask": {"dtype": "int64", "shape": ["batch", "sequence"], "values": [1]},
    }
    if getattr(config, "type_vocab_size", 0):
        inputs["token_type_ids"] = {"dtype": "int64", "shape": ["batch", "sequence"], "values": [0]}
    hidden = int(getattr(config, "hidden_size", 0) or getattr(config, "d_model", 0))
    labels = int(getattr(config, "num_labels", 2))
    vocab = int(getattr(config, "vocab_size", 0))
    shapes = {
        "feature-extraction": ["batch", "sequence", hidden],
        "text-classification": ["batch", labels],
        "token-classification": ["batch", "sequence", labels],
        "fill-mask": ["batch", "sequence", vocab],
        "text-generation": ["batch", "sequence", vocab],
    }
    (output,) = TASKS[task].outputs
    return {
        "model": {
            "task": task,
            "dims": {"batch": 1, "sequence": 16},
            "inputs": inputs,
            "outputs": {output: {"dtype": "float32", "shape": shapes[task]}},
        }
    }


# Every catalog component of an auto entry is the one exported model.
FAMILY = ExporterFamily("auto", COMPONENTS, export, component="model")
