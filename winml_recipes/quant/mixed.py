"""Mixed precision: declarative regions -> TensorQuantOverrides, and automatic promotion.

Regions name activation tensors or nodes by glob. Automatic promotion measures, for each
quantized activation, the output damage its quantization alone does, promotes the most
damaging to 16 bit, and re-measures the outputs, until a target SQNR or a promotion
budget is reached.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from winml_recipes.sdk.errors import PassError


def _match(globs: Sequence[str], names: Iterable[str], what: str) -> list[str]:
    names = list(names)
    out: list[str] = []
    for g in globs:
        hits = [n for n in names if fnmatch.fnmatchcase(n, g)]
        if not hits:
            raise PassError(f"mixed_precision: {what} glob '{g}' matches no activation")
        out += [h for h in hits if h not in out]
    return out


def match_nodes(globs: Sequence[str], model: onnx.ModelProto, what: str) -> list[str]:
    """Node names matching any glob, by node name or by the name of a weight it reads.

    Exported graphs often name nodes generically (node_MatMul_12) while weights keep the
    module path (mask_decoder.iou_head.proj_out.weight), so both are matched.
    """
    initializers = {t.name for t in model.graph.initializer}
    out: list[str] = []
    for g in globs:
        hits = [
            n.name
            for n in model.graph.node
            if n.name
            and (
                fnmatch.fnmatchcase(n.name, g)
                or any(i in initializers and fnmatch.fnmatchcase(i, g) for i in n.input)
            )
        ]
        if not hits:
            raise PassError(f"{what}: node glob '{g}' matches no node name or weight name")
        out += [h for h in hits if h not in out]
    return out


def compile_regions(
    regions: Sequence[dict[str, Any]], model: onnx.ModelProto, activations: Sequence[str]
) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """Regions -> (TensorQuantOverrides with type names, node names kept in float)."""
    overrides: dict[str, list[dict[str, Any]]] = {}
    float_nodes: list[str] = []
    acts = set(activations)
    for region in regions:
        if "tensors" in region:
            tensors = _match(region["tensors"], activations, "tensor")
        else:
            nodes = match_nodes(region["nodes"], model, "mixed_precision")
            if region["type"] == "float":
                float_nodes += [n for n in nodes if n not in float_nodes]
                continue
            wanted = set(nodes)
            tensors = [o for n in model.graph.node if n.name in wanted for o in n.output]
            tensors = [t for t in tensors if t in acts]
        if region["type"] == "float":
            producers = {o: n.name for n in model.graph.node for o in n.output}
            float_nodes += [producers[t] for t in tensors if producers.get(t)]
            continue
        for t in tensors:
            overrides[t] = [{"quant_type": region["type"]}]
    return overrides, float_nodes


GATE_PREFIX = "winml_gate_"
RENAMED_SUFFIX = "_QuantizeLinear_Input"  # ORT's name for a quantized graph output


def _activation_pairs(model: onnx.ModelProto) -> dict[str, str]:
    """Quantized activation tensor -> the DequantizeLinear output its consumers read."""
    initializers = {t.name for t in model.graph.initializer}
    dq_of = {n.input[0]: n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    return {
        n.input[0]: dq_of[n.output[0]]
        for n in model.graph.node
        if n.op_type == "QuantizeLinear" and n.input[0] not in initializers and n.output[0] in dq_of
    }


def quantization_damage(
    qdq_model: Path,
    float_model: Path,
    feeds: list[dict[str, Any]],
    reference: list[dict[str, Any]],
    work_dir: Path,
    weights_below: float | None = None,
) -> tuple[float, dict[str, float], dict[str, float]]:
    """Output SQNR (dB, worst output) when ONLY this activation (or weight) is quantized.

    Returns the SQNR with only the weights quantized, then the damage per activation and,
    when `weights_below` is given and the weights alone are below it, per quantized weight
    (keyed by the float initializer's name; its DQ is gated against the float weight, so
    the gated graph holds both copies).

    Each activation's Q/DQ pair is gated: consumers read Where(g > 0.5, DQ(Q(T)), T), with
    g a scalar input. With every gate at 0 the model computes in float; opening one gate at
    a time measures the damage that tensor's quantization alone does to the outputs, in one
    onnxruntime session. (A blend T + g * (DQ(Q(T)) - T) is NaN wherever T is infinite, as
    in an additive attention mask: 0 * inf. A tensor's own noise says little: SAM's prompt
    encoder turns a small error in the point coordinates into a large one through sin/cos
    features.)
    """

    opened = np.array(1.0, np.float32)
    session, gates, _ = _gated_session(qdq_model, float_model, work_dir, weights=False)
    score = _Scorer(session, feeds, reference, [*gates.values()])
    damage = {t.removesuffix(RENAMED_SUFFIX): score({g: opened}) for t, g in gates.items()}
    weights_only = score({})  # every gate closed: only the weights (plain DQs) quantized
    weight_damage: dict[str, float] = {}
    if weights_below is not None and weights_only < weights_below:
        # a weight's damage: it alone quantized, every other weight and activation in float
        session, gates, weight_gates = _gated_session(
            qdq_model, float_model, work_dir, weights=True
        )
        score = _Scorer(session, feeds, reference, [*gates.values(), *weight_gates.values()])
        weight_damage = {w: score({g: opened}) for w, g in weight_gates.items()}
    return weights_only, damage, weight_damage


def _gated_session(
    qdq_model: Path, float_model: Path, work_dir: Path, weights: bool
) -> tuple[Any, dict[str, str], dict[str, str]]:
    """A CPU session over the QDQ model with every activation (and weight) Q/DQ gated."""
    from winml_recipes.onnx.io import load_model, save_model
    from winml_recipes.runtime.sessions import load_session

    model = load_model(qdq_model)
    pairs = _activation_pairs(model)
    # graph only, unless weights are gated: the Clip bounds copied below are inline scalars
    float_graph = load_model(float_model, load_external_data=weights).graph
    float_producer = {o: n for n in float_graph.node for o in n.output}
    float_init = {t.name: t for t in float_graph.initializer}
    have = {t.name for t in model.graph.initializer} | {i.name for i in model.graph.input}
    have |= {o for n in model.graph.node for o in n.output}
    gates: dict[str, str] = {}
    new_nodes = []
    producers = {o: n for n in model.graph.node for o in n.output}
    for i, (tensor, dq_out) in enumerate(sorted(pairs.items())):
        gate, raw = f"{GATE_PREFIX}{i}", f"{dq_out}_ungated"
        gates[tensor] = gate
        dq = producers[dq_out]
        dq.output[0] = raw  # consumers (and graph outputs) keep reading `dq_out`
        model.graph.input.append(
            onnx.helper.make_tensor_value_info(gate, onnx.TensorProto.FLOAT, [])
        )
        # ORT folds a Relu or Clip into the Q/DQ pair and gives its output name to the tensor
        # before it: the float path re-applies that activation.
        exact = tensor
        folded = float_producer.get(tensor.removesuffix(RENAMED_SUFFIX))
        if (
            folded is not None
            and folded.op_type in ("Relu", "Clip")
            and producers.get(tensor)
            and producers[tensor].op_type != folded.op_type
        ):
            exact = f"{raw}_float"
            for bound in folded.input[1:]:  # Clip's min/max: gone from the QDQ graph
                if bound and bound not in have:
                    new_nodes += _copy_constant(bound, float_init, float_producer, model)
                    have.add(bound)
            new_nodes.append(
                onnx.helper.make_node(folded.op_type, [tensor, *folded.input[1:]], [exact])
            )
        new_nodes += [
            onnx.helper.make_node("Greater", [gate, HALF], [f"{raw}_open"]),
            onnx.helper.make_node("Where", [f"{raw}_open", raw, exact], [dq_out]),
        ]
    weight_gates = _gate_weights(model, float_init, len(gates), new_nodes) if weights else {}
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array(0.5, np.float32), HALF))
    model.graph.node.extend(new_nodes)
    model = _toposort(model)
    session = load_session(
        save_model(model, work_dir / ("gated-weights.onnx" if weights else "gated.onnx"))
    )
    return session, gates, weight_gates


class _Scorer:
    """Worst output SQNR of the gated session for a set of open gates, over every sample.

    Samples whose inputs share one shape run stacked on the batch axis, one onnxruntime run
    per candidate instead of one per candidate and sample, when that gives the same outputs
    as separate runs (checked once, with every gate closed); otherwise one run per sample.
    """

    def __init__(self, session, feeds, reference, gates: Sequence[str]) -> None:
        self.session, self.reference = session, reference
        self.names = [o.name for o in session.get_outputs()]
        self.closed = {g: np.array(0.0, np.float32) for g in gates}
        self.feeds = feeds
        self.stacked = _stack(feeds)
        if self.stacked is not None and not self._stacking_is_exact():
            self.stacked = None

    def _run(self, feed: Mapping[str, np.ndarray], gates: Mapping[str, np.ndarray]) -> list:
        return self.session.run(None, {**feed, **gates})

    def _split(self, outputs: list[np.ndarray]) -> list[dict[str, np.ndarray]] | None:
        n = len(self.feeds)
        if any(o.ndim == 0 or o.shape[0] % n for o in outputs):
            return None
        parts = [np.split(o, n) for o in outputs]
        return [dict(zip(self.names, [p[i] for p in parts], strict=True)) for i in range(n)]

    def _stacking_is_exact(self) -> bool:
        from winml_recipes.onnx.metrics import compare_runs

        try:
            stacked = self._split(self._run(self.stacked, self.closed))
        except Exception:  # onnxruntime refuses the batch (its errors share no base class)
            return False
        if stacked is None:
            return False
        single = [self._sample_run(f, self.closed) for f in self.feeds]
        try:
            agreement = compare_runs(single, stacked)
        except ValueError:  # shapes differ: the batch axis is not the samples' axis
            return False
        return min(m["sqnr_db"] for m in agreement.values()) >= STACKED_MIN_SQNR_DB

    def _sample_run(self, feed, gates) -> dict[str, np.ndarray]:
        return dict(zip(self.names, self._run(feed, gates), strict=True))

    def __call__(self, open_gates: Mapping[str, np.ndarray]) -> float:
        from winml_recipes.onnx.metrics import compare_runs

        gates = self.closed | dict(open_gates)
        if self.stacked is not None:
            runs = self._split(self._run(self.stacked, gates))
        else:
            runs = [self._sample_run(f, gates) for f in self.feeds]
        return min(m["sqnr_db"] for m in compare_runs(self.reference, runs).values())


# stacked and separate runs differ only by kernel rounding (batched GEMMs): far above this
STACKED_MIN_SQNR_DB = 80.0


def _stack(feeds: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray] | None:
    """The samples concatenated on axis 0, when each input has one shape in every sample."""
    if len(feeds) < 2:
        return None
    first = feeds[0]
    for feed in feeds:
        if feed.keys() != first.keys():
            return None
        if any(np.ndim(v) == 0 or np.shape(v) != np.shape(first[k]) for k, v in feed.items()):
            return None
    return {k: np.concatenate([np.asarray(f[k]) for f in feeds]) for k in first}


def _gate_weights(
    model: onnx.ModelProto,
    float_init: dict[str, onnx.TensorProto],
    first: int,
    new_nodes: list[onnx.NodeProto],
) -> dict[str, str]:
    """Gate each quantized weight's DequantizeLinear against its float initializer."""
    inits = {t.name: t for t in model.graph.initializer}
    gates: dict[str, str] = {}
    for dq in [n for n in model.graph.node if n.op_type == "DequantizeLinear"]:
        q = inits.get(dq.input[0])
        weight = dq.input[0].removesuffix(QUANTIZED_SUFFIX)
        if q is None or q.data_type == onnx.TensorProto.INT32 or weight not in float_init:
            continue  # not a weight, a bias (int32: harmless), or no float copy
        gate, raw, dq_out = f"{GATE_PREFIX}{first + len(gates)}", f"{weight}_ungated", dq.output[0]
        gates[weight] = gate
        dq.output[0] = raw
        if weight not in inits:  # (present when something else reads it unquantized)
            model.graph.initializer.append(float_init[weight])
        model.graph.input.append(
            onnx.helper.make_tensor_value_info(gate, onnx.TensorProto.FLOAT, [])
        )
        new_nodes += [
            onnx.helper.make_node("Greater", [gate, HALF], [f"{raw}_open"]),
            onnx.helper.make_node("Where", [f"{raw}_open", raw, weight], [dq_out]),
        ]
    return gates


def weight_readers(model: onnx.ModelProto) -> dict[str, list[str]]:
    """Float weight name -> the names of the nodes reading its dequantized copy."""
    inits = {t.name for t in model.graph.initializer}
    dq_of = {
        n.output[0]: n.input[0].removesuffix(QUANTIZED_SUFFIX)
        for n in model.graph.node
        if n.op_type == "DequantizeLinear" and n.input[0] in inits
    }
    readers: dict[str, list[str]] = {}
    for n in model.graph.node:
        for i in n.input:
            if i in dq_of and n.name:
                readers.setdefault(dq_of[i], []).append(n.name)
    return readers


QUANTIZED_SUFFIX = "_quantized"  # ORT's name for a quantized initializer


HALF = "winml_gate_half"


def _copy_constant(
    name: str,
    float_init: dict[str, onnx.TensorProto],
    float_producer: dict[str, onnx.NodeProto],
    model: onnx.ModelProto,
) -> list[onnx.NodeProto]:
    """Bring a constant the float graph has (an initializer, or a Constant node's output)
    into the gated graph; returns nodes to add."""
    if name in float_init:
        model.graph.initializer.append(float_init[name])
        return []
    node = float_producer.get(name)
    if node is not None and node.op_type == "Constant":
        return [node]
    raise PassError(f"cannot re-apply a folded activation: its input '{name}' is not a constant")


def _toposort(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with nodes ordered so every input is produced before use (gating appends
    nodes at the end): onnx_ir's TopologicalSortPass."""
    import onnx_ir as ir
    from onnx_ir.passes.common import TopologicalSortPass

    graph = ir.from_proto(model)
    try:
        TopologicalSortPass()(graph)
    except ValueError as exc:  # a cycle
        raise PassError(f"cannot order the gated graph: {exc}") from exc
    return ir.to_proto(graph)
