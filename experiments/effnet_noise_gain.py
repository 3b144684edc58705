"""How much a float model amplifies small noise (issue 33, tiny EfficientNet at cpu/int8).

Adds white noise at INPUT_DB SQNR to the held-out photos' pixel values and reports the
logits' SQNR against the clean run, in torch, for the tiny image classifiers of
tests/image_classifiers.py (and EfficientNet at other initializer_range values). A model
whose logits lose far more than the input did amplifies any quantization noise the same way.

    python experiments/effnet_noise_gain.py
"""

import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.image_classifiers import ARCHITECTURES

INPUT_DB = 40.0
mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
photos = sorted(Path("winml_recipes/data/images/heldout").glob("*.jpg"))


def pixels(size):
    return torch.tensor(
        np.stack(
            [
                (
                    (
                        np.asarray(Image.open(p).convert("RGB").resize((size, size)), np.float32)
                        / 255
                        - mean
                    )
                    / std
                ).transpose(2, 0, 1)
                for p in photos
            ]
        ),
        dtype=torch.float32,
    )


def sqnr(a, b):
    return float(10 * torch.log10((a**2).mean() / ((a - b) ** 2).mean()))


def gain(model, size):
    torch.manual_seed(1)
    x = pixels(size)
    noise = torch.randn_like(x) * x.pow(2).mean().sqrt() * 10 ** (-INPUT_DB / 20)
    with torch.no_grad():
        clean, noisy = model(pixel_values=x).logits, model(pixel_values=x + noise).logits
    agree = float((clean.argmax(-1) == noisy.argmax(-1)).float().mean())
    return sqnr(clean, noisy), agree


def effnet(init_range):
    from transformers import EfficientNetConfig, EfficientNetForImageClassification

    torch.manual_seed(0)
    cfg = EfficientNetConfig(
        image_size=64,
        width_coefficient=0.25,
        depth_coefficient=0.25,
        hidden_dim=320,
        num_labels=10,
        initializer_range=init_range,
    )
    return EfficientNetForImageClassification(cfg).eval()


for arch in ("efficientnet", "mobilenetv2", "resnet", "convnext", "vit"):
    torch.manual_seed(0)
    model, _ = ARCHITECTURES[arch]()
    size = getattr(model.config, "image_size", 64)
    db, agree = gain(model.eval(), size)
    print(f"{arch:14s} input {INPUT_DB:.0f} dB -> logits {db:6.1f} dB, top-1 kept {agree:.3f}")
for r in (0.1, 0.2, 0.3, 0.4, 0.6, 1.0):
    db, agree = gain(effnet(r), 64)
    print(
        f"efficientnet initializer_range {r}: input {INPUT_DB:.0f} dB -> "
        f"logits {db:6.1f} dB, top-1 kept {agree:.3f}"
    )
