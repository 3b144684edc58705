"""The curated dense-vision catalog entries' models: the config fields and processor files
that decide their I/O contracts, as their Hub repositories publish them (config.json and
preprocessor_config.json at the pinned revision), for checking the entries against what
`init` derives. Configs are built without weights."""

from __future__ import annotations

from typing import Any

IMAGENET = {"image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}
HALF = {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}


def _depth_anything() -> Any:
    from transformers import DepthAnythingConfig

    return DepthAnythingConfig(
        backbone_config={"model_type": "dinov2", "hidden_size": 384, "num_attention_heads": 6,
                         "image_size": 518, "out_features": ["stage3", "stage6", "stage9",
                                                             "stage12"],
                         "reshape_hidden_states": False},
        neck_hidden_sizes=[48, 96, 192, 384], fusion_hidden_size=64, patch_size=14,
    )  # fmt: skip


def _dpt_hybrid() -> Any:
    from transformers import DPTConfig

    return DPTConfig(is_hybrid=True, image_size=384, patch_size=16, hidden_size=768)


def _segformer() -> Any:
    from transformers import SegformerConfig

    return SegformerConfig(hidden_sizes=[32, 64, 160, 256], decoder_hidden_size=256,
                           num_labels=150)  # fmt: skip


def _rt_detr() -> Any:
    from transformers import RTDetrConfig

    return RTDetrConfig(num_queries=300, num_labels=80, use_focal_loss=True)


def _yolos() -> Any:
    from transformers import YolosConfig

    return YolosConfig(hidden_size=192, num_hidden_layers=12, num_attention_heads=3,
                       intermediate_size=768, image_size=[800, 1333], num_detection_tokens=100,
                       num_labels=91)  # fmt: skip


def _swin2sr() -> Any:
    from transformers import Swin2SRConfig

    return Swin2SRConfig(image_size=64, upscale=2, window_size=8, upsampler="pixelshuffle")


# entry name -> (architecture, config, preprocessor_config.json)
ENTRIES: dict[str, tuple[str, Any, dict]] = {
    "depth-anything-v2-small": (
        "DepthAnythingForDepthEstimation", _depth_anything,
        {"do_resize": True, "size": {"height": 518, "width": 518}, "keep_aspect_ratio": True,
         "ensure_multiple_of": 14, "do_normalize": True, **IMAGENET, "do_rescale": True,
         "rescale_factor": 1 / 255},
    ),
    "dpt-hybrid-midas": (
        "DPTForDepthEstimation", _dpt_hybrid,
        {"do_resize": True, "size": {"height": 384, "width": 384}, "do_normalize": True,
         **HALF, "do_rescale": True, "rescale_factor": 1 / 255},
    ),
    "segformer-b0-ade-512": (
        "SegformerForSemanticSegmentation", _segformer,
        {"do_resize": True, "size": {"height": 512, "width": 512}, "do_normalize": True,
         **IMAGENET, "do_rescale": True, "rescale_factor": 1 / 255, "do_reduce_labels": True},
    ),
    "rtdetr-r18vd": (
        "RTDetrForObjectDetection", _rt_detr,
        {"do_resize": True, "size": {"height": 640, "width": 640}, "do_normalize": False,
         **IMAGENET, "do_rescale": True, "rescale_factor": 1 / 255},
    ),
    "yolos-tiny": (
        "YolosForObjectDetection", _yolos,
        {"do_resize": True, "size": {"shortest_edge": 512, "longest_edge": 1333},
         "do_normalize": True, **IMAGENET, "do_rescale": True, "rescale_factor": 1 / 255},
    ),
    "swin2sr-classical-x2-64": (
        "Swin2SRForImageSuperResolution", _swin2sr,
        {"do_rescale": True, "rescale_factor": 1 / 255, "do_pad": True, "pad_size": 8},
    ),
}  # fmt: skip


def derived(name: str) -> tuple[str, dict]:
    """(entry task, the model component) `init` derives from the entry's config files."""
    from winml_recipes.exporters import auto

    arch, make, pre = ENTRIES[name]
    config = make()
    config.architectures = [arch]
    task = auto.task_of(config)
    component = auto.catalog_components(config, task, pre)["model"]
    return auto.vision.entry_task(config, task), component
