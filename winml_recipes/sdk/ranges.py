"""Tensors whose calibration ranges must be equal: what an EP's `QuantRules.adjust_ranges`
needs where the EP reads several tensors in one encoding (one scale and zero point)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping


class TiedTensors:
    """Sets of tensor names joined transitively (a disjoint-set forest)."""

    def __init__(self) -> None:
        self._parent: dict[str, str] = {}

    def find(self, name: str) -> str:
        parent = self._parent
        parent.setdefault(name, name)
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    def tie(self, members: list[str]) -> None:
        """Join `members` (and the sets they are in) into one set."""
        for other in members[1:]:
            self._parent[self.find(other)] = self.find(members[0])

    def groups(self) -> list[list[str]]:
        """The sets of two or more tensors, each sorted, in the order their first member
        was tied."""
        groups: dict[str, list[str]] = {}
        for name in self._parent:
            groups.setdefault(self.find(name), []).append(name)
        return [sorted(g) for g in groups.values() if len(g) > 1]


def unify_ranges(
    ranges: Mapping[str, tuple[float, float]], groups: Iterable[list[str]]
) -> dict[str, tuple[float, float]]:
    """Every member of a group gets the union of the group's ranges."""
    out = dict(ranges)
    for group in groups:
        known = [out[t] for t in group if t in out]
        if not known:
            continue
        low = min(lo for lo, _ in known)
        high = max(hi for _, hi in known)
        for t in group:
            out[t] = (low, high)
    return out
