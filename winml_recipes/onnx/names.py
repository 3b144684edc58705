"""Stable names for nameless nodes (graphs from other exporters often have them).

onnxruntime's quantizer, mixed precision and every report address nodes by name; a
nameless node crashes them ("Node of type Flatten with output 0 _v_657 does not have a
name!"). Names are given once, when `normalize` first reads a model.
"""

from __future__ import annotations

import re

import onnx


def name_nodes(graph: onnx.GraphProto) -> int:
    """Name every nameless node `<op_type>_<first output>` (unique in the graph, subgraphs
    included); returns how many were named. Named nodes keep their names."""
    taken = {n.name for n in _nodes(graph) if n.name}
    named = 0
    for node in _nodes(graph):
        if node.name:
            continue
        stem = re.sub(r"\W", "_", f"{node.op_type}_{node.output[0] if node.output else 'node'}")
        name, k = stem, 1
        while name in taken:
            name, k = f"{stem}_{k}", k + 1
        node.name = name
        taken.add(name)
        named += 1
    return named


def _nodes(graph: onnx.GraphProto):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _nodes(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from _nodes(sub)
