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


def guess_task(inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> tuple[str, str]:
    """(task, why) from a generated catalog component's `inputs` and `outputs` (the dicts
    `authoring.onnx_entry` writes: dtype, shape, image block)."""
    images = [n for n, t in inputs.items() if "image" in t]
    token_ids = "input_ids" in inputs
    shapes = {n: o.get("shape", []) for n, o in outputs.items()}
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
