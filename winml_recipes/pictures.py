"""Pictures of a run (Pillow): the photo, the float result, the target's result and their
difference, with the metric in the caption. Masks for mask-generation (the float model's
best mask by iou_scores), top-5 labels for classification, class maps for segmentation."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from PIL import Image as PILImage

    from winml_recipes.buildfolder import BuildFolder
    from winml_recipes.pipeline import PipelineRun

PANEL = 320  # longest side of each panel, px
GUTTER = 8
TITLE = 24
LINE = 18
FLOAT_RGB = (40, 200, 90)
TARGET_RGB = (60, 130, 255)
ONLY_FLOAT_RGB = (235, 50, 50)
ONLY_TARGET_RGB = (50, 110, 255)
BOTH_RGB = (225, 225, 225)


def _font(size: int = 14):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow without FreeType: the fixed bitmap font
        return ImageFont.load_default()


def _fit(size: tuple[int, int]) -> tuple[int, int]:
    w, h = size
    scale = PANEL / max(w, h)
    return max(1, round(w * scale)), max(1, round(h * scale))


def _upsample(logits: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Mask logits (h, w) of the model's frame, bilinearly resized to `size` (w, h): the
    frame is the whole photo resized, so this lays the mask back on it."""
    from PIL import Image

    img = Image.fromarray(np.ascontiguousarray(logits, dtype=np.float32), mode="F")
    return np.asarray(img.resize(size, Image.Resampling.BILINEAR))


def _overlay(base: PILImage.Image, mask: np.ndarray, rgb: tuple[int, int, int]) -> PILImage.Image:
    arr = np.asarray(base.convert("RGB"), dtype=np.float32)
    arr[mask] = 0.45 * arr[mask] + 0.55 * np.asarray(rgb, np.float32)
    from PIL import Image

    return Image.fromarray(arr.astype(np.uint8))


def _difference(base: PILImage.Image, ref: np.ndarray, cand: np.ndarray) -> PILImage.Image:
    from PIL import Image

    grey = np.asarray(base.convert("L"), dtype=np.float32)[..., None].repeat(3, axis=2) * 0.35
    grey[ref & cand] = BOTH_RGB
    grey[ref & ~cand] = ONLY_FLOAT_RGB
    grey[~ref & cand] = ONLY_TARGET_RGB
    return Image.fromarray(grey.astype(np.uint8))


def _marks(img: PILImage.Image, about: dict[str, Any], scale: tuple[float, float]) -> None:
    """The prompts, in the panel's pixels: points (green fg, red bg) and boxes (yellow)."""
    from PIL import ImageDraw

    draw = ImageDraw.Draw(img)
    sx, sy = scale
    for b in about.get("boxes", []):
        draw.rectangle([b[0] * sx, b[1] * sy, b[2] * sx - 1, b[3] * sy - 1], outline=(250, 210, 0))
    for p in about.get("points", []):
        x, y = p["x"] * sx, p["y"] * sy
        fill = (0, 230, 0) if p["label"] == 1 else (230, 0, 0)
        draw.ellipse([x - 5, y - 5, x + 5, y + 5], fill=fill, outline=(0, 0, 0), width=2)


def compose(
    panels: Sequence[tuple[str, PILImage.Image]], caption: Sequence[str], out: Path
) -> Path:
    """Panels side by side under their titles, the caption lines below; saved as PNG."""
    from PIL import Image, ImageDraw

    width = sum(p.width for _, p in panels) + GUTTER * (len(panels) + 1)
    height_panels = max(p.height for _, p in panels)
    height = TITLE + height_panels + GUTTER * 2 + LINE * len(caption) + GUTTER
    canvas = Image.new("RGB", (width, height), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    font = _font()
    x = GUTTER
    for title, panel in panels:
        draw.text((x, 4), title, fill=(20, 20, 20), font=font)
        canvas.paste(panel, (x, TITLE))
        x += panel.width + GUTTER
    y = TITLE + height_panels + GUTTER
    for line in caption:
        draw.text((GUTTER, y), line, fill=(20, 20, 20), font=font)
        y += LINE
    out.parent.mkdir(parents=True, exist_ok=True)
    from winml_recipes.safewrite import save_fresh

    return save_fresh(out, lambda handle: canvas.save(handle, format="PNG"))


def _mask_component(build: BuildFolder) -> str | None:
    for comp in build.components:
        names = {s.name for s in comp.contract.outputs}
        if {"iou_scores", "pred_masks"} <= names:
            return comp.name
    return None


def _random_weights(build: BuildFolder) -> list[str]:
    """A caption line for a random-weight stand-in: its picture shows agreement only."""
    from winml_recipes.standin import random_weight_components

    if not random_weight_components(build.manifest.get("catalog"), build.manifest.get("source")):
        return []
    return ["random weights (a stand-in): this shows agreement with float, not a real result"]


def _ran(summary: dict[str, Any]) -> str:
    runs = summary.get("target_run", {})
    from winml_recipes.sdk.ep import ran_on_name

    where = sorted({ran_on_name(r) for r in runs.values()})  # the plugin's shown name
    files = sorted({Path(r["model"]).name for r in runs.values()})
    return f"{', '.join(where)} ({', '.join(files)})"


def _sqnr_text(summary: dict[str, Any], component: str, names: Sequence[str]) -> str:
    metrics = summary.get("components", {}).get(component, {})
    return ", ".join(f"{n} SQNR {metrics[n]['sqnr_db']:.1f} dB" for n in names if n in metrics)


def draw_masks(
    build: BuildFolder,
    photo: PILImage.Image,
    about: dict[str, Any],
    ref: PipelineRun | None,
    target: PipelineRun,
    summary: dict[str, Any],
    component: str,
    out: Path,
) -> Path:
    """Photo with prompts | float mask | target mask | difference; IoU in the caption."""
    size = _fit(photo.size)
    base = photo.convert("RGB").resize(size)
    scale = (size[0] / photo.size[0], size[1] / photo.size[1])
    t_out = target.outputs[component]
    r_out = ref.outputs[component] if ref is not None else t_out
    r_scores = np.asarray(r_out["iou_scores"]).reshape(-1)
    t_scores = np.asarray(t_out["iou_scores"]).reshape(-1)
    count = r_scores.shape[0]
    best, t_best = int(np.argmax(r_scores)), int(np.argmax(t_scores))
    r_masks = np.asarray(r_out["pred_masks"]).reshape(count, *np.shape(r_out["pred_masks"])[-2:])
    t_masks = np.asarray(t_out["pred_masks"]).reshape(count, *np.shape(t_out["pred_masks"])[-2:])
    r_mask = _upsample(r_masks[best], size) > 0
    t_mask = _upsample(t_masks[best], size) > 0
    photo_panel = base.copy()
    _marks(photo_panel, about, scale)
    panels = [("photo + prompt", photo_panel)]
    target_title = f"target {build.target_label}"
    caption = [f"{build.label}: target on {_ran(summary)}", *_random_weights(build)]
    if ref is not None:
        float_panel = _overlay(base, r_mask, FLOAT_RGB)
        target_panel = _overlay(base, t_mask, TARGET_RGB)
        for p in (float_panel, target_panel):
            _marks(p, about, scale)
        values = summary.get("task_metric", {}).get("values", {})
        iou = values.get("mask_iou")
        panels += [
            ("float (CPU)", float_panel),
            (target_title, target_panel),
            ("difference", _difference(base, r_mask, t_mask)),
        ]
        caption.append(
            f"mask IoU float vs target {iou:.3f}; mask #{best} (float's best by iou_scores), "
            f"target ranks #{t_best} best" + ("" if t_best == best else " (DIFFERENT)")
        )
        caption.append(_sqnr_text(summary, component, ("pred_masks", "iou_scores")))
        caption.append("difference: red = float only, blue = target only, light grey = both")
    else:
        target_panel = _overlay(base, t_mask, TARGET_RGB)
        _marks(target_panel, about, scale)
        panels.append((target_title, target_panel))
        caption.append(f"mask #{best} (best by iou_scores); the build ships the float model")
    return compose(panels, caption, out)


def _top5(values: np.ndarray) -> list[tuple[int, float]]:
    logits = np.asarray(values, dtype=np.float64).reshape(-1)
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    order = np.argsort(-probs)[:5]
    return [(int(i), float(probs[i])) for i in order]


def _text_panel(lines: Sequence[str], height: int) -> PILImage.Image:
    from PIL import Image, ImageDraw

    panel = Image.new("RGB", (PANEL, height), (248, 248, 248))
    draw = ImageDraw.Draw(panel)
    font = _font()
    for i, line in enumerate(lines):
        draw.text((8, 8 + i * (LINE + 4)), line, fill=(20, 20, 20), font=font)
    return panel


def draw_classes(
    build: BuildFolder,
    photo: PILImage.Image,
    ref: PipelineRun | None,
    target: PipelineRun,
    summary: dict[str, Any],
    component: str,
    output: str,
    out: Path,
) -> Path:
    """Photo | float top-5 | target top-5 (softmax), labels from the catalog when it has some."""
    labels = build.manifest.get("catalog", {}).get("labels") or []
    base = photo.convert("RGB").resize(_fit(photo.size))

    def names(top: list[tuple[int, float]]) -> list[str]:
        return [f"{labels[i] if i < len(labels) else f'class {i}'}: {p:.3f}" for i, p in top]

    t_top = _top5(target.outputs[component][output])
    panels = [("photo", base)]
    caption = [f"{build.label}: target on {_ran(summary)}", *_random_weights(build)]
    if ref is not None:
        r_top = _top5(ref.outputs[component][output])
        panels.append(("float (CPU) top-5", _text_panel(names(r_top), base.height)))
        same = [i for i, _ in r_top] == [i for i, _ in t_top]
        caption.append(
            f"top-1 {'agrees' if r_top[0][0] == t_top[0][0] else 'DIFFERS'}; top-5 order "
            f"{'identical' if same else 'differs'}; " + _sqnr_text(summary, component, (output,))
        )
    panels.append((f"target {build.target_label} top-5", _text_panel(names(t_top), base.height)))
    return compose(panels, caption, out)


def draw_run(
    build: BuildFolder,
    photo_path: Path,
    about: dict[str, Any],
    ref: PipelineRun | None,
    target: PipelineRun,
    summary: dict[str, Any],
    out: Path,
) -> Path | None:
    """The run's picture for the build's task (None: no picture for this kind of output)."""
    from winml_recipes.images import load_rgb

    photo = load_rgb(photo_path)
    component = _mask_component(build)
    if component is not None:
        return draw_masks(build, photo, about, ref, target, summary, component, out)
    if build.task and build.task.endswith("classification"):
        for comp in build.components:
            for name, value in target.outputs[comp.name].items():
                if np.ndim(value) == 2:
                    return draw_classes(build, photo, ref, target, summary, comp.name, name, out)
    return None
