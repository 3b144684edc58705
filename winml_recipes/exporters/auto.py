"""Generic transformers models through the Auto classes.

- `feature-extraction`: `AutoModel`; inputs `input_ids`, `attention_mask` and `token_type_ids`
  (each only when the model's forward takes it), i64 [batch,sequence] -> `last_hidden_state`.
- `image-classification`: `AutoModelForImageClassification`; `pixel_values` f32
  [batch,C,S,S] (S and C from the config) -> `logits` [batch,num_labels].
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from winml_recipes.errors import SourceError

if TYPE_CHECKING:
    from winml_recipes.exporters import ExportOutput, ExportRequest

COMPONENTS = ("model",)

# task -> (transformers Auto class name, output name)
TASKS: dict[str, tuple[str, str]] = {
    "feature-extraction": ("AutoModel", "last_hidden_state"),
    "image-classification": ("AutoModelForImageClassification", "logits"),
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
    auto_cls = getattr(transformers, TASKS[req.task][0])
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


def _output_module(model: Any, output: str, input_names: tuple[str, ...]) -> Any:
    import torch

    class NamedOutput(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
            result = self.inner(**dict(zip(input_names, inputs, strict=False)), return_dict=True)
            return result[output]

    return NamedOutput(model)


def _forward_params(model: Any) -> set[str]:
    return set(inspect.signature(model.forward).parameters)


def export(req: ExportRequest) -> ExportOutput:
    import torch

    from winml_recipes.exporters import torch_export

    model = load_model(req)
    assert req.task is not None
    output = TASKS[req.task][1]
    gen = torch.Generator().manual_seed(0)
    b = _TRACE_BATCH
    if req.task == "feature-extraction":
        params = _forward_params(model)
        names = tuple(n for n in TEXT_INPUTS if n in params)
        if "input_ids" not in names:
            raise SourceError(
                f"{type(model).__name__} takes no input_ids; feature-extraction here is for "
                "text encoders (BERT-like)",
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
        _output_module(model, output, names),
        args,
        input_names=names,
        output_names=(output,),
        dynamic_shapes=(tuple(dims for _ in names),),
        opset=req.opset,
    )


def task_of(config: Any) -> str:
    """The task a config's architectures point to (image classification, else features)."""
    archs = getattr(config, "architectures", None) or []
    if any(a.endswith("ForImageClassification") for a in archs):
        return "image-classification"
    if not archs and getattr(config, "image_size", None) and not getattr(config, "vocab_size", 0):
        return "image-classification"
    return "feature-extraction"


def catalog_components(config: Any, task: str) -> dict[str, dict[str, Any]]:
    """The `model` component's I/O contract for a config, without weights."""
    if task == "image-classification":
        size = getattr(config, "image_size", 224)
        h, w = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
        channels = int(getattr(config, "num_channels", 3))
        return {
            "model": {
                "task": task,
                "dims": {"batch": 1},
                "inputs": {
                    "pixel_values": {
                        "dtype": "float32",
                        "shape": ["batch", channels, h, w],
                        "range": [-1.0, 1.0],
                    }
                },
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
    return {
        "model": {
            "task": task,
            "dims": {"batch": 1, "sequence": 16},
            "inputs": inputs,
            "outputs": {
                "last_hidden_state": {"dtype": "float32", "shape": ["batch", "sequence", hidden]}
            },
        }
    }
