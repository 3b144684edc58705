"""Which model class a config names, what it takes in, and what comes out (auto exporter).

The task head is read from the model's class (`config.architectures`) and what that class
takes (`main_input_name`: `input_ids` text, `pixel_values` image, `input_features` /
`input_values` audio), never guessed from the config's other fields: a `*Model` whose class
takes pixels is image features, not text. The class itself is what gets built
(`T5EncoderModel`, not the `T5Model` AutoModel would build for a T5 config). Anything this
cannot place is refused by `init` in one line naming what is missing.
"""

from __future__ import annotations

import inspect
from typing import Any

from winml_recipes.sdk.errors import SourceError

# A class's main input -> the modality of the tasks it can serve
MODALITIES = {
    "input_ids": "text",
    "pixel_values": "image",
    "input_features": "audio",
    "input_values": "audio",
}
# sub-configs of a two-tower (text + vision) model; towers.py exports it in two graphs
TOWER_CONFIGS = ("text_config", "vision_config")


def named_class(config: Any, suffixes: tuple[str, ...] = ()) -> Any | None:
    """The transformers class the config's `architectures` names (the first that
    transformers ships and, when `suffixes` are given, ends with one of them), else None."""
    import transformers

    for arch in getattr(config, "architectures", None) or []:
        if not isinstance(arch, str) or (suffixes and not arch.endswith(suffixes)):
            continue
        cls = getattr(transformers, arch, None)
        if isinstance(cls, type) and hasattr(cls, "from_pretrained"):
            return cls
    return None


def model_class(config: Any, spec: Any) -> Any:
    """The class that builds a task (`spec`: an auto.Task) for `config`: the one the config
    names when it serves that task, else the task's Auto class mapping (no weights loaded)."""
    import transformers

    cls = named_class(config, spec.suffixes or ("Model",))
    if cls is not None and modality_of(cls) == spec.modality:
        return cls
    auto = getattr(transformers, spec.auto_class)
    try:
        return auto._model_mapping[type(config)]
    except (KeyError, AttributeError):
        return None


def modality_of(cls: Any) -> str | None:
    """text / image / audio from what the class takes (`main_input_name`)."""
    return MODALITIES.get(str(getattr(cls, "main_input_name", "")))


def sub_configs(config: Any) -> list[str]:
    """The names of the nested model configs (text_config, vision_config, encoder, ...)."""
    from transformers import PretrainedConfig

    return sorted(k for k, v in vars(config).items() if isinstance(v, PretrainedConfig))


def is_two_tower(config: Any) -> bool:
    """A text tower and a vision tower with a shared embedding space (CLIPModel, SiglipModel):
    both sub-configs, and a model class with get_text_features and get_image_features."""
    if not all(hasattr(getattr(config, k, None), "model_type") for k in TOWER_CONFIGS):
        return False
    cls = named_class(config)
    return cls is not None and all(
        callable(getattr(cls, f, None)) for f in ("get_text_features", "get_image_features")
    )


def head_task(config: Any, task: str, modality: str) -> str:
    """`task` (from the architecture's name; its inputs are `modality`) checked against the
    class's input: a text task for a class that takes pixels becomes image features where
    the name says only `Model`, anything else that does not fit is refused naming the class
    and what it takes."""
    archs = list(getattr(config, "architectures", None) or [])
    cls = named_class(config)
    if cls is None:
        return task
    takes = modality_of(cls)
    if takes == modality:
        return task
    if task == "feature-extraction" and takes == "image":
        if not (getattr(config, "hidden_size", 0) and getattr(config, "patch_size", 0)):
            raise SourceError(
                f"architecture {archs[0]} is an image backbone without hidden_size and "
                "patch_size; image-feature-extraction here is for ViT-style backbones "
                "(tokens of hidden_size): use its *ForImageClassification head instead"
            )
        return "image-feature-extraction"
    main = getattr(cls, "main_input_name", "?")
    raise SourceError(
        f"architecture {archs[0]} takes {main} ({takes or 'an input this tool does not feed'}), "
        f"not the {modality} inputs of {task}; init cannot serve it"
    )


def refuse_nested(config: Any) -> None:
    """A config made of sub-models that is not a two-tower model: one line naming them."""
    subs = sub_configs(config)
    if len(subs) < 2 or is_two_tower(config):
        return
    archs = list(getattr(config, "architectures", None) or [config.model_type])
    raise SourceError(
        f"architecture {archs[0]} is made of {len(subs)} sub-models ({', '.join(subs)}); init "
        "serves one graph per model, or text_config + vision_config two-tower models "
        "(CLIPModel, SiglipModel): export each part as its own graph"
    )


def text_inputs(cls_or_model: Any, config: Any) -> tuple[str, ...]:
    """The text inputs a graph takes: input_ids, attention_mask and token_type_ids, each only
    where the forward takes it; token_type_ids also only where the config has token types
    (`type_vocab_size` 0, DeBERTa v3, has none: the embedding ignores them)."""
    params = set(inspect.signature(cls_or_model.forward).parameters)
    names = [n for n in ("input_ids", "attention_mask") if n in params]
    if "token_type_ids" in params and getattr(config, "type_vocab_size", 1) != 0:
        names.append("token_type_ids")
    return tuple(names)


def outputs_of(config: Any, outputs: tuple[str, ...]) -> tuple[str, ...]:
    """A task's outputs this model has: no pooler_output where the model has no pooling
    head (SigLIP's `vision_use_head` false)."""
    if getattr(config, "vision_use_head", True) is False:
        outputs = tuple(o for o in outputs if o != "pooler_output")
    return outputs


def pretrained_config(model_id: str, revision: str | None, where: str) -> Any:
    """A pretrained model's config (its folder checked as for its weights, no code run)."""
    from transformers import AutoConfig

    from winml_recipes.exporters import load_pretrained

    class _Held:  # load_pretrained's checks and errors, for the config alone
        def __init__(self, config: Any) -> None:
            self.config = config

        @classmethod
        def from_pretrained(cls, source: str, **kwargs: Any) -> _Held:
            return cls(AutoConfig.from_pretrained(source, **kwargs))

        def float(self) -> _Held:
            return self

        def eval(self) -> _Held:
            return self

    return load_pretrained(_Held, model_id, revision, where).config


def export_cause(exc: BaseException) -> str:
    """The innermost cause of an export failure (torch.onnx wraps the model's own error in
    a TorchExportError whose message only says which step failed)."""
    seen = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    inner = seen[-1]
    text = " ".join(str(inner).split()) or type(inner).__name__
    return f"{type(inner).__name__}: {text[:300]}"
