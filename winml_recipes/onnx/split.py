"""Cut a graph into consecutive parts at tensor boundaries (split compilation).

The nodes that compute something from activations ("core" nodes, in the graph's own
topological order) are cut into runs; a part is one run plus the constant nodes it reads
(duplicated into every part that needs them). In a QDQ graph a DequantizeLinear of an
activation travels with its readers, so a Q -> DQ pair is never split across a boundary: the
tensor that crosses is the quantized one (uint8/uint16), exact on both sides, or with
`boundary="float"` the DQ output, re-quantized at the next part's start with the same
scale and zero point (a Q -> DQ copy: exact, since the float is on the quantized grid).

Why not onnx.utils.extract_model: it extracts one sub-graph by names but neither chooses
boundaries, keeps Q/DQ pairs together nor duplicates constants per part; onnx_ir has no
partitioner either. Cut choice: fewest crossing tensors near equal shares of cost (weights
and activation elements), or a memory bound per part.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import onnx
from onnx import helper

Boundary = Literal["quantized", "float"]
# A cut may move this far (a fraction of the core nodes) from its equal-share target to
# find fewer crossing tensors.
WINDOW = 0.15


@dataclass(frozen=True)
class Part:
    """One part: its model and the tensors it takes and gives."""

    model: onnx.ModelProto
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    nodes: int  # core nodes (not counting duplicated constants)


def _subgraph_reads(node: onnx.NodeProto) -> set[str]:
    """Names a node's subgraphs (If/Loop/Scan) read from the outer scope."""
    reads: set[str] = set()
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for g in graphs:
            local = {i.name for i in g.input} | {t.name for t in g.initializer}
            for n in g.node:
                local.update(n.output)
            for n in g.node:
                reads.update(x for x in [*n.input, *_subgraph_reads(n)] if x and x not in local)
    return reads


def _reads(node: onnx.NodeProto) -> list[str]:
    return [x for x in node.input if x] + sorted(_subgraph_reads(node))


class Splitter:
    """A graph's core nodes, the constants beside them and where each tensor comes from."""

    def __init__(self, model: onnx.ModelProto, boundary: Boundary = "quantized") -> None:
        self.model = model
        self.boundary = boundary
        g = model.graph
        self.initializers = {t.name for t in g.initializer}
        self.graph_inputs = [i.name for i in g.input if i.name not in self.initializers]
        self.graph_outputs = [o.name for o in g.output]
        self.producer: dict[str, int] = {}
        for i, node in enumerate(g.node):
            for out in node.output:
                if out:
                    self.producer[out] = i
        constant: set[int] = set()
        attached: set[int] = set()
        for i, node in enumerate(g.node):
            srcs = [self.producer.get(x) for x in _reads(node) if x not in self.initializers]
            if all(s is not None and s in constant for s in srcs) and not (
                set(_reads(node)) & set(self.graph_inputs)
            ):
                constant.add(i)
            elif boundary == "quantized" and node.op_type == "DequantizeLinear":
                attached.add(i)  # a DQ of an activation goes with its readers
        self.constant = constant
        self.attached = attached
        self.quantized = any(n.op_type == "QuantizeLinear" for n in g.node)
        self.core = [i for i in range(len(g.node)) if i not in constant and i not in attached]
        self._sizes = _elements(model)
        self._span_cache: dict[str, tuple[int, int]] | None = None
        self._count_cache: tuple[list[int], list[int]] | None = None
        self._reader_cache: dict[str, list[onnx.NodeProto]] | None = None
        self._block_cache: list[int] | None = None

    # ------------------------------------------------------------ one part's nodes

    def _closure(self, core: Sequence[int]) -> list[int]:
        """`core` plus the constant and attached nodes they need, in graph order."""
        nodes = set(core)
        todo = [x for i in core for x in _reads(self.model.graph.node[i])]
        # attached DQs whose output is a graph output belong with their input's producer
        for name in self.graph_outputs:
            p = self.producer.get(name)
            if p is not None and p in self.attached:
                src = self.producer.get(self.model.graph.node[p].input[0])
                if src in nodes:
                    nodes.add(p)
                    todo += _reads(self.model.graph.node[p])
        while todo:
            p = self.producer.get(todo.pop())
            if p is None or p in nodes or (p not in self.constant and p not in self.attached):
                continue
            nodes.add(p)
            todo += _reads(self.model.graph.node[p])
        return sorted(nodes)

    def io(
        self, core: Sequence[int], later: Sequence[int], given: frozenset[str] = frozenset()
    ) -> tuple[list[str], list[str]]:
        """A part's inputs (read, not made here, not weights) and outputs (made here and
        read by `later` core nodes that do not make it themselves, e.g. with their own copy
        of a DequantizeLinear, or the graph's outputs not `given` by an earlier part)."""
        nodes = self._closure(core)
        made = {x for i in nodes for x in self.model.graph.node[i].output if x}
        inputs: list[str] = []
        for i in nodes:
            for x in _reads(self.model.graph.node[i]):
                if x not in made and x not in self.initializers and x not in inputs:
                    inputs.append(x)
        rest = self._closure(later)
        remade = {x for i in rest for x in self.model.graph.node[i].output}
        wanted = [x for i in rest for x in _reads(self.model.graph.node[i]) if x not in remade]
        own = {x for i in nodes if i not in self.constant for x in self.model.graph.node[i].output}
        outputs = [x for x in self.graph_outputs if x in made and x not in given]
        outputs += [x for x in dict.fromkeys(wanted) if x in own and x not in outputs]
        return inputs, outputs

    def _spans(self) -> dict[str, tuple[int, int]]:
        """Each tensor a core node makes and a later core node reads (directly, or through
        the constant and attached nodes that travel with it): (maker, last reader) core
        positions. A cut at k carries the tensors with maker < k <= last reader."""
        if self._span_cache is None:
            g = self.model.graph
            position = {i: p for p, i in enumerate(self.core)}
            spans: dict[str, tuple[int, int]] = {}
            for p, i in enumerate(self.core):
                for j in self._closure([i]):
                    for x in _reads(g.node[j]):
                        maker = position.get(self.producer.get(x, -1))
                        if maker is not None and maker < p:
                            first, last = spans.get(x, (maker, p))
                            spans[x] = (first, max(last, p))
            self._span_cache = spans
        return self._span_cache

    def crossing(self, k: int) -> list[str]:
        """Tensors made before core position k and read from k on (besides graph inputs)."""
        return [x for x, (a, b) in self._spans().items() if a < k <= b]

    def valid(self, k: int) -> bool:
        """Whether a cut at core position k keeps every Q/DQ node unit whole: in a QDQ graph
        every crossing tensor is a QuantizeLinear output (a DequantizeLinear output with
        boundary "float"), never an op's float output before its Q."""
        return self._counts()[1][k] == 0

    def _counts(self) -> tuple[list[int], list[int]]:
        """Per core position k: tensors a cut there carries, and those that break a Q/DQ
        node unit (difference arrays over the spans)."""
        if self._count_cache is None:
            n = len(self.core)
            carried, breaking = [0] * (n + 2), [0] * (n + 2)
            op = "QuantizeLinear" if self.boundary == "quantized" else "DequantizeLinear"
            g = self.model.graph
            for x, (a, b) in self._spans().items():
                carried[a + 1] += 1
                carried[b + 1] -= 1
                if self.quantized and g.node[self.producer[x]].op_type != op:
                    breaking[a + 1] += 1
                    breaking[b + 1] -= 1
            for arr in (carried, breaking):
                for k in range(1, n + 2):
                    arr[k] += arr[k - 1]
            self._count_cache = (carried, breaking)
        return self._count_cache

    # ------------------------------------------------------------ transformer blocks

    def _readers(self, name: str) -> list[onnx.NodeProto]:
        """Nodes that read `name`, looking through the attached DQ of a quantized tensor."""
        if self._reader_cache is None:
            self._reader_cache = {}
            for node in self.model.graph.node:
                for x in _reads(node):
                    self._reader_cache.setdefault(x, []).append(node)
        out: list[onnx.NodeProto] = []
        for n in self._reader_cache.get(name, []):
            if n.op_type == "DequantizeLinear" and self.boundary == "quantized" and self.quantized:
                out += self._reader_cache.get(n.output[0], [])
            else:
                out.append(n)
        return out

    def residual_cuts(self) -> list[int]:
        """Allowed core positions where one tensor crosses and an Add reads it beside another
        node: the residual stream of a transformer (between blocks, and between a block's
        attention and MLP halves)."""
        carried = self._counts()[0]
        single: dict[int, str] = {}  # the one tensor a cut at k carries
        for x, (a, b) in self._spans().items():
            for k in range(a + 1, b + 1):
                if carried[k] == 1:
                    single[k] = x
        out = []
        for k in sorted(single):
            if not self.valid(k):
                continue
            readers = self._readers(single[k])
            if len(readers) >= 2 and any(n.op_type == "Add" for n in readers):
                out.append(k)
        return out

    def block_boundaries(self) -> list[int]:
        """The residual cuts an attention follows (a Softmax before the next residual cut):
        the places between transformer blocks, in order (the k-th is after k blocks)."""
        if self._block_cache is None:
            g = self.model.graph
            residual = self.residual_cuts()
            self._block_cache = [
                k
                for k, end in zip(residual, [*residual[1:], len(self.core)], strict=False)
                if any(g.node[i].op_type == "Softmax" for i in self.core[k:end])
            ]
        return self._block_cache

    # ------------------------------------------------------------ choosing cuts

    def cost_prefix(self) -> list[float]:
        """Cumulative cost (elements made + weight elements read) along the core nodes."""
        total, out = 0.0, [0.0]
        g = self.model.graph
        for i in self.core:
            node = g.node[i]
            total += sum(self._sizes.get(x) or 0 for x in node.output)
            total += sum(self._sizes.get(x) or 0 for x in node.input if x in self.initializers)
            out.append(total)
        return out

    def cut_points(self) -> list[int]:
        """Core positions a cut may take: between two core nodes, every Q/DQ unit whole."""
        return [k for k in range(1, len(self.core)) if self.valid(k)]

    def choose_cuts(self, parts: int) -> list[int]:
        """Core positions of `parts - 1` cuts: near equal shares of cost, fewest crossing
        tensors within the window around each share (ties: a place between transformer
        blocks, then the nearer)."""
        n = len(self.core)
        if parts < 2:
            return []
        if parts > n:
            raise ValueError(f"{parts} parts asked of a graph with {n} nodes")
        prefix = self.cost_prefix()
        total = prefix[-1] or 1.0
        window = max(1, int(WINDOW * n))
        carried = self._counts()[0]
        blocks = set(self.block_boundaries())  # between transformer blocks: preferred
        valid = self.cut_points()
        if len(valid) < parts - 1:
            raise ValueError(f"{len(valid)} places keep Q/DQ pairs whole, {parts - 1} cuts asked")
        cuts: list[int] = []
        for j in range(1, parts):
            share = total * j / parts
            target = min(range(1, n), key=lambda k: abs(prefix[k] - share))
            # leave a valid place for every cut still to make
            room = [k for k in valid if k > (cuts[-1] if cuts else 0)]
            room = room[: len(room) - (parts - 1 - j)]
            near = [k for k in room if abs(k - target) <= window]
            near = near or [min(room, key=lambda k: abs(k - target))]
            cuts.append(min(near, key=lambda k: (carried[k], k not in blocks, abs(k - target))))
        return cuts

    # ------------------------------------------------------------ building parts

    def cuts_after(self, names: Sequence[str]) -> list[int]:
        """Core positions of cuts right after the nodes making `names` (e.g. a Q output);
        ValueError naming a tensor where the cut would split a Q/DQ node unit."""
        position = {i: p for p, i in enumerate(self.core)}
        cuts = []
        for name in names:
            p = position.get(self.producer.get(name, -1))
            if p is None:
                raise ValueError(f"no node of the graph's core makes a tensor named '{name}'")
            k = p + 1
            if k >= len(self.core) or not self.valid(k):
                others = ", ".join(self.crossing(k)[:4])
                raise ValueError(
                    f"a cut after '{name}' would carry {others}: not only quantized tensors "
                    "(a Q/DQ node unit would be split); cut after a QuantizeLinear output"
                )
            cuts.append(k)
        return sorted(set(cuts))

    def parts(self, cuts: Sequence[int]) -> list[Part]:
        bounds = [0, *cuts, len(self.core)]
        out: list[Part] = []
        given: set[str] = set()  # graph outputs an earlier part gives
        for j in range(len(bounds) - 1):
            core = self.core[bounds[j] : bounds[j + 1]]
            later = self.core[bounds[j + 1] :]
            out.append(self._part(j, core, later, frozenset(given)))
            given.update(x for x in out[-1].outputs if x in self.graph_outputs)
        return out

    def _part(
        self, index: int, core: Sequence[int], later: Sequence[int], given: frozenset[str]
    ) -> Part:
        g = self.model.graph
        nodes = [g.node[i] for i in self._closure(core)]
        inputs, outputs = self.io(core, later, given)
        extra: list[onnx.NodeProto] = []
        inits: list[onnx.TensorProto] = []
        renamed: dict[str, str] = {}
        if self.boundary == "float" and index > 0:
            for name in inputs:  # re-quantize a DQ output at this part's start
                p = self.producer.get(name)
                if p is None or g.node[p].op_type != "DequantizeLinear":
                    continue
                dq = g.node[p]
                q_in = dq.input[0]
                qp = self.producer.get(q_in)
                if qp is None or g.node[qp].op_type != "QuantizeLinear":
                    continue
                new = f"{name}__requantized"
                renamed[name] = new
                extra.append(
                    helper.make_node(
                        "QuantizeLinear",
                        [name, *dq.input[1:]],
                        [f"{new}__q"],
                        name=f"{dq.name}__split_q",
                        **_axis(g.node[qp]),
                    )
                )
                extra.append(
                    helper.make_node(
                        "DequantizeLinear",
                        [f"{new}__q", *dq.input[1:]],
                        [new],
                        name=f"{dq.name}__split_dq",
                        **_axis(dq),
                    )
                )
        body = []
        for node in nodes:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            for k, x in enumerate(copy.input):
                if x in renamed:
                    copy.input[k] = renamed[x]
            body.append(copy)
        used = {x for n in [*extra, *body] for x in _reads(n)}
        inits = [t for t in g.initializer if t.name in used]
        graph = helper.make_graph(
            [*extra, *body],
            f"{g.name or 'graph'}_part{index}",
            [_value_info(self.model, x) for x in inputs],
            [_value_info(self.model, x) for x in outputs],
            inits,
        )
        model = helper.make_model(
            graph, opset_imports=list(self.model.opset_import), ir_version=self.model.ir_version
        )
        return Part(model, tuple(inputs), tuple(outputs), len(core))


def _axis(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


_INFERRED: dict[int, onnx.ModelProto] = {}


def _inferred(model: onnx.ModelProto) -> onnx.ModelProto:
    key = id(model)
    if key not in _INFERRED:
        _INFERRED.clear()
        from winml_recipes.onnx.lightview import light_view

        # inferred on a view without the weights' bytes (only the types and shapes are read)
        _INFERRED[key] = onnx.shape_inference.infer_shapes(light_view(model), strict_mode=False)
    return _INFERRED[key]


def _value_info(model: onnx.ModelProto, name: str) -> onnx.ValueInfoProto:
    """The typed, shaped value info of `name` (graph I/O or inferred)."""
    g = _inferred(model).graph
    for vi in [*g.input, *g.output, *g.value_info]:
        if vi.name == name:
            return vi
    raise ValueError(f"no type known for tensor '{name}': run shape inference (fix_shapes) first")


def _elements(model: onnx.ModelProto) -> dict[str, int]:
    g = _inferred(model).graph
    out: dict[str, int] = {}
    for vi in [*g.input, *g.output, *g.value_info]:
        dims = vi.type.tensor_type.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            out[vi.name] = math.prod(d.dim_value for d in dims)
    for t in model.graph.initializer:
        out[t.name] = math.prod(t.dims)
    return out
