"""What a rewrite stage replaced: rule name -> names of the nodes it replaced."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Node names listed per rule in the manifest; the count says how many there were in all.
MAX_LISTED_NODES = 20


@dataclass
class RewriteLog:
    """Node names per rule, in the order the rules replaced them."""

    nodes: dict[str, list[str]] = field(default_factory=dict)
    # Nodes a rule matched by op type but left as they were, with the reason.
    kept: list[dict[str, str]] = field(default_factory=list)

    def keep(self, rule: str, node_name: str | None, why: str) -> None:
        self.kept.append({"rule": rule, "node": node_name or "<unnamed>", "why": why})

    def add(self, rule: str, node_name: str | None) -> None:
        self.nodes.setdefault(rule, []).append(node_name or "<unnamed>")

    def count(self, rule: str) -> int:
        return len(self.nodes.get(rule, []))

    def to_metrics(self) -> list[dict[str, Any]]:
        """`[{rule, nodes, count}]`: at most MAX_LISTED_NODES names per rule."""
        return [
            {"rule": rule, "nodes": names[:MAX_LISTED_NODES], "count": len(names)}
            for rule, names in self.nodes.items()
        ]
