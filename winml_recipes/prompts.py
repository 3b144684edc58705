"""SAM-style prompts given in the photo's own pixels, mapped to the model's input frame.

The model sees the photo resized to its input size (the catalog's `image:` block, e.g.
112 px for sam3-tiny, 1008 px for SAM 3), so a point (x, y) of a W x H photo is
(x * size_w / W, y * size_h / H) there: what SAM's processor does with its coordinates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from winml_recipes.sdk.errors import RecipeError

POINTS, LABELS, BOXES = "input_points", "input_labels", "input_boxes"
PADDING_LABEL = -1


@dataclass(frozen=True)
class Point:
    x: float
    y: float
    label: int = 1  # 1 foreground, 0 background


@dataclass(frozen=True)
class Box:
    x1: float
    y1: float
    x2: float
    y2: float


def _numbers(text: str, option: str, counts: tuple[int, ...]) -> list[float]:
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        values = []
    if len(values) not in counts:
        shape = {(2, 3): "X,Y[,LABEL]", (4,): "X1,Y1,X2,Y2"}[counts]
        raise RecipeError(f"{option} {text!r}: expected {shape} (pixels of the image)")
    return values


def parse_point(text: str) -> Point:
    """`X,Y` or `X,Y,LABEL` (label 1 foreground, 0 background)."""
    values = _numbers(text, "--point", (2, 3))
    label = int(values[2]) if len(values) == 3 else 1
    if label not in (0, 1):
        raise RecipeError(f"--point {text!r}: label must be 1 (foreground) or 0 (background)")
    return Point(values[0], values[1], label)


def parse_box(text: str) -> Box:
    x1, y1, x2, y2 = _numbers(text, "--box", (4,))
    if x2 <= x1 or y2 <= y1:
        raise RecipeError(f"--box {text!r}: needs x1 < x2 and y1 < y2")
    return Box(x1, y1, x2, y2)


def takes_prompts(input_names: Sequence[str]) -> bool:
    return POINTS in input_names and LABELS in input_names


@dataclass(frozen=True)
class Prompts:
    points: tuple[Point, ...]
    boxes: tuple[Box, ...]
    notes: tuple[str, ...] = ()


def default_prompts(
    points: Sequence[Point], boxes: Sequence[Box], image_wh: tuple[int, int]
) -> Prompts:
    """The prompts as given; without any, one foreground point at the image's centre. The
    graph always takes a box (one traced graph cannot make it optional): without one, the
    whole image."""
    notes = []
    if not points and not boxes:
        points = [Point(image_wh[0] / 2, image_wh[1] / 2, 1)]
        notes.append("no --point or --box: one foreground point at the image centre")
    if not boxes:
        boxes = [Box(0.0, 0.0, float(image_wh[0]), float(image_wh[1]))]
        notes.append("no --box: the whole image (the decoder graph always takes a box)")
    return Prompts(tuple(points), tuple(boxes), tuple(notes))


def prompt_feeds(
    prompts: Prompts,
    image_wh: tuple[int, int],
    frame_hw: tuple[int, int],
    static_points: int | None,
    box_slots: int | None = 1,
) -> dict[str, np.ndarray]:
    """input_points [1,1,P,2], input_labels [1,1,P], input_boxes [1,n,4] in the model's
    frame. Points are padded with label -1 up to a static P; more than P is an error."""
    sx, sy = frame_hw[1] / image_wh[0], frame_hw[0] / image_wh[1]
    points = list(prompts.points)
    if static_points is not None and len(points) > static_points:
        raise RecipeError(
            f"--point given {len(points)} times; this build takes at most {static_points} "
            "points (its shapes are static)"
        )
    if box_slots is not None and len(prompts.boxes) != box_slots:
        raise RecipeError(f"--box given {len(prompts.boxes)} times; this model takes {box_slots}")
    count = static_points or max(1, len(points))
    coords = np.zeros((1, 1, count, 2), np.float32)
    labels = np.full((1, 1, count), PADDING_LABEL, np.int64)
    for i, p in enumerate(points):
        coords[0, 0, i] = (p.x * sx, p.y * sy)
        labels[0, 0, i] = p.label
    boxes = np.array(
        [[[b.x1 * sx, b.y1 * sy, b.x2 * sx, b.y2 * sy] for b in prompts.boxes]], np.float32
    )
    return {POINTS: coords, LABELS: labels, BOXES: boxes}


# Synthetic prompts for calibration and verification, placed as people prompt: a
# foreground click on a jittered grid cell of the frame (a different cell per sample),
# then a background click elsewhere or padding, and a box around the foreground click.
PROMPT_GRID = 4
PROMPT_PLAN = f"{PROMPT_GRID}x{PROMPT_GRID} grid prompts: fg point, bg point or padding, box"


def synthetic_prompts(
    shapes: dict[str, tuple[int, ...]], frame: float, index: int, seed: int
) -> dict[str, np.ndarray]:
    """Points, labels and boxes (those of `shapes` the model takes) for sample `index`,
    in the model's `frame` (its input side in pixels)."""
    rng = np.random.default_rng([seed, index])
    points_shape = shapes[POINTS]
    rows = int(np.prod(points_shape[:-2]))  # every prompt of the sample (batch x 1)
    slots = points_shape[-2]
    cell = frame / PROMPT_GRID
    points = np.zeros((rows, slots, 2), np.float32)
    labels = np.full((rows, slots), PADDING_LABEL, np.int64)
    boxes = np.zeros((rows, 4), np.float32)
    for r in range(rows):
        k = (index * rows + r) * 7 % (PROMPT_GRID * PROMPT_GRID)  # 7 is coprime with 16
        fg = (np.array([k % PROMPT_GRID, k // PROMPT_GRID]) + 0.5) * cell
        fg = fg + rng.uniform(-cell / 4, cell / 4, 2)
        points[r, 0], labels[r, 0] = fg, 1
        if slots > 1 and (index + r) % 2 == 0:  # a background click in the opposite cell
            bg = frame - fg + rng.uniform(-cell / 4, cell / 4, 2)
            points[r, 1], labels[r, 1] = np.clip(bg, 0, frame), 0
        half = rng.uniform(0.12, 0.3, 2) * frame
        boxes[r] = np.clip([*(fg - half), *(fg + half)], 0, frame)
    out = {
        POINTS: points.reshape(points_shape),
        LABELS: labels.reshape(shapes[LABELS]) if LABELS in shapes else None,
        BOXES: boxes.reshape(shapes[BOXES]) if BOXES in shapes else None,
    }
    return {k: v for k, v in out.items() if v is not None}
