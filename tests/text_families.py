"""Tiny random-weight models of the text, two-tower and image-embedding families (issue 33),
saved as a user brings them: a `save_pretrained` folder with the preprocessor file a Hub
folder ships. Used by tests/integration/test_text_families.py and bench/text_families.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

VERSION = 1
IMAGENET = {"image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}
HALF = {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
CLIP_STATS = {"image_mean": [0.4815, 0.4578, 0.4082], "image_std": [0.2686, 0.2613, 0.2758]}
TEXT = dict(vocab_size=256, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=64, max_position_embeddings=64)  # fmt: skip
IDS = dict(pad_token_id=1, bos_token_id=0, eos_token_id=2)  # inside the tiny vocabulary
VISION = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
              image_size=32, patch_size=8)  # fmt: skip


def _pre(stats: dict, side: int, processor: str) -> dict:
    return {**stats, "size": {"height": side, "width": side}, "do_normalize": True,
            "do_resize": True, "image_processor_type": processor}  # fmt: skip


def _dinov2() -> tuple[Any, dict | None]:
    from transformers import Dinov2Config, Dinov2Model

    cfg = Dinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, mlp_ratio=2,
                       image_size=28, patch_size=14)  # fmt: skip
    pre = {**IMAGENET, "size": {"shortest_edge": 32}, "crop_size": {"height": 28, "width": 28},
           "do_center_crop": True, "image_processor_type": "BitImageProcessor"}  # fmt: skip
    return Dinov2Model(cfg), pre


def _siglip_vision() -> tuple[Any, dict | None]:
    from transformers import SiglipVisionConfig, SiglipVisionModel

    return SiglipVisionModel(SiglipVisionConfig(**VISION)), _pre(HALF, 32, "SiglipImageProcessor")


def _clip_vision_projection() -> tuple[Any, dict | None]:
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    cfg = CLIPVisionConfig(**VISION, projection_dim=16)
    return CLIPVisionModelWithProjection(cfg), _pre(CLIP_STATS, 32, "CLIPImageProcessor")


def _clip() -> tuple[Any, dict | None]:
    from transformers import CLIPConfig, CLIPModel

    text = {**TEXT, "max_position_embeddings": 16, **IDS}
    cfg = CLIPConfig(text_config=text, vision_config=VISION, projection_dim=16)
    return CLIPModel(cfg), _pre(CLIP_STATS, 32, "CLIPImageProcessor")


def _siglip() -> tuple[Any, dict | None]:
    from transformers import SiglipConfig, SiglipModel

    text = {**TEXT, "max_position_embeddings": 16, **IDS}
    cfg = SiglipConfig(text_config=text, vision_config=VISION)
    return SiglipModel(cfg), _pre(HALF, 32, "SiglipImageProcessor")


def _distilbert_qa() -> tuple[Any, dict | None]:
    from transformers import DistilBertConfig, DistilBertForQuestionAnswering

    cfg = DistilBertConfig(vocab_size=256, dim=32, n_layers=2, n_heads=2, hidden_dim=64,
                           max_position_embeddings=64)  # fmt: skip
    return DistilBertForQuestionAnswering(cfg), None


def _bert_token() -> tuple[Any, dict | None]:
    from transformers import BertConfig, BertForTokenClassification

    return BertForTokenClassification(BertConfig(**TEXT, num_labels=5)), None


def _bge() -> tuple[Any, dict | None]:
    from transformers import BertConfig, BertModel

    return BertModel(BertConfig(**TEXT)), None


def _t5_encoder() -> tuple[Any, dict | None]:
    from transformers import T5Config, T5EncoderModel

    cfg = T5Config(vocab_size=256, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2,
                   relative_attention_num_buckets=8)  # fmt: skip
    return T5EncoderModel(cfg), None


def _deberta_v3() -> tuple[Any, dict | None]:
    from transformers import DebertaV2Config, DebertaV2ForSequenceClassification

    # DeBERTa v3's config: no token type embeddings (type_vocab_size 0), relative attention.
    # initializer_range 0.2: at the default 0.02 the tiny model's 3 logits differ by 1e-4, a
    # dead classifier whose top-1 any rounding flips
    cfg = DebertaV2Config(**{**TEXT, "max_position_embeddings": 64}, type_vocab_size=0,
                          relative_attention=True, position_buckets=16, pos_att_type=["p2c", "c2p"],
                          position_biased_input=False, num_labels=3,
                          initializer_range=0.2)  # fmt: skip
    return DebertaV2ForSequenceClassification(cfg), None


ARCHITECTURES: dict[str, Callable[[], tuple[Any, dict | None]]] = {
    "dinov2": _dinov2,
    "siglip-vision": _siglip_vision,
    "clip-vision-projection": _clip_vision_projection,
    "clip": _clip,
    "siglip": _siglip,
    "distilbert-qa": _distilbert_qa,
    "bert-token": _bert_token,
    "bge": _bge,
    "t5-encoder": _t5_encoder,
    "deberta-v3": _deberta_v3,
}


def saved(arch: str, root: Path) -> Path:
    """A `save_pretrained` folder of the tiny `arch` (seed 0) under `root`, made once."""
    from tests.corpus.hf import save_once

    return save_once(root / f"{arch}-v{VERSION}", ARCHITECTURES[arch])


# --------------------------------------------------------------------------- zero-shot

PROMPTS = ["a photo of a cat", "a photo of coins", "a rocket on a launch pad", "printed text",
           "an eye's retina", "a street at night", "a bowl of soup", "a mountain lake"]  # fmt: skip


def zero_shot(build: Path, device: str, catalog_path: Path) -> dict:
    """Top-1 agreement of the two built towers' image-text similarities with the float
    towers' on the bundled held-out photographs and PROMPTS (word ids: the tiny models
    have no trained tokenizer)."""
    import numpy as np

    from winml_recipes.bundled import bundled_images
    from winml_recipes.catalog import entry_from_text
    from winml_recipes.feeds import from_images
    from winml_recipes.metrics.zeroshot import zero_shot_agreement
    from winml_recipes.runtime.sessions import run_model
    from winml_recipes.runtime.target import run_on_target

    entry = entry_from_text(catalog_path.read_text(), catalog_path)
    vision = entry.components["vision_model"].contract
    text = entry.components["text_model"].contract
    photos = list(bundled_images("heldout"))
    images = list(from_images(photos, vision, len(photos), 0)())
    texts = prompt_feeds(PROMPTS, text)
    out = {}
    for who in ("float", "target"):
        embeds = []
        for comp, feeds in (("vision_model", images), ("text_model", texts)):
            if who == "float":
                got = run_model(build / "float-reference" / comp / "model.onnx", feeds)
            else:
                got = run_on_target(build / comp / "model.onnx", feeds, device).outputs
            embeds.append(np.concatenate([next(iter(g.values())) for g in got]))
        out[who] = tuple(embeds)
    return zero_shot_agreement(out["float"], out["target"])


def prompt_feeds(prompts: list[str], contract) -> list[dict]:
    """Each prompt as word ids (a stable hash of each word into the vocabulary), padded to
    the component's sequence length, with the inputs the text graph takes."""
    import zlib

    import numpy as np

    length = int(contract.dims.get("sequence", 16))
    ids_spec = next(s for s in contract.inputs if s.name == "input_ids")
    vocab = int(ids_spec.range[1]) if ids_spec.range else 100
    feeds = []
    for prompt in prompts:
        words = [3 + zlib.crc32(w.encode()) % (vocab - 3) for w in prompt.split()][: length - 2]
        ids = np.zeros(length, np.int64)
        ids[0], ids[1 : len(words) + 1], ids[len(words) + 1] = 1, words, 2
        mask = (np.arange(length) <= len(words) + 1).astype(np.int64)
        feed = {"input_ids": ids[None], "attention_mask": mask[None]}
        feeds.append({s.name: feed[s.name] for s in contract.inputs})
    return feeds
