"""Tiny random-weight SAM (v1) and SAM 2.1 checkpoints saved as a Hub folder ships them
(`save_pretrained` + preprocessor_config.json), for `init FOLDER` tests. SAM 2.1's config
is the built-in sam2.1-tiny catalog entry's; SAM's is below (the same sizes: 128 px,
patch 16, hidden 32, so its one embedding is [B,32,8,8] and its masks 32x32)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import CATALOG

# initializer_range 0.1 for the same reason as sam3-tiny's: at 0.02 the random model's
# masks are near zero everywhere and agreement on them proves nothing.
TINY_SAM_CONFIG: dict[str, Any] = {
    "model_type": "sam",
    "initializer_range": 0.1,
    "vision_config": {
        "initializer_range": 0.1,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": 128,
        "patch_size": 16,
        "window_size": 4,
        "global_attn_indexes": [1],
        "output_channels": 32,
        "mlp_dim": 64,
        "num_pos_feats": 16,
    },
    "prompt_encoder_config": {
        "hidden_size": 32, "image_size": 128, "patch_size": 16, "mask_input_channels": 8,
    },
    "mask_decoder_config": {
        "hidden_size": 32, "mlp_dim": 64, "num_attention_heads": 2, "iou_head_hidden_dim": 32,
    },
}  # fmt: skip


def tiny_sam2_config() -> dict[str, Any]:
    entry = yaml.safe_load((CATALOG / "sam2.1-tiny.yaml").read_text())
    return dict(entry["components"]["vision_encoder"]["source"]["config"])


def save_tiny(kind: str, folder: Path, seed: int = 0) -> Path:
    """A `save_pretrained` folder of a seeded random-weight SamModel ("sam") or Sam2Model
    ("sam2"), with the preprocessor_config.json its Hub repository has (ImageNet mean/std)."""
    import torch
    import transformers

    fields = dict(TINY_SAM_CONFIG if kind == "sam" else tiny_sam2_config())
    model_type = fields.pop("model_type")
    config_class, model_class, processor = {
        "sam": ("SamConfig", "SamModel", "SamImageProcessor"),
        "sam2": ("Sam2Config", "Sam2Model", "Sam2ImageProcessorFast"),
    }[model_type]
    config = getattr(transformers, config_class)(**fields)
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(config)
    if kind == "sam":
        # SAM's random init draws the prompt positional Gaussian with std hidden_size / 2
        # (16 here); the released checkpoints hold SAM's N(0, 1) one. At std 16 the Sin/Cos
        # arguments span about +-200 rad, and no 16-bit grid keeps a sine of them: the QDQ
        # decoder lost its masks on the CPU EP and on HTP alike (pred_masks 7 dB, mask IoU
        # 0.78). Draw it as the checkpoints have it.
        with torch.no_grad():
            model.shared_image_embedding.positional_embedding.normal_(0.0, 1.0)
    model.save_pretrained(str(folder))
    size = config.prompt_encoder_config.image_size
    (folder / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": processor,
                "do_resize": True, "do_rescale": True, "rescale_factor": 1 / 255,
                "do_normalize": True, "do_convert_rgb": True,
                "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225],
                "size": {"height": size, "width": size} if kind == "sam2"
                else {"longest_edge": size},
            },
            indent=2,
        )
    )  # fmt: skip
    return folder
