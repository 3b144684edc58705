"""What the presets say about a target, for passes: the precisions of a kind (float,
quantized), a device's and a precision's settings.

A facade over presets.py (see services/models.py for why passes import from here).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names, for type checkers and editors
    from winml_recipes.presets import device_settings, precision_settings, precisions_of_kind

__all__ = ["device_settings", "precision_settings", "precisions_of_kind"]


def __getattr__(name: str) -> Any:
    """The implementation of `name`, imported when first asked for."""
    if name in ("device_settings", "precision_settings", "precisions_of_kind"):
        from winml_recipes import presets as module

        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
