"""Tiny dense-prediction vision models (random weights) saved as a Hub folder would be.

Each is the real transformers architecture at a small size, written with `save_pretrained`
plus a `preprocessor_config.json` shaped like the one the named Hub model ships (same
keys: size, mean/std, rescale, normalize flags), at a small image size. Used by the tests
and by bench/vision_tasks.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

IMAGENET = {"image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}
HALF = {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
RESCALE = {"do_rescale": True, "rescale_factor": 1 / 255}


def _resnet(hidden: list[int], out: list[str]) -> dict[str, Any]:
    return {
        "model_type": "resnet",
        "embedding_size": 8,
        "hidden_sizes": hidden,
        "depths": [1] * len(hidden),
        "layer_type": "basic",
        "out_features": out,
    }


def _dpt() -> tuple[Any, dict]:
    from transformers import DPTConfig, DPTForDepthEstimation

    config = DPTConfig(
        hidden_size=32, num_hidden_layers=4, num_attention_heads=2, intermediate_size=64,
        image_size=64, patch_size=16, backbone_out_indices=[0, 1, 2, 3],
        neck_hidden_sizes=[8, 16, 32, 32], fusion_hidden_size=16, head_in_index=-1,
        reassemble_factors=[4, 2, 1, 0.5], initializer_range=0.1,
    )  # fmt: skip
    pre = {"image_processor_type": "DPTImageProcessor", "do_resize": True,
           "size": {"height": 64, "width": 64}, "keep_aspect_ratio": False,
           "do_normalize": True, **HALF, **RESCALE}  # fmt: skip
    return DPTForDepthEstimation(config), pre


def _depth_anything() -> tuple[Any, dict]:
    from transformers import DepthAnythingConfig, DepthAnythingForDepthEstimation, Dinov2Config

    backbone = Dinov2Config(
        hidden_size=32, num_hidden_layers=4, num_attention_heads=2, intermediate_size=64,
        image_size=56, patch_size=14, out_features=["stage1", "stage2", "stage3", "stage4"],
        reshape_hidden_states=False, initializer_range=0.1,
    )  # fmt: skip
    config = DepthAnythingConfig(
        backbone_config=backbone, neck_hidden_sizes=[8, 16, 32, 32], fusion_hidden_size=16,
        head_hidden_size=8, reassemble_hidden_size=32, patch_size=14, initializer_range=0.1,
    )  # fmt: skip
    # as depth-anything/Depth-Anything-V2-Small-hf's (518 there)
    pre = {"image_processor_type": "DPTImageProcessor", "do_resize": True,
           "size": {"height": 56, "width": 56}, "keep_aspect_ratio": True,
           "ensure_multiple_of": 14, "do_pad": False, "do_normalize": True, **IMAGENET,
           **RESCALE}  # fmt: skip
    return DepthAnythingForDepthEstimation(config), pre


def _glpn() -> tuple[Any, dict]:
    from transformers import GLPNConfig, GLPNForDepthEstimation

    config = GLPNConfig(
        num_encoder_blocks=4, depths=[1, 1, 1, 1], sr_ratios=[8, 4, 2, 1],
        hidden_sizes=[8, 16, 24, 32], num_attention_heads=[1, 1, 2, 2], decoder_hidden_size=16,
        head_in_index=-1, max_depth=10, image_size=[64, 64],
    )  # fmt: skip
    # GLPNImageProcessor: no fixed size (rounds down to a multiple of 32), no normalization;
    # the size comes from config.json's image_size (what init's note asks for)
    pre = {"image_processor_type": "GLPNImageProcessor", "do_resize": True,
           "size_divisor": 32, "do_rescale": True}  # fmt: skip
    return GLPNForDepthEstimation(config), pre


def _segformer() -> tuple[Any, dict]:
    from transformers import SegformerConfig, SegformerForSemanticSegmentation

    config = SegformerConfig(
        depths=[1, 1, 1, 1], hidden_sizes=[8, 16, 24, 32], num_attention_heads=[1, 1, 2, 2],
        decoder_hidden_size=32, num_labels=6,
    )  # fmt: skip
    pre = {"image_processor_type": "SegformerImageProcessor", "do_resize": True,
           "size": {"height": 64, "width": 64}, "do_normalize": True, "do_reduce_labels": True,
           **IMAGENET, **RESCALE}  # fmt: skip
    return SegformerForSemanticSegmentation(config), pre


def _mobilevit() -> tuple[Any, dict]:
    from transformers import MobileViTConfig, MobileViTForSemanticSegmentation

    config = MobileViTConfig(
        image_size=64, hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64],
        num_attention_heads=2, aspp_out_channels=16, num_labels=5, output_stride=8,
        initializer_range=0.1,
    )  # fmt: skip
    # as apple/deeplabv3-mobilevit-small's: BGR, no mean/std
    pre = {"image_processor_type": "MobileViTImageProcessor", "do_resize": True,
           "size": {"shortest_edge": 64}, "do_center_crop": True,
           "crop_size": {"height": 64, "width": 64}, "do_flip_channel_order": True,
           **RESCALE}  # fmt: skip
    return _unit_batchnorm(MobileViTForSemanticSegmentation(config)), pre


def _detr() -> tuple[Any, dict]:
    from transformers import DetrConfig, DetrForObjectDetection

    config = DetrConfig(
        use_timm_backbone=False, use_pretrained_backbone=False,
        backbone_config=_resnet([8, 16, 24, 32], ["stage4"]), d_model=32,
        encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, num_queries=10,
        num_labels=3,
    )  # fmt: skip
    pre = {"image_processor_type": "DetrImageProcessor", "do_resize": True,
           "size": {"shortest_edge": 64, "longest_edge": 96}, "do_pad": True,
           "do_normalize": True, **IMAGENET, **RESCALE}  # fmt: skip
    return DetrForObjectDetection(config), pre


def _yolos() -> tuple[Any, dict]:
    from transformers import YolosConfig, YolosForObjectDetection

    config = YolosConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        image_size=[64, 64], patch_size=16, num_detection_tokens=10, num_labels=3,
    )  # fmt: skip
    pre = {"image_processor_type": "YolosImageProcessor", "do_resize": True,
           "size": {"shortest_edge": 64, "longest_edge": 96}, "do_pad": True,
           "do_normalize": True, **IMAGENET, **RESCALE}  # fmt: skip
    return YolosForObjectDetection(config), pre


def _rt_detr() -> tuple[Any, dict]:
    from transformers import RTDetrConfig, RTDetrForObjectDetection

    config = RTDetrConfig(
        backbone_config={**_resnet([16, 24, 32, 48], ["stage2", "stage3", "stage4"]),
                         "model_type": "rt_detr_resnet", "layer_type": "bottleneck"},
        encoder_in_channels=[24, 32, 48], decoder_in_channels=[32, 32, 32],
        feat_strides=[8, 16, 32], d_model=32,
        encoder_hidden_dim=32, encoder_ffn_dim=64, encoder_attention_heads=2,
        decoder_layers=1, decoder_ffn_dim=64, decoder_attention_heads=2, num_queries=10,
        decoder_n_points=2, num_labels=2, num_denoising=0,
    )  # fmt: skip
    # as PekingU/rtdetr_r18vd's: 640x640 there, rescale only (no mean/std)
    pre = {"image_processor_type": "RTDetrImageProcessor", "do_resize": True,
           "size": {"height": 64, "width": 64}, "do_normalize": False, **IMAGENET,
           **RESCALE}  # fmt: skip
    # transformers draws the hybrid encoder's BatchNorm scales from N(0, 0.01)
    # (initializer_range): each layer shrinks the features ~100x, the encoder's memory
    # vanishes (max |x| 1e-14 .. 4e-7), every anchor then scores the scorer's bias alike
    # (-0.693) and top-k chooses among ties differently in torch and onnxruntime (export
    # parity 4.6 dB).
    return _unit_batchnorm(RTDetrForObjectDetection(config), below=0.1), pre


def _unit_batchnorm(model: Any, below: float = float("inf")) -> Any:
    """BatchNorm scales at 1 (PyTorch's own init; a trained BatchNorm scales by O(1)) where
    transformers draws them from N(0, initializer_range), which shrinks the features at
    every layer (RT-DETR: the encoder's memory vanished; MobileViT: its encoder ran at
    1e-8 .. 1e-17, below what HTP's products keep). Only scales whose peak is under
    `below` are reset."""
    import torch

    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d) and module.weight.abs().max() < below:
                module.weight.fill_(1.0)
    return model


def _swin2sr() -> tuple[Any, dict]:
    from transformers import Swin2SRConfig, Swin2SRForImageSuperResolution

    config = Swin2SRConfig(
        image_size=32, patch_size=1, embed_dim=16, depths=[1, 1], num_heads=[2, 2],
        window_size=8, upscale=2, upsampler="pixelshuffle",
    )  # fmt: skip
    # as caidas/swin2SR-classical-sr-x2-64's: pad to a multiple of 8, rescale, no mean/std
    pre = {"image_processor_type": "Swin2SRImageProcessor", "do_pad": True, "pad_size": 8,
           **RESCALE}  # fmt: skip
    return Swin2SRForImageSuperResolution(config), pre


# The layer that makes each tiny model's output, and the mean and std it is set to give on
# the bundled calibration photos (see `condition`).
HEADS: dict[str, tuple[str, float, float]] = {
    "DPTForDepthEstimation": ("head.head.4", 1.0, 0.3),  # a ReLU follows: keep it positive
    "DepthAnythingForDepthEstimation": ("head.conv3", 1.0, 0.3),
    "GLPNForDepthEstimation": ("head.head.2", 0.0, 1.0),  # sigmoid * max_depth follows
    "SegformerForSemanticSegmentation": ("decode_head.classifier", 0.0, 2.0),
    "MobileViTForSemanticSegmentation": ("segmentation_head.classifier.convolution", 0.0, 2.0),
    "DetrForObjectDetection": ("class_labels_classifier", 0.0, 3.0),
    "YolosForObjectDetection": ("class_labels_classifier.layers.2", 0.0, 3.0),
    "RTDetrForObjectDetection": ("model.decoder.class_embed.0", -0.5, 2.0),
    "Swin2SRForImageSuperResolution": ("upsample.final_convolution", 0.0, 0.2),  # + mean
}

# Heads inside the model whose outputs decide what the output head sees, conditioned first:
# RT-DETR's anchor scorer picks the top-k anchors (the decoder's queries); at its random init
# the 84 anchor scores of the tiny model lie within 0.002 of its bias (-0.693), a tie that
# any quantization noise reorders, where a trained scorer spreads them over several logits.
INNER_HEADS: dict[str, list[tuple[str, float, float]]] = {
    "RTDetrForObjectDetection": [
        *((f"model.decoder_input_proj.{i}.1", 0.0, 1.0) for i in range(3)),
        ("model.enc_score_head", -1.0, 2.0),
    ],
}

TINY: dict[str, Callable[[], tuple[Any, dict]]] = {
    "DPTForDepthEstimation": _dpt,
    "DepthAnythingForDepthEstimation": _depth_anything,
    "GLPNForDepthEstimation": _glpn,
    "SegformerForSemanticSegmentation": _segformer,
    "MobileViTForSemanticSegmentation": _mobilevit,
    "DetrForObjectDetection": _detr,
    "YolosForObjectDetection": _yolos,
    "RTDetrForObjectDetection": _rt_detr,
    "Swin2SRForImageSuperResolution": _swin2sr,
}


def photos(size: tuple[int, int], pre: dict) -> Any:
    """The bundled calibration photos as the processor would feed them, [n, 3, h, w]."""
    import numpy as np
    import torch
    from PIL import Image

    from winml_recipes.exporters.vision import image_block

    block = image_block(pre, 3, size, "preprocessor_config.json")
    files = sorted((REPO / "winml_recipes" / "data" / "images" / "calibration").glob("*.jpg"))
    rgb = [
        np.asarray(Image.open(f).convert("RGB").resize(size[::-1]), np.float32) / 255
        for f in files[:8]
    ]
    x = (np.stack(rgb) - np.float32(block["mean"])) / np.float32(block["std"])
    return torch.from_numpy(x.transpose(0, 3, 1, 2).copy())


def condition(model: Any, layer: str, mean: float, std: float, x: Any) -> None:
    """Rescale `layer` (the head's last Linear/Conv) so its output on `x` has this mean and
    std (LSUV-style, data-dependent init): a random-weight head otherwise gives outputs a
    comparison cannot tell apart (a ReLU'd depth map of zeros, softmax scores that never
    pass a detector's 0.5 threshold)."""
    import torch

    module = model.get_submodule(layer)
    seen: list[Any] = []
    hook = module.register_forward_hook(lambda _m, _i, out: seen.append(out.detach()))
    with torch.no_grad():
        model(pixel_values=x)
        hook.remove()
        out = torch.cat([o.reshape(-1) for o in seen])
        scale = std / max(float(out.std()), 1e-12)
        module.weight.mul_(scale)
        bias = module.bias if module.bias is not None else 0.0
        module.bias.copy_((bias - float(out.mean())) * scale + mean)


def save_tiny(arch: str, folder: Path, seed: int = 0) -> Path:
    """`arch` at a tiny size with seeded random weights, saved as a Hub folder would be."""
    import torch

    from winml_recipes.exporters.vision import input_size

    torch.manual_seed(seed)
    model, pre = TINY[arch]()
    model.eval()
    h, w, _ = input_size(model.config, pre)
    for layer, mean, std in [*INNER_HEADS.get(arch, []), HEADS[arch]]:
        condition(model, layer, mean, std, photos((h, w), pre))
    model.save_pretrained(str(folder))
    (folder / "preprocessor_config.json").write_text(json.dumps(pre, indent=2))
    return folder
