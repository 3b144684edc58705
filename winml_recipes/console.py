"""Console lines that fit 80 columns: wrapped at spaces, never inside a word or a number.

A line longer than WIDTH continues on the next lines, indented four columns more than it
(so a summary's structure still reads); a number stays on the line of its unit ("23 s");
a single word longer than a line (a long path) stands alone on its line, whole.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterable

WIDTH = 80
GLUE = "\xa0"  # textwrap does not break here: a number stays with its unit
_UNIT = re.compile(r"(\d) (s|ms|MB|GB|kB|B|dB|%|nodes|samples)\b")


def fit(line: str, width: int = WIDTH) -> list[str]:
    """`line` as lines of at most `width` columns (see the module docstring)."""
    if len(line) <= width:
        return [line]
    indent = " " * (len(line) - len(line.lstrip(" ")))
    glued = _UNIT.sub(lambda m: f"{m.group(1)}{GLUE}{m.group(2)}", line.strip(" "))
    parts = textwrap.wrap(
        glued,
        width=width,
        initial_indent=indent,
        subsequent_indent=indent + "    ",
        break_long_words=False,
        break_on_hyphens=False,
    )
    return [p.replace(GLUE, " ") for p in parts] or [line]


def fit_all(lines: Iterable[str], width: int = WIDTH) -> list[str]:
    """Every line of `lines` fitted (see `fit`)."""
    return [part for line in lines for part in fit(line, width)]
