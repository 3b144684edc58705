"""Reading what came from outside (a Hub server, a model folder, a data folder) within bounds.

One place for the rules every untrusted text and JSON file follows: sizes and nesting depth are
checked before parsing, and control characters are escaped before anything is printed, so a
file or a server cannot hang the tool, exhaust its memory or forge lines on the user's terminal.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from winml_recipes.sdk.errors import WinmlError

# A config, a state file or a listing the tool reads is a few kB; 16 MB leaves room for
# tokenizer-sized files without letting a 300 MB file through.
MAX_JSON_BYTES = 16 << 20
# Real configs nest a handful of levels; Python's parser recurses per level.
MAX_JSON_DEPTH = 64

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


class UntrustedInputError(WinmlError):
    """A file or a response from outside the project is malformed, oversized or hostile."""


def printable(text: object) -> str:
    """`text` with control, line-separator and bidi characters escaped (`\\n`, `\\x1b`, ...)."""

    def escape(match: re.Match[str]) -> str:
        char = match.group(0)
        code = ord(char)
        named = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
        return named.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")

    return _CONTROL.sub(escape, str(text))


def json_depth_ok(text: str, max_depth: int = MAX_JSON_DEPTH) -> bool:
    """Whether `text`'s brackets nest at most `max_depth` deep (strings skipped), before parsing."""
    depth = 0
    in_string = False
    escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > max_depth:
                return False
        elif char in "]}":
            depth -= 1
    return True


def loads_bounded(
    text: str | bytes,
    what: str,
    *,
    max_bytes: int = MAX_JSON_BYTES,
    max_depth: int = MAX_JSON_DEPTH,
) -> Any:
    """Parse JSON from outside: size and depth checked first, one-line error naming `what`."""
    if len(text) > max_bytes:
        raise UntrustedInputError(
            f"{printable(what)}: {len(text):,} bytes of JSON, more than the {max_bytes:,} "
            "this tool reads; it is not a file a model or dataset needs"
        )
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UntrustedInputError(f"{printable(what)}: not UTF-8 text ({exc.reason})") from None
    if not json_depth_ok(text, max_depth):
        raise UntrustedInputError(
            f"{printable(what)}: JSON nested more than {max_depth} levels deep; refused"
        )
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise UntrustedInputError(f"{printable(what)}: not valid JSON ({printable(exc)})") from None


def read_json_bounded(
    path: Path,
    *,
    max_bytes: int = MAX_JSON_BYTES,
    max_depth: int = MAX_JSON_DEPTH,
    expect: type | None = dict,
) -> Any:
    """Read a JSON file from outside: its size is checked before it is read into memory.

    Only a regular file (after following links) is opened: a FIFO would block the open and
    `/dev/zero` would never end; at most `max_bytes + 1` bytes are read whatever stat said.
    """
    import stat

    try:
        info = path.stat()
    except OSError as exc:
        raise UntrustedInputError(f"{printable(path)}: cannot read ({exc.strerror})") from None
    if not stat.S_ISREG(info.st_mode):
        raise UntrustedInputError(
            f"{printable(path)}: not a regular file (a device, pipe or folder); refused"
        )
    if info.st_size > max_bytes:
        raise UntrustedInputError(
            f"{printable(path)}: {info.st_size:,} bytes, more than the {max_bytes:,} this tool "
            "reads from a JSON file; it is not a file a model or dataset needs"
        )
    try:
        with path.open("rb") as handle:
            raw = handle.read(max_bytes + 1)
    except OSError as exc:
        raise UntrustedInputError(f"{printable(path)}: cannot read ({exc.strerror})") from None
    data = loads_bounded(raw, str(path), max_bytes=max_bytes, max_depth=max_depth)
    if expect is not None and not isinstance(data, expect):
        raise UntrustedInputError(
            f"{printable(path)}: expected a JSON {_kind(expect)}, found {_kind(type(data))}"
        )
    return data


def _kind(kind: type) -> str:
    return {dict: "object", list: "array", str: "string", int: "number", float: "number"}.get(
        kind, kind.__name__
    )
