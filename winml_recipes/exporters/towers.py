"""Two-tower (contrastive text + image) models as two graphs: CLIPModel, SiglipModel.

Zero-shot image classification runs the text tower once per label prompt and the vision
tower once per image, then compares their embeddings; on a device they are two graphs,
like SAM 3's encoder and decoder. `text_model`: `input_ids` (+ `attention_mask` for CLIP;
SigLIP's tokenizer gives ids only, padded to the model's length) -> `text_embeds`;
`vision_model`: `pixel_values` -> `image_embeds` (each the model's own
get_text_features / get_image_features: the projected, not yet normalized, embedding).
The nested `text_config` / `vision_config` give each tower's sizes.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from winml_recipes.exporters import ExporterFamily
from winml_recipes.sdk.errors import SourceError

if TYPE_CHECKING:
    from winml_recipes.exporters import ExportOutput, ExportRequest

COMPONENTS = ("text_model", "vision_model")
TASK = "zero-shot-image-classification"
MODEL_TYPES = ("clip", "siglip")  # get_image_features(pixel_values) and ids-only text
IDS_ONLY = ("siglip",)  # text towers whose tokenizer gives no attention_mask
_TRACE_BATCH = 2
_TRACE_SEQUENCE = 7


def check(config: Any, where: str = "init") -> None:
    """A two-tower config this exporter serves, else one line naming what is missing."""
    if config.model_type not in MODEL_TYPES:
        raise SourceError(
            f"two-tower model_type '{config.model_type}' is not one init exports (it serves "
            f"{', '.join(MODEL_TYPES)}: text tower on input_ids, vision tower on pixel_values)",
            where=where,
        )
    for key in ("text_config", "vision_config"):
        if not hasattr(getattr(config, key, None), "model_type"):
            raise SourceError(f"config.json has no {key}; a two-tower model needs it", where=where)


def _text_inputs(config: Any) -> tuple[str, ...]:
    return ("input_ids",) if config.model_type in IDS_ONLY else ("input_ids", "attention_mask")


def _image_size(vision: Any, where: str) -> tuple[int, int, int]:
    from winml_recipes.exporters.auto import MAX_CHANNELS, MAX_SIDE, _whole

    size = getattr(vision, "image_size", None)
    channels = _whole(getattr(vision, "num_channels", 3), "num_channels", where, MAX_CHANNELS)
    side = _whole(size, "vision_config.image_size", where, MAX_SIDE)
    return channels, side, side


def load_model(req: ExportRequest) -> Any:
    """The eval-mode fp32 two-tower model (pretrained or random weights)."""
    import transformers

    from winml_recipes.exporters import build_config, build_random, load_pretrained

    where = f"two_tower/{req.component}"
    if req.model_id is not None:
        return load_pretrained(transformers.AutoModel, req.model_id, req.revision, where)
    assert req.config is not None
    config = build_config(req.config, None, where)
    check(config, where)
    return build_random(lambda: transformers.AutoModel.from_config(config), req.seed)


def _features(result: Any) -> Any:
    """get_*_features returns the embedding, or (newer transformers) an output holding it."""
    if hasattr(result, "pooler_output"):
        return result.pooler_output
    return result


def export(req: ExportRequest) -> ExportOutput:
    import torch

    from winml_recipes.exporters import torch_export

    model = load_model(req)
    check(model.config, f"two_tower/{req.component}")
    gen = torch.Generator().manual_seed(0)
    b = _TRACE_BATCH
    if req.component == "text_model":
        names = _text_inputs(model.config)
        vocab = int(model.config.text_config.vocab_size)
        s = _TRACE_SEQUENCE
        examples = {
            "input_ids": torch.randint(0, vocab, (b, s), generator=gen),
            "attention_mask": torch.tensor([[1] * s, [1] * (s - 2) + [0] * 2]),
        }
        args = tuple(examples[n] for n in names)
        dims: dict[int, str] = {0: "batch", 1: "sequence"}
        output, method = "text_embeds", model.get_text_features
    else:
        c, h, w = _image_size(model.config.vision_config, "two_tower/vision_model")
        names = ("pixel_values",)
        args = (torch.rand(b, c, h, w, generator=gen) * 2 - 1,)
        dims = {0: "batch"}
        output, method = "image_embeds", model.get_image_features

    class Tower(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
            return _features(method(**dict(zip(names, inputs, strict=True))))

    return torch_export(
        Tower(),
        args,
        input_names=names,
        output_names=(output,),
        dynamic_shapes=(tuple(dims for _ in names),),
        opset=req.opset,
    )


def catalog_components(
    config: Any,
    preprocessor: Mapping[str, Any] | None = None,
    *,
    config_path: Path | str = "config.json",
    source: Path | str = "preprocessor_config.json",
) -> dict[str, dict[str, Any]]:
    """The two components' I/O contracts from the nested configs (and the image
    preprocessing of `preprocessor_config.json`), without weights."""
    from winml_recipes.exporters.auto import MAX_COUNT, _whole, image_block

    where = str(config_path)
    check(config, where)
    text, vision = config.text_config, config.vision_config
    dim = _whole(getattr(config, "projection_dim", None) or text.hidden_size, "projection_dim",
                 where, MAX_COUNT)  # fmt: skip
    vocab = _whole(text.vocab_size, "text_config.vocab_size", where, MAX_COUNT)
    length = _whole(text.max_position_embeddings, "text_config.max_position_embeddings", where,
                    MAX_COUNT)  # fmt: skip
    inputs: dict[str, Any] = {
        "input_ids": {"dtype": "int64", "shape": ["batch", "sequence"], "range": [0, vocab]},
        "attention_mask": {"dtype": "int64", "shape": ["batch", "sequence"], "values": [1]},
    }
    c, h, w = _image_size(vision, where)
    pixel: dict[str, Any] = {"dtype": "float32", "range": [-1.0, 1.0]}
    image = image_block(preprocessor, c, source)
    if image is not None:
        image["size"] = [h, w] if h != w else h
        lows = [(0.0 - m) / s for m, s in zip(image["mean"], image["std"], strict=True)]
        highs = [(1.0 - m) / s for m, s in zip(image["mean"], image["std"], strict=True)]
        pixel["range"] = [round(min(lows), 6), round(max(highs), 6)]
        pixel["image"] = image
    # SigLIP pads every prompt to the model's length; CLIP to the longest (16 a guess)
    sequence = length if config.model_type in IDS_ONLY else min(16, length)
    return {
        "text_model": {
            "task": "text-embedding",
            "dims": {"batch": 1, "sequence": sequence},
            "inputs": {n: inputs[n] for n in _text_inputs(config)},
            "outputs": {"text_embeds": {"dtype": "float32", "shape": ["batch", dim]}},
        },
        "vision_model": {
            "task": "image-embedding",
            "dims": {"batch": 1},
            "inputs": {"pixel_values": {**pixel, "shape": ["batch", c, h, w]}},
            "outputs": {"image_embeds": {"dtype": "float32", "shape": ["batch", dim]}},
        },
    }


FAMILY = ExporterFamily("two_tower", COMPONENTS, export)
