"""Bisect a graph an execution provider cannot finalize to the smallest failing region.

An NPU EP fails some graphs at session creation with an error that names no node (e.g.
"Failed to finalize ... graph", a memory-allocation error code). The graph is cut into
pieces that each load on the EP in a fresh process (a failed finalize can leave native state
behind, and a child bounds the memory): a binary search over growing prefixes in topological
order finds the first node whose prefix fails, then a second one over the region's start
finds the shortest failing region that ends there. About 2 log2(nodes) loads; capped.

Quantized graphs are cut so that every piece is a valid QDQ graph: a QuantizeLinear and its
DequantizeLinear stay together, a piece that ends at a quantized tensor ends after its Q/DQ
pair (float output), and a piece whose input a DequantizeLinear reads starts with that pair
(float input). The graph is rebuilt from protobuf with `onnx.utils.Extractor` (it copies the
nodes between given inputs and outputs with their initializers and shapes), which is what
this needs; onnx_ir has no extraction of a node range with new graph inputs.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from winml_recipes.sdk.errors import ExecutionProviderError

MAX_LOADS = 24  # 2 log2(nodes) + 2 for 2,000 compute nodes
MAX_SECONDS = 900.0  # the whole search; a load that starts before the deadline finishes
LOAD_TIMEOUT_SECONDS = 600.0
MAX_NODES_SHOWN = 5
_QDQ = ("QuantizeLinear", "DequantizeLinear")
_NOT_COMPUTE = (*_QDQ, "Constant")
# An error that names no node: a finalize failure, or a refusal whose nodes were unknown.
_UNNAMED = re.compile(r"failed to finalize|finalize.*graph|refused some node\(s\): unknown", re.I)
_CODE = re.compile(r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]*ERROR[A-Z0-9_]*\b")


Progress = Callable[[str, int, int | None], None]


def is_unnamed_failure(message: str) -> bool:
    """Whether an EP's session error names no node (what bisection is for)."""
    return bool(_UNNAMED.search(message))


def failure_code(message: str) -> str:
    """The EP's error code in a message (e.g. ..._ERROR_MEM_ALLOC), else a short phrase."""
    found = _CODE.search(message)
    return found.group(0) if found else "no node named"


@dataclass(frozen=True)
class Region:
    """The smallest failing region found: compute nodes in graph order, the last one first
    in `culprit` (the node whose prefix first fails)."""

    nodes: tuple[tuple[str, str], ...]  # (name, op_type), graph order
    loads: int
    seconds: float
    complete: bool  # False: the load cap or the deadline stopped the search early
    note: str = ""  # why incomplete, or pieces that failed another way
    graph_nodes: int = 0

    @property
    def culprit(self) -> tuple[str, str]:
        return self.nodes[-1]

    @property
    def op_types(self) -> list[str]:
        return list(dict.fromkeys(t for _, t in self.nodes))

    def describe(self) -> str:
        """`node_x (ScatterElements) [+2 nodes: a (Add), b (Mul)]`."""
        name, op = self.culprit
        text = f"{name} ({op})"
        others = list(self.nodes[:-1])
        if others:
            shown = ", ".join(f"{n} ({t})" for n, t in others[-MAX_NODES_SHOWN:])
            more = len(others) - MAX_NODES_SHOWN
            text += f" [+{len(others)} node(s): {'... ' if more > 0 else ''}{shown}]"
        return text

    def to_record(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "culprit": {"name": self.culprit[0], "op_type": self.culprit[1]},
            "nodes": [{"name": n, "op_type": t} for n, t in self.nodes[-50:]],
            "region_nodes": len(self.nodes),
            "graph_nodes": self.graph_nodes,
            "loads": self.loads,
            "seconds": round(self.seconds, 1),
            "complete": self.complete,
        }
        if self.note:
            out["note"] = self.note
        return out


class GraphCutter:
    """Pieces of one graph, cut between compute nodes with Q/DQ pairs kept whole."""

    def __init__(self, model: onnx.ModelProto) -> None:
        model = _with_shapes(model)
        _reorder_pairs(model.graph)
        self.model = model
        self.nodes = list(model.graph.node)
        self.constants = {t.name for t in model.graph.initializer}
        self.graph_outputs = {o.name for o in model.graph.output}
        self.producer = {o: i for i, n in enumerate(self.nodes) for o in n.output if o}
        self.consumers: dict[str, list[int]] = {}
        for i, node in enumerate(self.nodes):
            for name in node.input:
                if name:
                    self.consumers.setdefault(name, []).append(i)
        # Nodes that read only constants (weight DequantizeLinear, Constant, ...) go into a
        # piece with their consumers; the others are the positions a piece starts or ends at.
        self.static: set[int] = set()
        for i, node in enumerate(self.nodes):
            if all(self._constant(n) or self.producer.get(n) in self.static for n in node.input):
                self.static.add(i)
        self.units = [
            i
            for i, n in enumerate(self.nodes)
            if i not in self.static and n.op_type not in _NOT_COMPUTE
        ]
        self._unit_set = set(self.units)
        self.extractor = onnx.utils.Extractor(model)
        self.typed = set(self.extractor.value_infos)

    def node_id(self, index: int) -> tuple[str, str]:
        node = self.nodes[index]
        return node.name or (node.output[0] if node.output else f"#{index}"), node.op_type

    def _constant(self, name: str) -> bool:
        return not name or name in self.constants

    def members(self, start: int, end: int) -> set[int]:
        """Compute nodes start..end, with the Q/DQ pairs around them and the constant-only
        nodes they read (so no piece splits a pair or reads a weight as an input)."""
        chosen = {i for i in range(start, end + 1) if i in self._unit_set}
        todo = list(chosen)
        while todo:
            node = self.nodes[todo.pop()]
            near: list[int] = []
            for name in node.input:  # backward: a DQ (and its Q) or a constant producer
                p = self.producer.get(name)
                if p is not None and (p in self.static or self.nodes[p].op_type in _QDQ):
                    near.append(p)
            for name in node.output:  # forward: the Q/DQ pair quantizing an output
                near += [c for c in self.consumers.get(name, []) if self.nodes[c].op_type in _QDQ]
            for i in near:
                if i not in chosen:
                    chosen.add(i)
                    todo.append(i)
        return chosen

    def boundary(self, start: int, end: int) -> tuple[list[str], list[str]] | None:
        """The inputs and outputs of the piece start..end, or None when one has no type."""
        chosen = self.members(start, end)
        produced = {o for i in chosen for o in self.nodes[i].output if o}
        inputs: list[str] = []
        outputs: list[str] = []
        for i in sorted(chosen):
            for name in self.nodes[i].input:
                if name and name not in produced | self.constants and name not in inputs:
                    inputs.append(name)
            for name in self.nodes[i].output:
                if not name:
                    continue
                outside = any(c not in chosen for c in self.consumers.get(name, []))
                if (outside or name in self.graph_outputs) and name not in outputs:
                    outputs.append(name)
        if not outputs or any(n not in self.typed for n in inputs + outputs):
            return None
        return inputs, outputs

    def piece(self, start: int, end: int) -> onnx.ModelProto:
        """Nodes start..end (indices into `nodes`) as a model (`boundary` must be known)."""
        found = self.boundary(start, end)
        assert found is not None
        return self.extractor.extract_model(*found)


def _with_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy with every intermediate's type and shape (onnx shape inference)."""
    from onnx import shape_inference

    try:
        if model.ByteSize() < 2**31 - 1:
            return shape_inference.infer_shapes(model, data_prop=True)
    except (ValueError, onnx.shape_inference.InferenceError):
        pass
    # Larger than protobuf's limit (or inference failed): infer through files.
    with tempfile.TemporaryDirectory(prefix="winml-shapes-") as tmp:
        from winml_recipes.onnx.io import load_model, save_model

        src = save_model(model, Path(tmp) / "m.onnx")
        shape_inference.infer_shapes_path(str(src), str(Path(tmp) / "s.onnx"))
        return load_model(Path(tmp) / "s.onnx")


def _reorder_pairs(graph: onnx.GraphProto) -> None:
    """Put each DequantizeLinear right after the QuantizeLinear it reads (a topological
    order in which no cut between compute nodes separates a pair)."""
    nodes = list(graph.node)
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in nodes:
        if node.op_type == "DequantizeLinear" and node.input:
            readers.setdefault(node.input[0], []).append(node)
    producers = {o for n in nodes if n.op_type == "QuantizeLinear" for o in n.output}
    placed: set[int] = set()
    order: list[onnx.NodeProto] = []
    for node in nodes:
        if id(node) in placed:
            continue
        if node.op_type == "DequantizeLinear" and node.input and node.input[0] in producers:
            continue  # placed after its Q
        order.append(node)
        placed.add(id(node))
        if node.op_type == "QuantizeLinear":
            for dq in readers.get(node.output[0], []):
                order.append(dq)
                placed.add(id(dq))
    graph.ClearField("node")
    graph.node.extend(order)


@dataclass
class _Search:
    """Loads pieces in child processes, counting loads against the caps."""

    cutter: GraphCutter
    ep_key: str
    fallback: bool
    provider_options: Mapping[str, str]
    work: Path
    max_loads: int
    deadline: float
    progress: Progress
    loads: int = 0
    other: list[str] = field(default_factory=list)  # pieces that failed another way

    def exhausted(self) -> bool:
        return self.loads >= self.max_loads or time.monotonic() >= self.deadline

    def fails(self, start: int, end: int) -> bool:
        """Whether nodes start..end fail the same way (an error naming no node)."""
        from winml_recipes.onnx.io import save_model

        model = self.cutter.piece(start, end)
        path = save_model(model, self.work / f"piece{self.loads}" / "model.onnx")
        error = load_in_child(path, self.ep_key, self.fallback, self.provider_options)
        self.loads += 1
        self.progress("bisection loads", self.loads, self.max_loads)
        if error is None:
            return False
        if is_unnamed_failure(error):
            return True
        if len(self.other) < 3:
            self.other.append(error[:160])
        return False


def bisect_failure(
    path: Path | str,
    ep_key: str,
    *,
    fallback: bool = False,
    provider_options: Mapping[str, str] | None = None,
    max_loads: int = MAX_LOADS,
    max_seconds: float = MAX_SECONDS,
    progress: Progress | None = None,
) -> Region | None:
    """The smallest region of `path` that fails to load on `ep_key` with an error naming no
    node, or None when the graph has no compute node or no prefix of it fails that way."""
    from winml_recipes.onnx.io import load_model

    started = time.monotonic()
    cutter = GraphCutter(load_model(path))
    units = cutter.units
    if not units:
        return None
    with tempfile.TemporaryDirectory(prefix="winml-bisect-") as tmp:
        search = _Search(
            cutter,
            ep_key,
            fallback,
            dict(provider_options or {}),
            Path(tmp),
            max_loads,
            started + max_seconds,
            progress or (lambda *_: None),
        )
        # The whole graph is known to fail: the first prefix end that fails, then the
        # latest start that still fails with that end. Cuts whose boundary has no known
        # type are skipped.
        ends = [k for k in range(len(units) - 1) if cutter.boundary(0, units[k]) is not None]
        ends.append(len(units) - 1)
        lo, hi = -1, len(ends) - 1  # positions in `ends`: lo loads (empty), hi fails
        while hi - lo > 1 and not search.exhausted():
            mid = (lo + hi) // 2
            if search.fails(0, units[ends[mid]]):
                hi = mid
            else:
                lo = mid
        end = ends[hi]
        if hi - lo > 1:  # stopped early: the region is everything between the two cuts
            start, complete = (ends[lo] + 1 if lo >= 0 else 0), False
        else:
            start, complete = _shrink(search, end)
    nodes = tuple(cutter.node_id(units[k]) for k in range(start, end + 1))
    notes = []
    if not complete:
        notes.append(f"stopped after {search.loads} loads (cap {max_loads}, {max_seconds:.0f} s)")
    if search.other:
        notes.append("pieces that failed another way: " + " | ".join(search.other))
    return Region(
        nodes,
        search.loads,
        time.monotonic() - started,
        complete,
        "; ".join(notes),
        len(units),
    )


def _shrink(search: _Search, end: int) -> tuple[int, bool]:
    """The latest start whose region ..end still fails (the prefix 0..end fails), and
    whether the search finished."""
    units, cutter = search.cutter.units, search.cutter
    starts = [k for k in range(end + 1) if cutter.boundary(units[k], units[end]) is not None]
    if not starts or starts[0] != 0:
        starts.insert(0, 0)  # 0: the prefix, known to fail (loaded from node 0)
    if starts[-1] == end and not search.exhausted() and search.fails(units[end], units[end]):
        return end, True
    if starts[-1] == end:
        starts.pop()
    lo, hi = 0, len(starts)  # positions in `starts`: lo fails, hi (past the end) loads
    while hi - lo > 1 and not search.exhausted():
        mid = (lo + hi) // 2
        if search.fails(units[starts[mid]], units[end]):
            lo = mid
        else:
            hi = mid
    return starts[lo], hi - lo <= 1


def explain(
    error: ExecutionProviderError,
    path: Path | str,
    ep_key: str,
    *,
    fallback: bool = False,
    provider_options: Mapping[str, str] | None = None,
    progress: Progress | None = None,
) -> ExecutionProviderError:
    """`error` with the smallest failing region and what to do, when it names no node
    (else `error` itself). The region goes into the error's `data` for reports."""
    from winml_recipes.runtime.providers import get_provider

    if not is_unnamed_failure(error.message):
        return error
    ep = get_provider(ep_key)
    options = dict(provider_options or {})
    try:
        region = bisect_failure(
            path, ep_key, fallback=fallback, provider_options=options, progress=progress
        )
    except Exception as exc:  # the search must never hide the EP's own error
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        error.message += f"; bisecting the graph failed ({type(exc).__name__}: {first})"
        return error
    if region is None:
        return error
    data = {"bisection": region.to_record()}
    steps = _next_steps(region, Path(path), ep_key, fallback, options, data)
    stopped = "" if region.complete else f" (search stopped early: {region.note.split(';')[0]})"
    message = (
        f"{ep.provider} ({ep.backend or ep.key}) failed to finalize the graph "
        f"({failure_code(error.message)}); the smallest failing region is {region.describe()}"
        f"{stopped}, found in {region.loads} loads; next: {steps}"
    )
    return ExecutionProviderError(message, where=error.where, data=data)


def _next_steps(
    region: Region,
    path: Path,
    ep_key: str,
    fallback: bool,
    options: dict[str, str],
    data: dict[str, Any],
) -> str:
    """What the user can do: quantize a float input, keep the op types on the CPU (the EP
    plugin's `cpu_pinning`, tried once here), or report the region."""
    from winml_recipes.onnx.io import load_model

    model = load_model(path, load_external_data=False)
    steps: list[str] = []
    quantized = any(n.op_type in _QDQ for n in model.graph.node)
    name, op = region.culprit
    why = _runs_in_float(model, name) if quantized else ""
    if why:
        steps.append(f"{name} runs in float inside the quantized graph ({why}): quantize it")
    elif not quantized:
        steps.append(f"build it quantized (--precision w8a16): {ep_key} failed on float {op}")
    cpu = _cpu_op_types(region, path, ep_key, options)
    if cpu is not None:
        data["cpu_op_affinity"] = cpu
        from winml_recipes.runtime.providers import get_provider

        hint = get_provider(ep_key).cpu_pinning_hint(cpu["op_types"])
        if cpu["loads"]:
            how = "verify: {allow_cpu_fallback: true} keeps" if not fallback else "keeping"
            steps.append(
                f"{how} {', '.join(cpu['op_types'])} ({cpu['nodes']} node(s)) on the CPU, "
                f"which loads here, through {hint}; the application's session needs it too"
            )
            return "; ".join(steps)
        steps.append(f"keeping {', '.join(cpu['op_types'])} on the CPU ({hint}) still fails here")
    if len(steps) == (0 if cpu is None else 1):  # nothing to act on
        steps.append(f"nothing automatic: report the region to the {ep_key} EP's maintainers")
    return "; ".join(steps)


def _runs_in_float(model: onnx.ModelProto, node_name: str) -> str:
    """Why a node of a QDQ graph runs in float ("reads X in float, not through a
    DequantizeLinear", "its output is not quantized"), or ""."""
    node = next((n for n in model.graph.node if n.name == node_name), None)
    if node is None:
        return ""
    producer = {o: n for n in model.graph.node for o in n.output}
    readers: dict[str, list[str]] = {}
    for n in model.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n.op_type)
    floats = {t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT}
    floats |= {
        v.name
        for v in [*model.graph.input, *model.graph.value_info]
        if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    }
    direct = [
        i
        for i in node.input
        if i in floats and (i not in producer or producer[i].op_type != "DequantizeLinear")
    ]
    if direct:
        return f"reads {', '.join(direct[:3])} in float, not through a DequantizeLinear"
    out = node.output[0] if node.output else ""
    if out and "QuantizeLinear" not in readers.get(out, []):
        return "its output is not quantized"
    return ""


def _cpu_op_types(
    region: Region, path: Path, ep_key: str, options: dict[str, str]
) -> dict[str, Any] | None:
    """Whether the whole graph loads with the region's op types pinned to the CPU (the EP
    plugin's `cpu_pinning` provider options; by op type only). None for an EP that cannot
    pin."""
    from winml_recipes.onnx.io import load_model
    from winml_recipes.runtime.providers import get_provider

    ep = get_provider(ep_key)
    op_types = region.op_types
    with tempfile.TemporaryDirectory(prefix="winml-affinity-") as tmp:
        pinned = ep.cpu_pinning(op_types, Path(tmp))
        if pinned is None:
            return None
        model = load_model(path, load_external_data=False)
        count = sum(n.op_type in op_types for n in model.graph.node)
        error = load_in_child(Path(path), ep_key, True, {**options, **pinned})
    return {"op_types": op_types, "nodes": count, "loads": error is None}


def load_in_child(
    path: Path,
    ep_key: str,
    fallback: bool,
    provider_options: Mapping[str, str],
    timeout: float = LOAD_TIMEOUT_SECONDS,
) -> str | None:
    """Open a session on `path` in a fresh interpreter: None if it loads, else the error."""
    spec = {
        "path": str(path),
        "ep": ep_key,
        "fallback": fallback,
        "provider_options": dict(provider_options),
    }
    try:
        done = subprocess.run(
            [sys.executable, "-m", "winml_recipes.runtime.bisect", json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return f"the load took more than {timeout:.0f} s"
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line).get("error")
            except json.JSONDecodeError:
                break
    return f"the loading process ended with exit code {done.returncode}"


def _main(argv: list[str]) -> int:
    from winml_recipes.runtime.sessions import open_session
    from winml_recipes.sdk.errors import WinmlError

    spec = json.loads(argv[0])
    try:
        open_session(
            spec["path"],
            spec["ep"],
            fallback=spec["fallback"],
            provider_options=spec["provider_options"],
        )
        error = None
    except WinmlError as exc:
        error = exc.message
    print(json.dumps({"error": error}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
