"""Bounds and checks for numbers read from a model's config files (config.json,
preprocessor_config.json): one-line errors naming the field, never a crash or a guess."""

from __future__ import annotations

from typing import Any

from winml_recipes.sdk.errors import SourceError
from winml_recipes.untrusted import printable

# Bounds for numbers read from a model's config files: larger is no input a model takes.
MAX_SIDE = 8192  # image height / width
MAX_CHANNELS = 64
MAX_COUNT = 1 << 24  # vocabulary, labels, hidden size
# Means and stds are on a 0-1 or 0-255 scale; these keep the normalized range finite (NaN
# fails every comparison, so it is refused too).
_MAX_STAT = 1e4
_MIN_STD = 1e-6


def _whole(value: Any, field: str, where: str, maximum: int) -> int:
    """`value` as a whole number from 1 to `maximum`, else a one-line error naming `field`."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise SourceError(
            f"{field} is {printable(repr(value))[:60]}; expected a whole number from 1 to "
            f"{maximum:,}",
            where=where,
        )
    return value


def _numbers(value: Any, field: str, where: str, channels: int, positive: bool) -> list[float]:
    """A mean or std: one number or one per channel, finite (and above 0 for `positive`)."""
    values = [value] if isinstance(value, int | float) and not isinstance(value, bool) else value
    if not isinstance(values, list) or len(values) not in (1, channels):
        raise SourceError(
            f"{field} is {printable(repr(value))[:60]}; expected a list of {channels} numbers",
            where=where,
        )
    out = []
    for i, v in enumerate(values):
        ok = isinstance(v, int | float) and not isinstance(v, bool) and abs(v) <= _MAX_STAT
        if not ok or (positive and v < _MIN_STD):
            need = (
                f"a number from {_MIN_STD:g} to {_MAX_STAT:g}"
                if positive
                else (f"a number from {-_MAX_STAT:g} to {_MAX_STAT:g}")
            )
            raise SourceError(
                f"{field}[{i}] is {printable(repr(v))[:40]}; expected {need}", where=where
            )
        out.append(float(v))
    return out * channels if len(out) == 1 else out
