"""SAM 3 tracker (transformers `Sam3TrackerModel`) as two ONNX graphs.

The split and the tensor names follow onnx-community/sam3-tracker-ONNX:

- `vision_encoder`: `pixel_values` f32 [batch,3,S,S] -> `image_embeddings.0/.1/.2`. These are
  exactly what `Sam3TrackerModel.get_image_embeddings` returns: the FPN levels 0 and 1 already
  projected by the mask decoder's `conv_s0` / `conv_s1`, and level 2 with the
  `no_memory_embedding` added, so `decoder(vision(x)) == model(pixel_values=x, prompts)`.
- `prompt_encoder_mask_decoder`: `input_points` f32 [batch,1,points,2] (pixel coordinates of
  the S x S input), `input_labels` i64 [batch,1,points], `input_boxes` f32 [batch,1,4] (xyxy)
  and the three embeddings -> `iou_scores` [batch,1,3], `pred_masks` [batch,1,3,h,w],
  `object_score_logits` [batch,1,1], with `multimask_output=True`.

The pixel size is fixed by the config; `batch` and `points` are dynamic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from winml_recipes.exporters import ExporterFamily
from winml_recipes.sdk.errors import SourceError

if TYPE_CHECKING:
    from winml_recipes.exporters import ExportOutput, ExportRequest

COMPONENTS = ("vision_encoder", "prompt_encoder_mask_decoder")

VISION_INPUTS = ("pixel_values",)
EMBEDDINGS = ("image_embeddings.0", "image_embeddings.1", "image_embeddings.2")
DECODER_INPUTS = ("input_points", "input_labels", "input_boxes", *EMBEDDINGS)
DECODER_OUTPUTS = ("iou_scores", "pred_masks", "object_score_logits")

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

# Example sizes for tracing. Batch 2 (not 1) keeps batch dynamic (FACTS.md); points 3 differs
# from every other example dim so no accidental specialization ties them together.
_TRACE_BATCH = 2
_TRACE_POINTS = 3


def load_model(req: ExportRequest) -> Any:
    """The eval-mode fp32 `Sam3TrackerModel` for `req` (pretrained or random weights)."""
    from winml_recipes.exporters import build_config, build_random, load_pretrained

    where = f"sam3_tracker/{req.component}"
    from transformers import Sam3TrackerModel

    if req.model_id is not None:
        return load_pretrained(Sam3TrackerModel, req.model_id, req.revision, where)
    assert req.config is not None
    config = build_config(req.config, "sam3_tracker", where)
    try:
        return build_random(lambda: Sam3TrackerModel(config), req.seed)
    except Exception as exc:
        raise SourceError(
            f"cannot build Sam3TrackerModel from config ({type(config).__name__}): "
            f"{' '.join(str(exc).split())}; use a 'sam3_tracker' config",
            where=where,
        ) from exc


def image_size(model: Any) -> int:
    size = model.config.vision_config.image_size
    return int(size[0] if isinstance(size, (list, tuple)) else size)


def embedding_shapes(model: Any, batch: int) -> list[tuple[int, ...]]:
    """Shapes of `image_embeddings.0/.1/.2` for `batch` images, from the module structure."""
    channels = [
        model.mask_decoder.conv_s0.out_channels,
        model.mask_decoder.conv_s1.out_channels,
        model.config.vision_config.fpn_hidden_size,
    ]
    sizes = model.config.vision_config.backbone_feature_sizes
    return [(batch, c, int(h), int(w)) for c, (h, w) in zip(channels, sizes, strict=False)]


def _vision_module(model: Any) -> Any:
    import torch

    class VisionEncoder(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return tuple(self.inner.get_image_embeddings(pixel_values))

    return VisionEncoder(model)


def _decoder_module(model: Any) -> Any:
    import torch

    class PromptEncoderMaskDecoder(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(
            self,
            input_points: torch.Tensor,
            input_labels: torch.Tensor,
            input_boxes: torch.Tensor,
            image_embeddings_0: torch.Tensor,
            image_embeddings_1: torch.Tensor,
            image_embeddings_2: torch.Tensor,
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            out = self.inner(
                image_embeddings=[image_embeddings_0, image_embeddings_1, image_embeddings_2],
                input_points=input_points,
                input_labels=input_labels,
                input_boxes=input_boxes,
                multimask_output=True,
            )
            return out.iou_scores, out.pred_masks, out.object_score_logits

    return PromptEncoderMaskDecoder(model)


def export(req: ExportRequest) -> ExportOutput:
    import torch

    from winml_recipes.exporters import torch_export

    model = load_model(req)
    size = image_size(model)
    gen = torch.Generator().manual_seed(0)
    b = _TRACE_BATCH
    if req.component == "vision_encoder":
        pixel_values = torch.rand(b, 3, size, size, generator=gen) * 2 - 1
        return torch_export(
            _vision_module(model),
            (pixel_values,),
            input_names=VISION_INPUTS,
            output_names=EMBEDDINGS,
            dynamic_shapes=({0: "batch"},),
            opset=req.opset,
        )
    points = torch.rand(b, 1, _TRACE_POINTS, 2, generator=gen) * size
    labels = torch.tensor([[[1, 0, 1]]], dtype=torch.int64).repeat(b, 1, 1)  # fg, bg, fg
    boxes = torch.tensor([[[0.1, 0.2, 0.7, 0.9]]]).repeat(b, 1, 1) * size
    embeddings = [torch.randn(*s, generator=gen) for s in embedding_shapes(model, b)]
    batch = {0: "batch"}
    return torch_export(
        _decoder_module(model),
        (points, labels, boxes, *embeddings),
        input_names=DECODER_INPUTS,
        output_names=DECODER_OUTPUTS,
        dynamic_shapes=(
            {0: "batch", 2: "points"},
            {0: "batch", 2: "points"},
            batch,
            batch,
            batch,
            batch,
        ),
        opset=req.opset,
    )


def catalog_components(config: Any) -> dict[str, dict[str, Any]]:
    """Catalog components (I/O contract and dims) for a Sam3TrackerConfig, without weights.

    Embedding channels follow the mask decoder: fpn/8 and fpn/4 for the two high-resolution
    levels (conv_s0, conv_s1), fpn for the last; spatial sizes are backbone_feature_sizes.
    """
    vision = config.vision_config
    size = vision.image_size
    size = int(size[0] if isinstance(size, (list, tuple)) else size)
    fpn = int(vision.fpn_hidden_size)
    levels = [
        (fpn // 8, *vision.backbone_feature_sizes[0]),
        (fpn // 4, *vision.backbone_feature_sizes[1]),
        (fpn, *vision.backbone_feature_sizes[2]),
    ]
    embeddings = {
        name: {"dtype": "float32", "shape": ["batch", c, int(h), int(w)]}
        for name, (c, h, w) in zip(EMBEDDINGS, levels, strict=True)
    }
    mask_h, mask_w = (int(d) for d in vision.backbone_feature_sizes[0])
    frame = [0.0, float(size)]
    return {
        "vision_encoder": {
            "dims": {"batch": 1},
            "inputs": {
                "pixel_values": {
                    "dtype": "float32",
                    "shape": ["batch", 3, size, size],
                    "range": [-1.0, 1.0],
                    "image": {"size": size, "mean": [0.5] * 3, "std": [0.5] * 3},
                }
            },
            "outputs": {
                n: {"dtype": "float32", "shape": s["shape"]} for n, s in embeddings.items()
            },
        },
        "prompt_encoder_mask_decoder": {
            "dims": {"batch": 1, "points": 2},
            "inputs": {
                "input_points": {
                    "dtype": "float32",
                    "shape": ["batch", 1, "points", 2],
                    "range": frame,
                },
                "input_labels": {
                    "dtype": "int64",
                    "shape": ["batch", 1, "points"],
                    "values": [-1, 0, 1],
                },
                "input_boxes": {"dtype": "float32", "shape": ["batch", 1, 4], "range": frame},
                **{n: {**s, "range": [-1.0, 1.0]} for n, s in embeddings.items()},
            },
            "outputs": {
                "iou_scores": {"dtype": "float32", "shape": ["batch", 1, 3]},
                "pred_masks": {"dtype": "float32", "shape": ["batch", 1, 3, mask_h, mask_w]},
                "object_score_logits": {"dtype": "float32", "shape": ["batch", 1, 1]},
            },
        },
    }


FAMILY = ExporterFamily("sam3_tracker", COMPONENTS, export)
