"""Image classifiers as users bring them (issue 33): the corpus's ViT, ResNet, ConvNeXt and
MobileNet V2 (tests/corpus/hf.py) and those whose op patterns gave QNN HTP trouble: Swin's
shifted windows, MobileViT's unfold/fold, EfficientNet's pooling, ConvNeXt V2's global
response normalization. Tiny configs of the real transformers classes, seeded random weights, saved
with `save_pretrained` and an image processor config like the Hub models' (64 px)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.corpus import hf
from tests.corpus.hf import IMAGE_PREPROCESSOR, save_once

VERSION = 3  # 2: EfficientNet at initializer_range 0.6; 3: MobileViT's BatchNorm scales 1
IMAGENET = {"image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225],
            "do_normalize": True, "do_resize": True}  # fmt: skip


def _pre(stats: dict, processor: str) -> dict:
    return {**stats, "image_processor_type": processor, "size": {"height": 64, "width": 64}}


def _swin() -> tuple[Any, dict]:
    from transformers import SwinConfig, SwinForImageClassification

    cfg = SwinConfig(image_size=64, patch_size=4, embed_dim=16, depths=[2, 2], num_heads=[2, 2],
                     window_size=4, num_labels=10)  # fmt: skip
    return SwinForImageClassification(cfg), _pre(IMAGENET, "ViTImageProcessor")


def _mobilevit() -> tuple[Any, dict]:
    from transformers import MobileViTConfig, MobileViTForImageClassification

    # initializer_range 0.2: at the default 0.02 the tiny model's logits are ~1e-42
    cfg = MobileViTConfig(image_size=64, hidden_sizes=[64, 80, 96],
                          neck_hidden_sizes=[16, 16, 24, 48, 64, 80, 320], num_labels=10,
                          initializer_range=0.2)  # fmt: skip
    from tests.vision_models import _unit_batchnorm

    # BatchNorm scales at 1, as trained ones are O(1) (transformers draws them from
    # N(0, initializer_range) and the encoder then runs at 1e-8 .. 1e-17)
    return _unit_batchnorm(MobileViTForImageClassification(cfg)), _pre(
        {**IMAGE_PREPROCESSOR, "image_mean": [0.0] * 3, "image_std": [1.0] * 3},
        "MobileViTImageProcessor",
    )


def _efficientnet() -> tuple[Any, dict]:
    from transformers import EfficientNetConfig, EfficientNetForImageClassification

    # initializer_range 0.6: at 0.02 the features vanish (~1e4x per block) and every image
    # gets logits 0 (winml_recipes/data/catalog/efficientnet-b0-tiny.yaml says the same)
    cfg = EfficientNetConfig(image_size=64, width_coefficient=0.25, depth_coefficient=0.25,
                             hidden_dim=320, num_labels=10, initializer_range=0.6)  # fmt: skip
    return EfficientNetForImageClassification(cfg), _pre(IMAGENET, "EfficientNetImageProcessor")


def _convnextv2() -> tuple[Any, dict]:
    from transformers import ConvNextV2Config, ConvNextV2ForImageClassification

    cfg = ConvNextV2Config(image_size=64, hidden_sizes=[16, 32], depths=[1, 1], num_stages=2,
                           num_labels=10)  # fmt: skip
    return ConvNextV2ForImageClassification(cfg), _pre(IMAGENET, "ConvNextImageProcessor")


ARCHITECTURES: dict[str, Callable[[], tuple[Any, dict]]] = {
    **{name: hf.ARCHITECTURES[name] for name in ("vit", "resnet", "convnext", "mobilenetv2")},
    "swin": _swin, "mobilevit": _mobilevit, "efficientnet": _efficientnet,
    "convnextv2": _convnextv2,
}  # fmt: skip


def saved(arch: str, root: Path) -> Path:
    """A `save_pretrained` folder of the tiny `arch` (seed 0) under `root`, made once."""
    return save_once(root / f"{arch}-v{VERSION}", ARCHITECTURES[arch])
