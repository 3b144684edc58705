"""Dense-prediction vision heads of the auto exporter: depth, segmentation, detection, SR.

`auto.TASKS` names the heads (`*ForDepthEstimation`, `*ForSemanticSegmentation`,
`*ForObjectDetection`, `*ForImageSuperResolution`); this module sizes them. The image size
comes from the folder's `preprocessor_config.json` (the size the processor resizes to,
`crop_size` when it crops; a {shortest_edge} size as a square; rounded to its
`ensure_multiple_of` / `size_divisor` / `pad_size`), else the config's `image_size`, else
384 (said in the entry's description). The same rule sizes the export's trace input and the
catalog's contract, so the two agree. The processor's rescale and normalization (an absent
`do_normalize: false` mean/std, a `rescale_factor` other than 1/255) are folded into the
catalog's `image:` block (scale to [0, 1], then (x - mean) / std).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from winml_recipes.sdk.errors import SourceError

DEPTH = "depth-estimation"
SEGMENTATION = "semantic-segmentation"
DETECTION = "object-detection"
SUPER_RESOLUTION = "image-to-image"
TASKS = (DEPTH, SEGMENTATION, DETECTION, SUPER_RESOLUTION)
# Entry task of detectors scored by a sigmoid per class (focal loss heads), top-k over
# queries x classes, as their processors' post_process_object_detection does; the others
# (DETR, YOLOS, Table Transformer) take a softmax whose last class means "no object".
SIGMOID_DETECTION = "object-detection-sigmoid"
SOFTMAX_DETECTORS = frozenset({"detr", "yolos", "table-transformer"})

GUESSED_SIDE = 384
# Semantic segmentation: the logits' stride against the input, per model_type.
_SEGMENTATION_STRIDE = {"segformer": lambda c: 4, "mobilevit": lambda c: c.output_stride}


def entry_task(config: Any, task: str) -> str:
    """The catalog entry's task (which picks verify's metric) for an auto component task."""
    if task != DETECTION:
        return task
    sigmoid = getattr(config, "use_focal_loss", config.model_type not in SOFTMAX_DETECTORS)
    return SIGMOID_DETECTION if sigmoid else DETECTION


def preprocessor_of(model_id: str | None, revision: str | None) -> dict | None:
    """A model's `preprocessor_config.json` (local folder or Hub), None when it has none."""
    from winml_recipes.modelfolder import check_config_file

    if model_id is None:
        return None
    folder = Path(model_id)
    if folder.is_dir():
        path = folder / "preprocessor_config.json"
        return check_config_file(path) if path.is_file() else None
    from winml_recipes.hub import download_file

    try:
        path, _ = download_file(model_id, "preprocessor_config.json", revision)
    except SourceError:
        return None
    return check_config_file(path)


def input_size(
    config: Any, preprocessor: Mapping[str, Any] | None, where: str = "config.json"
) -> tuple[int, int, bool]:
    """(height, width, guessed) of the image the model is traced and fed at."""
    from winml_recipes.exporters.fields import MAX_SIDE, _whole

    pre = dict(preprocessor or {})
    hw = _processor_size(pre)
    guessed = False
    if hw is None:
        size = getattr(config, "image_size", None)
        backbone = getattr(config, "backbone_config", None)
        size = size or getattr(backbone, "image_size", None)
        if size is None:
            size, guessed = GUESSED_SIDE, True
        hw = (size, size) if isinstance(size, int) else tuple(size)
    h, w = (_whole(v, f"image size[{i}]", where, MAX_SIDE) for i, v in enumerate(hw))
    for key, rounding in (
        ("ensure_multiple_of", round),
        ("size_divisor", math.floor),
        ("pad_size", math.ceil),
    ):
        m = pre.get(key)
        if isinstance(m, int) and not isinstance(m, bool) and 1 < m <= MAX_SIDE:
            h, w = (max(m, int(rounding(v / m)) * m) for v in (h, w))
    return h, w, guessed


def _processor_size(pre: Mapping[str, Any]) -> tuple[Any, Any] | None:
    key = "crop_size" if pre.get("crop_size") and pre.get("do_center_crop", True) else "size"
    size = pre.get(key) if pre.get("do_resize", True) or key == "crop_size" else None
    if isinstance(size, Mapping):
        if "height" in size and "width" in size:
            return size["height"], size["width"]
        side = size.get("shortest_edge") or size.get("longest_edge")
        return None if side is None else (side, side)
    if isinstance(size, list) and len(size) == 2:
        return size[0], size[1]
    if isinstance(size, int):
        return size, size
    return None


def image_block(
    preprocessor: Mapping[str, Any] | None, channels: int, hw: tuple[int, int], source: str
) -> dict[str, Any]:
    """The `image:` block: resize to `hw`, scale to [0, 1], (x - mean) / std, where mean and
    std fold in the processor's rescale factor and normalize flag."""
    from winml_recipes.exporters.fields import _numbers

    pre = dict(preprocessor or {})
    normalize = pre.get("do_normalize", True) is not False
    mean = _numbers(pre.get("image_mean", 0.0) if normalize else 0.0, "image_mean", source,
                    channels, False)  # fmt: skip
    std = _numbers(pre.get("image_std", 1.0) if normalize else 1.0, "image_std", source,
                   channels, True)  # fmt: skip
    factor = pre.get("rescale_factor", 1 / 255) if pre.get("do_rescale", True) else 1.0
    if not isinstance(factor, int | float) or isinstance(factor, bool) or not 0 < factor < 1e4:
        raise SourceError(f"rescale_factor is {factor!r}; expected a positive number", where=source)
    k = float(factor) * 255.0  # the model sees (pixel / 255 * k - mean) / std
    if abs(k - 1.0) > 1e-6:
        mean, std = [m / k for m in mean], [s / k for s in std]
    return {"size": [hw[0], hw[1]], "mean": mean, "std": std, "layout": "NCHW"}


def _field(config: Any, name: str, where: str, default: Any = None) -> int:
    from winml_recipes.exporters.fields import MAX_COUNT, _whole

    return _whole(getattr(config, name, default), name, where, MAX_COUNT)


def _outputs(config: Any, task: str, h: int, w: int, where: str) -> dict[str, list[Any]]:
    model_type = str(config.model_type)
    if task == DEPTH:
        p = getattr(config, "patch_size", None) if model_type in ("dpt", "depth_anything") else 1
        p = p if isinstance(p, int) and p > 0 else 1
        return {"predicted_depth": ["batch", h // p * p, w // p * p]}
    if task == SEGMENTATION:
        stride = _SEGMENTATION_STRIDE.get(model_type)
        if stride is None:
            raise SourceError(
                f"semantic segmentation of model_type '{model_type}': init knows the logits' "
                f"size of {', '.join(sorted(_SEGMENTATION_STRIDE))} only; write the catalog "
                "entry by hand (outputs.logits.shape)",
                where=where,
            )
        s = int(stride(config))
        labels = _field(config, "num_labels", where, 2)
        return {"logits": ["batch", labels, math.ceil(h / s), math.ceil(w / s)]}
    if task == DETECTION:
        name = "num_detection_tokens" if model_type == "yolos" else "num_queries"
        queries = _field(config, name, where)
        labels = _field(config, "num_labels", where, 2)
        extra = 1 if entry_task(config, task) == DETECTION else 0  # the no-object class
        return {
            "logits": ["batch", queries, labels + extra],
            "pred_boxes": ["batch", queries, 4],
        }
    scale = _field(config, "upscale", where, 1)
    out_channels = getattr(config, "num_channels_out", None) or _field(
        config, "num_channels", where, 3
    )
    return {"reconstruction": ["batch", out_channels, h * scale, w * scale]}


_DESCRIBE = {
    DEPTH: "predicted_depth: relative depth (or disparity) per pixel",
    SEGMENTATION: "logits: class scores per cell; argmax over axis 1, upsampled, is the label map",
    DETECTION: "logits: class scores per query (softmax, last class = no object); "
    "pred_boxes: (cx, cy, w, h) in [0, 1] of the input",
    SIGMOID_DETECTION: "logits: class scores per query (sigmoid per class); "
    "pred_boxes: (cx, cy, w, h) in [0, 1] of the input",
    SUPER_RESOLUTION: "reconstruction: the upscaled RGB image, clamp to [0, 1]",
}


def component(
    config: Any,
    task: str,
    preprocessor: Mapping[str, Any] | None,
    where: str,
    source: str = "preprocessor_config.json",
) -> dict[str, Any]:
    """The `model` component's I/O contract: `pixel_values` [batch, C, H, W] with its
    `image:` block, and the head's outputs at that size."""
    from winml_recipes.exporters.fields import MAX_CHANNELS, _whole

    if preprocessor is None:
        raise SourceError(
            f"{task} needs the model's preprocessor_config.json (image size, rescale, "
            "mean/std) beside config.json; copy it from the model's repository",
            where=where,
        )
    channels = _whole(getattr(config, "num_channels", 3), "num_channels", where, MAX_CHANNELS)
    h, w, guessed = input_size(config, preprocessor, where)
    image = image_block(preprocessor, channels, (h, w), source)
    lows = [(0.0 - m) / s for m, s in zip(image["mean"], image["std"], strict=True)]
    highs = [(1.0 - m) / s for m, s in zip(image["mean"], image["std"], strict=True)]
    note = f"RGB resized to {h}x{w}, scaled to [0, 1], (x - mean) / std"
    if preprocessor.get("do_flip_channel_order"):
        note += "; the model was trained on BGR (do_flip_channel_order): feed BGR at run time"
    if guessed:
        note += (
            f"; {h}x{w} is a guess (no size in preprocessor_config.json or config.json): add "
            "image_size: [H, W] to config.json to choose"
        )
    outputs = _outputs(config, task, h, w, where)
    described = _DESCRIBE[entry_task(config, task)]
    return {
        "task": task,
        "dims": {"batch": 1},
        "inputs": {
            "pixel_values": {
                "dtype": "float32",
                "shape": ["batch", channels, h, w],
                "range": [round(min(lows), 6), round(max(highs), 6)],
                "description": note,
                "image": image,
            }
        },
        "outputs": {
            n: {"dtype": "float32", "shape": s, "description": described}
            if i == 0
            else {"dtype": "float32", "shape": s}
            for i, (n, s) in enumerate(outputs.items())
        },
    }


def trace_size(model: Any, model_id: str | None, revision: str | None) -> tuple[int, int]:
    """The (height, width) the export traces at: the size `component` writes."""
    h, w, _ = input_size(model.config, preprocessor_of(model_id, revision))
    return h, w
