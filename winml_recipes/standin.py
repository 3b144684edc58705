"""Whether a build is a random-weight stand-in, and the words that say so.

A catalog component whose source is an HF `config:` (with a `seed:`) is built from seeded
random weights (sam3-tiny, sam3-mid, the `-tiny` twins): its build proves the plumbing and
the arithmetic on the target, but its masks, labels and pictures mean nothing. The console
summary and report.html say so from the manifest's catalog entry alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

RANDOM_WEIGHTS_NOTE = (
    "random weights: {names} {verb} built from a seeded random config (a stand-in for "
    "the real model), so the gates measure the arithmetic on the target, not the model's "
    "quality, and its pictures (masks, labels) are meaningless"
)


def _chosen_source(component: Mapping[str, Any], source: str | None) -> Mapping[str, Any]:
    """The source spec a build used: the named one, else the first of `sources`, else
    `source`."""
    named = component.get("sources") or {}
    if named:
        return named.get(source) or next(iter(named.values()))
    return component.get("source") or {}


def random_weight_components(catalog: Mapping[str, Any] | None, source: str | None) -> list[str]:
    """The components of a catalog entry (as the manifest records it) built from a random
    config, in order."""
    components = (catalog or {}).get("components") or {}
    return [
        name
        for name, comp in components.items()
        if isinstance(comp, Mapping) and "config" in _chosen_source(comp, source)
    ]


def random_weights_note(catalog: Mapping[str, Any] | None, source: str | None) -> str | None:
    """One line saying the build's weights are random, or None for real weights."""
    names = random_weight_components(catalog, source)
    if not names:
        return None
    verb = "is" if len(names) == 1 else "are"
    return RANDOM_WEIGHTS_NOTE.format(names=", ".join(names), verb=verb)
