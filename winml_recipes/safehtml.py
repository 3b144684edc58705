"""The one way the report makes HTML: a template of the module's own markup, every value
escaped unless it is a fragment made here (markupsafe's autoescaping formatter, the one
Jinja2 uses). A build folder's manifest is untrusted input, so no value from it can add
markup (a <meta> refresh, a <style>) to a page."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from markupsafe import Markup

__all__ = ["Markup", "h", "join"]


def h(template: str, *args: Any, **kwargs: Any) -> Markup:
    """`template` is the caller's markup (a literal, never data); every argument is
    escaped unless it is a fragment `h` made."""
    return Markup(template).format(*args, **kwargs)


def join(parts: Iterable[Any], sep: str = "") -> Markup:
    """Fragments joined (a plain string among them is escaped)."""
    return Markup(sep).join(parts)
