"""What task a bare ONNX graph does, where its inputs and outputs say (`build --onnx`, `init`).

The task picks the task metric verify judges a build by (sdk/metrics.py). A guess needs
clear signs; anything else stays `unknown` (per-output SQNR / cosine gates), and
`--task` overrides.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

UNKNOWN = "unknown"
EMBEDDING_NAMES = ("sentence_embedding", "pooler_output", "embeddings", "embedding")


def guess_task(
    inputs: Mapping[str, Any],
    outputs: Mapping[str, Any],
    dims: Mapping[str, int] | None = None,
) -> tuple[str, str]:
    """(task, why) from a generated catalog component's `inputs` and `outputs` (the dicts
    `authoring.onnx_entry` writes: dtype, shape, image block) and the values of its named
    `dims` (the sizes it is built at)."""
    images = [n for n, t in inputs.items() if "image" in t]
    token_ids = "input_ids" in inputs
    shapes = {n: o.get("shape", []) for n, o in outputs.items()}
    line = _ctc_recognizer(inputs, shapes, dims or {})
    if line is not None:
        return "text-recognition", line
    heads = _detector(inputs, shapes)
    if heads is not None:
        return "object-detection", heads
    if len(images) == 1 and not token_ids:
        side = inputs[images[0]]["image"]["size"]
        flat = [n for n, s in shapes.items() if len(s) == 2 and _at_least(s[1], 2)]
        maps = [
            n
            for n, s in shapes.items()
            if len(s) == 4 and _at_least(s[1], 2) and list(s[2:]) == list(side)
        ]
        if len(shapes) == 1 and flat:
            return "image-classification", f"image input {images[0]}, one [batch, classes] output"
        if len(shapes) == 1 and maps:
            return (
                "semantic-segmentation",
                f"image input {images[0]}, one [batch, classes, H, W] output at the input's size",
            )
    if token_ids:
        named = [n for n in shapes if n in EMBEDDING_NAMES]
        if named:
            return "feature-extraction", f"token ids in, {named[0]} out"
        if list(shapes) == ["logits"] and len(shapes["logits"]) == 2:
            return "text-classification", "token ids in, [batch, classes] logits out"
    return UNKNOWN, "no clear sign in the graph's inputs and outputs"


def _at_least(dim: Any, value: int) -> bool:
    return isinstance(dim, int) and dim >= value


MIN_CTC_CLASSES = 10  # a CTC head scores at least the digits and the blank
MAX_LINE_HEIGHT = 128  # text-line recognizers take lines 32-64 pixels high


def _ctc_recognizer(
    inputs: Mapping[str, Any], shapes: Mapping[str, list], dims: Mapping[str, int]
) -> str | None:
    """Why the graph is a CTC line recognizer, else None: one float [N, 1|3, H, W] input
    shaped like a text line (W at least twice H, H at most 128) and one [N, T, classes]
    output with a static class axis (per-step class scores, greedy CTC-decodable)."""
    if len(inputs) != 1 or len(shapes) != 1:
        return None
    name, spec = next(iter(inputs.items()))
    shape = [dims.get(d, d) if isinstance(d, str) else d for d in spec.get("shape", [])]
    out_name, out = next(iter(shapes.items()))
    if not str(spec.get("dtype", "")).startswith("float") or len(shape) != 4 or len(out) != 3:
        return None
    channels, height, width = shape[1:]
    if channels not in (1, 3) or not (isinstance(height, int) and isinstance(width, int)):
        return None
    if not (
        height <= MAX_LINE_HEIGHT and width >= 2 * height and _at_least(out[2], MIN_CTC_CLASSES)
    ):
        return None
    return (
        f"a text line in ({name} {height}x{width}), {out[2]} class scores per step out "
        f"({out_name} [batch, time, classes]): a CTC recognizer"
    )


def _detector(inputs: Mapping[str, Any], shapes: Mapping[str, list]) -> str | None:
    """Why the graph is a detector, else None: one float [N, 3, H, W] input and the two
    outputs of a dense detection head box-f1 decodes: a 2-class score map beside a
    4-channel box map at the same size (MTCNN's P-Net)."""
    if len(inputs) != 1:
        return None
    name, spec = next(iter(inputs.items()))
    shape = spec.get("shape", [])
    if not str(spec.get("dtype", "")).startswith("float") or len(shape) != 4 or shape[1] != 3:
        return None
    maps = {n: s for n, s in shapes.items() if len(s) == 4 and s[1] in (2, 4)}
    if len(shapes) == 2 and len(maps) == 2:
        (a, sa), (b, sb) = maps.items()
        if {sa[1], sb[1]} == {2, 4} and list(sa[2:]) == list(sb[2:]):
            return f"image input {name}, a score map and a box map out ({a}, {b}): a detector"
    # (a lone [..., 4] output is not enough: MTCNN's O-Net gives box offsets beside a
    # face classifier's scores)
    return None


def known_tasks() -> list[str]:
    """Tasks a task metric judges (the plugins'), and `unknown` (per-output gates only)."""
    from winml_recipes.sdk.metrics import task_metrics

    return sorted({t for m in task_metrics().values() for t in m.tasks} | {UNKNOWN})


def check_task(task: str) -> str:
    """`task` when a task metric knows it, else a one-line error with the closest names."""
    import difflib

    from winml_recipes.sdk.errors import RecipeError

    known = known_tasks()
    if task in known:
        return task
    close = difflib.get_close_matches(task, known, n=2, cutoff=0.5)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    shown = repr(task) if task.strip() else "'' (empty)"
    raise RecipeError(f"--task {shown} is not a known task; {hint}known: {', '.join(known)}")


def task_help() -> str:
    """`build --task`'s help: every task a task metric judges (the registered plugins'),
    and `unknown`, so a new metric's tasks show without editing the CLI."""
    return (
        "With --onnx: the model's task, which picks the task metric verify judges it by: "
        f"{', '.join(known_tasks())} (default: guessed from the graph, else unknown)."
    )
