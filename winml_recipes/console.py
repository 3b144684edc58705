"""Console lines that fit 80 columns: wrapped at spaces, never inside a word or a number.

A line longer than WIDTH continues on the next lines, indented four columns more than it
(so a summary's structure still reads); a single word longer than a line (a long path)
stands alone on its line, whole.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable

WIDTH = 80


def fit(line: str, width: int = WIDTH) -> list[str]:
    """`line` as lines of at most `width` columns (see the module docstring)."""
    if len(line) <= width:
        return [line]
    indent = " " * (len(line) - len(line.lstrip(" ")))
    return textwrap.wrap(
        line.strip(" "),
        width=width,
        initial_indent=indent,
        subsequent_indent=indent + "    ",
        break_long_words=False,
        break_on_hyphens=False,
    ) or [line]


def fit_all(lines: Iterable[str], width: int = WIDTH) -> list[str]:
    """Every line of `lines` fitted (see `fit`)."""
    return [part for line in lines for part in fit(line, width)]
