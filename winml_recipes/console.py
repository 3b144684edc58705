"""Console lines that fit 80 columns: wrapped at spaces, never inside a word or a number.

On a terminal the width is 80 (or the terminal's, when narrower); output to a pipe or a
file is not wrapped (scripts and logs read whole lines). `WINML_RECIPES_COLUMNS` sets a
width anywhere (a test standing in for a terminal). Not `COLUMNS`: readline sets it in the
environment of whatever process loads it, and every child inherits it, pipes included.

A line longer than WIDTH continues on the next lines, indented four columns more than it
(so a summary's structure still reads); a number stays on the line of its unit ("23 s");
a single word longer than a line (a long path) stands alone on its line, whole.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import sys
import textwrap
from collections.abc import Iterable, Iterator

WIDTH = 80
COLUMNS_ENV = "WINML_RECIPES_COLUMNS"
GLUE = "\xa0"  # textwrap does not break here: a number stays with its unit
_UNIT = re.compile(r"(\d) (s|ms|MB|GB|kB|B|dB|%|nodes|samples)\b")
_COMPARED = re.compile(r"(>=|<=|<|>) ([-+]?\d)")  # a gate's comparison stays with its number


def console_width() -> int | None:
    """The columns console lines wrap at (None: not wrapped; see the module docstring)."""
    given = os.environ.get(COLUMNS_ENV, "")
    if given.isdigit() and int(given) >= 20:
        return int(given)
    if sys.stdout.isatty():
        return min(WIDTH, shutil.get_terminal_size((WIDTH, 24)).columns)
    return None


def fit(line: str, width: int | None = WIDTH) -> list[str]:
    """`line` as lines of at most `width` columns (None: as it is; see the module
    docstring)."""
    if width is None or len(line) <= width:
        return [line]
    indent = " " * (len(line) - len(line.lstrip(" ")))
    glued = _UNIT.sub(lambda m: f"{m.group(1)}{GLUE}{m.group(2)}", line.strip(" "))
    glued = _COMPARED.sub(lambda m: f"{m.group(1)}{GLUE}{m.group(2)}", glued)
    parts = textwrap.wrap(
        glued,
        width=width,
        initial_indent=indent,
        subsequent_indent=indent + "    ",
        break_long_words=False,
        break_on_hyphens=False,
    )
    return [p.replace(GLUE, " ") for p in parts] or [line]


def fit_all(lines: Iterable[str], width: int | None = None) -> list[str]:
    """Every line of `lines` fitted to `width` (default: `console_width()`)."""
    width = width if width is not None else console_width()
    return [part for line in lines for part in fit(line, width)]


@contextlib.contextmanager
def quiet_stdout() -> Iterator[None]:
    """Swallow progress chatter on stdout; replay it on stderr if the block fails."""
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            yield
    except BaseException:
        if buf.getvalue():
            sys.stderr.write(buf.getvalue())
        raise
