"""SAM-style promptable segmenters (SAM, SAM 2.1, the SAM 3 tracker) as two ONNX graphs.

One exporter for every architecture; what differs between them is data (`SamArchitecture`).
The split and tensor names follow the onnx-community ONNX exports of these models:

- `vision_encoder`: `pixel_values` f32 [batch,3,S,S] -> the image embeddings, exactly what
  the model's `get_image_embeddings` returns. SAM 2.1 and the SAM 3 tracker give three levels
  `image_embeddings.0/.1/.2` (levels 0 and 1 already projected by the mask decoder's
  `conv_s0` / `conv_s1`, level 2 with `no_memory_embedding` added); SAM (v1) gives one,
  `image_embeddings`. So `decoder(vision(x)) == model(pixel_values=x, prompts)`.
- `prompt_encoder_mask_decoder`: `input_points` f32 [batch,1,points,2] (pixel coordinates of
  the S x S input), `input_labels` i64 [batch,1,points], `input_boxes` f32 [batch,1,4] (xyxy)
  and the embeddings -> `iou_scores` [batch,1,3], `pred_masks` [batch,1,3,h,w] (and, for SAM
  2.1 and SAM 3, `object_score_logits` [batch,1,1]), with `multimask_output=True`.

The pixel size is fixed by the config; `batch` and `points` are dynamic. Image preprocessing
(the catalog's `image:` block) is a square resize to S and the architecture's mean/std.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from winml_recipes.exporters import ExporterFamily
from winml_recipes.sdk.errors import SourceError

if TYPE_CHECKING:
    from winml_recipes.exporters import ExportOutput, ExportRequest

COMPONENTS = ("vision_encoder", "prompt_encoder_mask_decoder")
VISION_INPUTS = ("pixel_values",)
PROMPTS = ("input_points", "input_labels", "input_boxes")
LEVELS = ("image_embeddings.0", "image_embeddings.1", "image_embeddings.2")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _first(size: Any) -> int:
    return int(size[0] if isinstance(size, list | tuple) else size)


def _fpn_levels(config: Any) -> list[tuple[int, int, int]]:
    """(channels, h, w) of the three FPN levels (SAM 2.1, SAM 3): fpn/8 and fpn/4 after the
    mask decoder's conv_s0 / conv_s1, fpn for the last; sizes are backbone_feature_sizes."""
    vision = config.vision_config
    fpn = int(vision.fpn_hidden_size)
    sizes = [(int(h), int(w)) for h, w in vision.backbone_feature_sizes]
    return [(c, *hw) for c, hw in zip((fpn // 8, fpn // 4, fpn), sizes, strict=True)]


def _vit_level(config: Any) -> list[tuple[int, int, int]]:
    """(channels, g, g) of SAM's one embedding: the neck's output channels at image/patch."""
    vision = config.vision_config
    grid = _first(vision.image_size) // _first(vision.patch_size)
    return [(int(vision.output_channels), grid, grid)]


@dataclass(frozen=True)
class SamArchitecture:
    """What one SAM-style architecture differs in; the export itself is shared."""

    family: str  # exporter family name, = the catalog entry's `family:`
    model_type: str  # transformers' model_type
    model_class: str  # transformers' model class
    embeddings: tuple[str, ...]  # vision encoder outputs = the decoder's embedding inputs
    decoder_outputs: tuple[str, ...]
    levels: Callable[[Any], list[tuple[int, int, int]]]  # config -> (c, h, w) per embedding
    image_size: Callable[[Any], int]  # config -> the square input side in pixels
    mask_scale: int  # pred_masks side = mask_scale x the finest embedding's side
    mean: tuple[float, ...]
    std: tuple[float, ...]
    # Exact torch-level rewrites active while exporting (ops the NPU EPs refuse, written with
    # the ops they take); the export's parity check still compares with the original model.
    rewrites: Callable[[], contextlib.AbstractContextManager[None]] = field(
        default=contextlib.nullcontext
    )

    @property
    def decoder_inputs(self) -> tuple[str, ...]:
        return (*PROMPTS, *self.embeddings)


def _decomposed_rel_pos(
    self: Any, query: Any, rel_pos_h: Any, rel_pos_w: Any, q_size: Any, k_size: Any
) -> Any:
    """SamVisionAttention.get_decomposed_rel_pos with its two einsums as batched MatMuls
    (an NPU EP refuses Einsum): bhwc,hkc->bhwk is q @ R_h^T batched over h, bhwc,wkc->bhwk
    the same over w with q's h and w swapped. The same sums, so the same numbers."""
    query_height, query_width = q_size
    key_height, key_width = k_size
    rel_h_table = self.get_rel_pos(query_height, key_height, rel_pos_h)  # [h, k, c]
    rel_w_table = self.get_rel_pos(query_width, key_width, rel_pos_w)  # [w, k, c]
    batch_size, _, dim = query.shape
    q = query.reshape(batch_size, query_height, query_width, dim)
    rel_h = q @ rel_h_table.transpose(1, 2)  # [b,h,w,c] @ [h,c,k] -> [b,h,w,k]
    rel_w = (q.transpose(1, 2) @ rel_w_table.transpose(1, 2)).transpose(1, 2)
    return rel_h[:, :, :, :, None] + rel_w[:, :, :, None, :]


@contextlib.contextmanager
def _sam_without_einsum() -> Iterator[None]:
    from transformers.models.sam import modeling_sam

    cls = modeling_sam.SamVisionAttention
    original = cls.get_decomposed_rel_pos
    cls.get_decomposed_rel_pos = _decomposed_rel_pos
    try:
        yield
    finally:
        cls.get_decomposed_rel_pos = original


ARCHITECTURES: dict[str, SamArchitecture] = {
    a.family: a
    for a in (
        SamArchitecture(
            family="sam3_tracker",
            model_type="sam3_tracker",
            model_class="Sam3TrackerModel",
            embeddings=LEVELS,
            decoder_outputs=("iou_scores", "pred_masks", "object_score_logits"),
            levels=_fpn_levels,
            image_size=lambda config: _first(config.vision_config.image_size),
            mask_scale=1,
            mean=(0.5, 0.5, 0.5),
            std=(0.5, 0.5, 0.5),
        ),
        SamArchitecture(
            family="sam2",
            model_type="sam2",
            model_class="Sam2Model",
            embeddings=LEVELS,
            decoder_outputs=("iou_scores", "pred_masks", "object_score_logits"),
            levels=_fpn_levels,
            image_size=lambda config: _first(config.vision_config.backbone_config.image_size),
            mask_scale=1,
            mean=IMAGENET_MEAN,
            std=IMAGENET_STD,
        ),
        SamArchitecture(
            family="sam",
            model_type="sam",
            model_class="SamModel",
            embeddings=("image_embeddings",),
            decoder_outputs=("iou_scores", "pred_masks"),
            levels=_vit_level,
            image_size=lambda config: _first(config.vision_config.image_size),
            mask_scale=4,  # SAM's mask decoder upscales its embedding 4x
            mean=IMAGENET_MEAN,
            std=IMAGENET_STD,
            rewrites=_sam_without_einsum,
        ),
    )
}
BY_MODEL_TYPE = {a.model_type: a for a in ARCHITECTURES.values()}

# Example sizes for tracing. Batch 2 (not 1) keeps batch dynamic (FACTS.md); points 3 differs
# from every other example dim so no accidental specialization ties them together.
_TRACE_BATCH = 2
_TRACE_POINTS = 3


def load_model(arch: SamArchitecture, req: ExportRequest) -> Any:
    """The eval-mode fp32 model for `req` (pretrained or random weights)."""
    import transformers

    from winml_recipes.exporters import build_config, build_random, load_pretrained

    where = f"{arch.family}/{req.component}"
    model_class = getattr(transformers, arch.model_class)
    if req.model_id is not None:
        return load_pretrained(model_class, req.model_id, req.revision, where)
    assert req.config is not None
    config = build_config(req.config, arch.model_type, where)
    try:
        return build_random(lambda: model_class(config), req.seed)
    except Exception as exc:
        raise SourceError(
            f"cannot build {arch.model_class} from config ({type(config).__name__}): "
            f"{' '.join(str(exc).split())}; use a '{arch.model_type}' config",
            where=where,
        ) from exc


def embedding_shapes(arch: SamArchitecture, config: Any, batch: int) -> list[tuple[int, ...]]:
    return [(batch, c, h, w) for c, h, w in arch.levels(config)]


def _vision_module(model: Any) -> Any:
    import torch

    class VisionEncoder(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, ...]:
            out = self.inner.get_image_embeddings(pixel_values)
            return tuple(out) if isinstance(out, list | tuple) else (out,)

    return VisionEncoder(model)


def _decoder_module(model: Any, arch: SamArchitecture) -> Any:
    """Prompts + embeddings -> the architecture's outputs (one forward signature per number
    of embedding levels: torch.export names the graph inputs after the arguments)."""
    import torch

    outputs = arch.decoder_outputs

    def run(inner: Any, points: Any, labels: Any, boxes: Any, embeddings: Any) -> tuple:
        out = inner(
            image_embeddings=embeddings,
            input_points=points,
            input_labels=labels,
            input_boxes=boxes,
            multimask_output=True,
        )
        return tuple(getattr(out, name) for name in outputs)

    if len(arch.embeddings) == 1:

        class PromptEncoderMaskDecoder(torch.nn.Module):
            def __init__(self, inner: Any) -> None:
                super().__init__()
                self.inner = inner

            def forward(
                self,
                input_points: torch.Tensor,
                input_labels: torch.Tensor,
                input_boxes: torch.Tensor,
                image_embeddings: torch.Tensor,
            ) -> tuple[torch.Tensor, ...]:
                return run(self.inner, input_points, input_labels, input_boxes, image_embeddings)

        return PromptEncoderMaskDecoder(model)

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
        ) -> tuple[torch.Tensor, ...]:
            levels = [image_embeddings_0, image_embeddings_1, image_embeddings_2]
            return run(self.inner, input_points, input_labels, input_boxes, levels)

    return PromptEncoderMaskDecoder(model)


def export(arch: SamArchitecture, req: ExportRequest) -> ExportOutput:
    import torch

    from winml_recipes.exporters import torch_export

    model = load_model(arch, req)
    size = arch.image_size(model.config)
    gen = torch.Generator().manual_seed(0)
    b = _TRACE_BATCH
    if req.component == "vision_encoder":
        pixel_values = torch.rand(b, 3, size, size, generator=gen) * 2 - 1
        with arch.rewrites():
            return torch_export(
                _vision_module(model),
                (pixel_values,),
                input_names=VISION_INPUTS,
                output_names=arch.embeddings,
                dynamic_shapes=({0: "batch"},),
                opset=req.opset,
            )
    points = torch.rand(b, 1, _TRACE_POINTS, 2, generator=gen) * size
    labels = torch.tensor([[[1, 0, 1]]], dtype=torch.int64).repeat(b, 1, 1)  # fg, bg, fg
    boxes = torch.tensor([[[0.1, 0.2, 0.7, 0.9]]]).repeat(b, 1, 1) * size
    embeddings = [torch.randn(*s, generator=gen) for s in embedding_shapes(arch, model.config, b)]
    batch = {0: "batch"}
    return torch_export(
        _decoder_module(model, arch),
        (points, labels, boxes, *embeddings),
        input_names=arch.decoder_inputs,
        output_names=arch.decoder_outputs,
        dynamic_shapes=(
            {0: "batch", 2: "points"},
            {0: "batch", 2: "points"},
            batch,
            *[batch] * len(embeddings),
        ),
        opset=req.opset,
    )


def catalog_components(config: Any, preprocessor: dict | None = None) -> dict[str, dict[str, Any]]:
    """Catalog components (I/O contract and dims) for a SAM-style config, without weights;
    mean/std from `preprocessor` (a preprocessor_config.json) when it gives them."""
    arch = BY_MODEL_TYPE[config.model_type]
    size = arch.image_size(config)
    levels = arch.levels(config)
    embeddings = {
        name: {"dtype": "float32", "shape": ["batch", c, h, w]}
        for name, (c, h, w) in zip(arch.embeddings, levels, strict=True)
    }
    mask_h, mask_w = (arch.mask_scale * d for d in levels[0][1:])
    pre = preprocessor or {}
    mean = [float(v) for v in pre.get("image_mean") or arch.mean]
    std = [float(v) for v in pre.get("image_std") or arch.std]
    low = min((0.0 - m) / s for m, s in zip(mean, std, strict=True))
    high = max((1.0 - m) / s for m, s in zip(mean, std, strict=True))
    frame = [0.0, float(size)]
    outputs = {
        "iou_scores": {"dtype": "float32", "shape": ["batch", 1, 3]},
        "pred_masks": {"dtype": "float32", "shape": ["batch", 1, 3, mask_h, mask_w]},
        "object_score_logits": {"dtype": "float32", "shape": ["batch", 1, 1]},
    }
    return {
        "vision_encoder": {
            "dims": {"batch": 1},
            "inputs": {
                "pixel_values": {
                    "dtype": "float32",
                    "shape": ["batch", 3, size, size],
                    "range": [round(low, 4), round(high, 4)],
                    "image": {"size": size, "mean": mean, "std": std, "layout": "NCHW"},
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
            "outputs": {n: outputs[n] for n in arch.decoder_outputs},
        },
    }


def family(name: str) -> ExporterFamily:
    """The exporter family plugin of architecture `name` (pyproject.toml entry points)."""
    return ExporterFamily(name, COMPONENTS, partial(export, ARCHITECTURES[name]))


SAM = family("sam")
SAM2 = family("sam2")
SAM3_TRACKER = family("sam3_tracker")
