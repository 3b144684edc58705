"""SAM 3 tracker (transformers `Sam3TrackerModel`): the `sam3_tracker` architecture of the
SAM-style exporter (`winml_recipes.exporters.sam`), with its tiny random-weight config."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from winml_recipes.exporters.sam import (
    ARCHITECTURES,
    COMPONENTS,
    SAM3_TRACKER,
    VISION_INPUTS,
)
from winml_recipes.exporters.sam import catalog_components as _catalog_components
from winml_recipes.exporters.sam import embedding_shapes as _embedding_shapes
from winml_recipes.exporters.sam import load_model as _load_model

if TYPE_CHECKING:
    from winml_recipes.exporters import ExportRequest

__all__ = ["COMPONENTS", "FAMILY", "TINY_SAM3_TRACKER_CONFIG", "VISION_INPUTS"]

ARCH = ARCHITECTURES["sam3_tracker"]
EMBEDDINGS = ARCH.embeddings
DECODER_INPUTS = ARCH.decoder_inputs
DECODER_OUTPUTS = ARCH.decoder_outputs
FAMILY = SAM3_TRACKER

# A random-weight stand-in that builds in ~0.1 s: ViT hidden 32, 2 layers (layer 1 global),
# 112 px / patch 14 -> g = 8, so the embeddings are [B,4,32,32], [B,8,16,16], [B,32,8,8]
# (the 1008 px layout scaled by 1/9). fpn_hidden_size must equal the mask decoder hidden size.
# pretrain_image_size 56 gives a 4x4 position table tiled to 8x8 (the real model tiles 24 -> 72).
# initializer_range 0.1 (default 0.02): with the default init the outputs are degenerate
# (pred_masks ~1e-4, image_embeddings.0 ~1e-5), so neither accuracy checks nor quantization
# SQNR would mean anything. The top level sets the mask decoder / prompt encoder init, the
# vision levels set the encoder's (it is a separate PreTrainedModel).
TINY_SAM3_TRACKER_CONFIG: dict[str, Any] = {
    "model_type": "sam3_tracker",
    "initializer_range": 0.1,
    "vision_config": {
        "model_type": "sam3_vision_model",
        "initializer_range": 0.1,
        "backbone_config": {
            "model_type": "sam3_vit_model",
            "initializer_range": 0.1,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "window_size": 4,
            "global_attn_indexes": [1],
            "image_size": 112,
            "patch_size": 14,
            "pretrain_image_size": 56,
        },
        "fpn_hidden_size": 32,
        "backbone_feature_sizes": [[32, 32], [16, 16], [8, 8]],
    },
    "prompt_encoder_config": {
        "hidden_size": 32,
        "image_size": 112,
        "patch_size": 14,
        "mask_input_channels": 8,
    },
    "mask_decoder_config": {
        "hidden_size": 32,
        "mlp_dim": 64,
        "num_attention_heads": 2,
        "iou_head_hidden_dim": 32,
    },
}


def load_model(req: ExportRequest) -> Any:
    """The eval-mode fp32 `Sam3TrackerModel` for `req` (pretrained or random weights)."""
    return _load_model(ARCH, req)


def image_size(model: Any) -> int:
    return ARCH.image_size(model.config)


def embedding_shapes(model: Any, batch: int) -> list[tuple[int, ...]]:
    """Shapes of `image_embeddings.0/.1/.2` for `batch` images."""
    return _embedding_shapes(ARCH, model.config, batch)


def catalog_components(config: Any) -> dict[str, dict[str, Any]]:
    """Catalog components (I/O contract and dims) for a Sam3TrackerConfig, without weights."""
    return _catalog_components(config)
