"""Tensor specifications: the I/O contract shared by catalog, inputs generation and verify."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from winml_recipes.sdk.errors import CatalogError

Dim = int | str


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of a component.

    `shape` holds ints (static) or names (dims whose values come from `dims` defaults or
    overrides). `range` is [low, high] for float/int inputs drawn uniformly; `values` is a
    closed set of allowed values (e.g. labels {-1, 0, 1}).
    """

    name: str
    dtype: str = "float32"
    shape: tuple[Dim, ...] = ()
    range: tuple[float, float] | None = None
    values: tuple[float, ...] | None = None
    image: ImagePreprocess | None = None
    audio: AudioPreprocess | None = None
    # outputs: the CTC blank class of a speech recognizer's logits (the tokenizer's pad)
    ctc_blank: int | None = None
    # outputs: the shape was read from the model file's declaration (generated entries), so a
    # float run that contradicts it is reported, not failed (verify)
    shape_advisory: bool = False


@dataclass(frozen=True)
class ImagePreprocess:
    """How an image file becomes this input: resize, scale to [0, 1], (x - mean) / std."""

    size: tuple[int, int]  # (height, width)
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)
    layout: str = "NCHW"


@dataclass(frozen=True)
class AudioPreprocess:
    """How speech becomes this input: the waveform at `sampling_rate`, through the Hugging
    Face feature extractor `feature_extractor` with `options` (its preprocessor_config.json
    fields): a normalized waveform, Whisper's log-mel or AST's filter bank."""

    feature_extractor: str
    sampling_rate: int = 16000
    options: tuple[tuple[str, object], ...] = ()


@dataclass(frozen=True)
class IOContract:
    """Inputs, outputs and default values of the named dims of one component."""

    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    dims: Mapping[str, int] = field(default_factory=dict)

    def input(self, name: str) -> TensorSpec | None:
        return next((s for s in self.inputs if s.name == name), None)


def resolve_shape(spec: TensorSpec, dims: Mapping[str, int]) -> tuple[int, ...]:
    """Concrete shape of `spec` given named dim values."""
    out: list[int] = []
    for d in spec.shape:
        if isinstance(d, int):
            out.append(d)
        elif d in dims:
            out.append(int(dims[d]))
        else:
            raise CatalogError(
                f"input '{spec.name}': dim '{d}' has no value; add it under 'dims' "
                f"or pass --shape {spec.name}=..."
            )
    return tuple(out)
