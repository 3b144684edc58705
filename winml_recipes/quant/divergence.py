"""Per-tensor comparison of a QDQ model on the target EP, its CPU simulation and the float model.

When a quantized model is right on onnxruntime's CPU EP (which simulates Q/DQ in float)
and wrong on the device, the question is which tensor first goes wrong. The *integer*
output of every activation's QuantizeLinear is made a graph output and dequantized here.
(Tapping the DequantizeLinear outputs instead would give each DQ a second consumer, which
breaks the DQ -> op -> Q node units an NPU's EP compiles as one quantized op.) The model
runs on the target EP and on the CPU EP with the same feeds, the float model runs with the
matching float tensors as outputs, and each tensor is scored three ways, in graph order.
Each tensor is also scored by what its layer costs: the noise (relative to the signal) its
output has on the target beyond the worst of the layer's inputs, which ranks the layers
that lose the most precision against float (errors accumulate, so a plain low SQNR would
rank every layer after a bad one).
Extra outputs can still change what the EP compiles (on sam3-tiny's decoder they hid a
divergence of the untouched graph), so the tapped run's final outputs are compared with
the untouched model's on the same EP and the agreement is reported.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from winml_recipes.onnx.metrics import SQNR_CAP_DB
from winml_recipes.quant.mixed import RENAMED_SUFFIX  # ORT's name for a quantized output
from winml_recipes.sdk.errors import ExecutionProviderError


@dataclass(frozen=True)
class TensorRow:
    tensor: str  # the float tensor's name
    op_type: str  # the op that produces it in the float graph
    node: str
    target_vs_float_db: float
    simulation_vs_float_db: float
    target_vs_simulation_db: float
    # The worst SQNR (target vs float) of the tapped tensors the layer reads, through
    # untapped ops (None: it reads only graph inputs and constants, exact).
    input_db: float | None = None

    @property
    def lost_db(self) -> float:
        """SQNR the layer loses on the target: its inputs' minus its output's."""
        return (SQNR_CAP_DB if self.input_db is None else self.input_db) - self.target_vs_float_db

    @property
    def noise_added(self) -> float:
        """Noise power (relative to the signal) the layer adds on the target: what ranks
        it. A layer from 40 to 39 dB adds less than one from 20 to 15 dB."""
        before = 0.0 if self.input_db is None else 10 ** (-self.input_db / 10)
        return max(0.0, 10 ** (-self.target_vs_float_db / 10) - before)

    def to_json(self) -> dict[str, Any]:
        out = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in vars(self).items()}
        return out | {
            "lost_db": round(self.lost_db, 3),
            "noise_added": float(f"{self.noise_added:.4g}"),
        }


@dataclass(frozen=True)
class Tap:
    q_output: str  # the integer tensor read from the quantized model
    tensor: str  # the float tensor it stands for
    scale: np.ndarray
    zero_point: np.ndarray
    axis: int

    def dequantize(self, q: np.ndarray) -> np.ndarray:
        scale, zp = self.scale, self.zero_point.astype(np.float64)
        if scale.ndim == 1 and scale.size > 1:  # per-axis
            shape = [1] * q.ndim
            shape[self.axis] = scale.size
            scale, zp = scale.reshape(shape), zp.reshape(shape)
        return ((q.astype(np.float64) - zp) * scale).astype(np.float32)


def activation_taps(model: onnx.ModelProto) -> list[Tap]:
    """One tap per quantized activation (a QuantizeLinear reading a non-constant), in order."""
    from onnx import numpy_helper

    constants = {t.name: t for t in model.graph.initializer}
    taps = []
    for node in model.graph.node:
        if node.op_type != "QuantizeLinear" or node.input[0] in constants:
            continue
        if len(node.input) < 3 or node.input[1] not in constants or node.input[2] not in constants:
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        taps.append(
            Tap(
                q_output=node.output[0],
                tensor=node.input[0].removesuffix(RENAMED_SUFFIX),
                scale=numpy_helper.to_array(constants[node.input[1]]).astype(np.float64),
                zero_point=numpy_helper.to_array(constants[node.input[2]]),
                axis=axis,
            )
        )
    return taps


def _with_outputs(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    have = {o.name for o in model.graph.output}
    for name in names:
        if name not in have:
            model.graph.output.append(onnx.ValueInfoProto(name=name))
            have.add(name)
    return model


def compare_tensors(
    candidate: Path,
    reference: Path,
    feeds: Sequence[Mapping[str, np.ndarray]],
    device: str,
    work_dir: Path,
    ep: str | None = None,
    untapped: Sequence[Mapping[str, np.ndarray]] | None = None,
) -> tuple[list[TensorRow], dict[str, Any]]:
    """Rows in graph order, and the record of where the target ran (EP, placement); on
    `ep` (an EP plugin's key), else the device's default EP. `untapped`: the untouched
    candidate's outputs on the target for `feeds`, when a caller ran them already (verify):
    not run again."""
    from winml_recipes.onnx.io import load_model, save_model
    from winml_recipes.onnx.metrics import compare_runs
    from winml_recipes.runtime.sessions import run_model
    from winml_recipes.runtime.target import run_on_target

    qdq = load_model(candidate)
    float_model = load_model(reference)
    float_producer = {o: n for n in float_model.graph.node for o in n.output}
    float_names = {i.name for i in float_model.graph.input} | set(float_producer)
    taps = [t for t in activation_taps(qdq) if t.tensor in float_names]
    taps = list({t.tensor: t for t in taps}.values())  # one per float tensor
    tapped_qdq = save_model(
        _with_outputs(qdq, [t.q_output for t in taps]), work_dir / "tapped.onnx"
    )
    tapped_float = save_model(
        _with_outputs(float_model, [t.tensor for t in taps]), work_dir / "tapped_float.onnx"
    )
    all_feeds = feeds
    try:
        target = run_on_target(tapped_qdq, feeds, device, {"allow_cpu_fallback": True}, ep=ep)
    except ExecutionProviderError as exc:  # no node named: compare up to the failing region
        tapped_qdq, taps, target = _up_to_failing_region(exc, candidate, qdq, taps, feeds, device,
                                                         work_dir, ep)  # fmt: skip
        feeds = [{k: v for k, v in f.items() if k in target.record["inputs"]} for f in feeds]
        del target.record["inputs"]
    else:
        # Extra graph outputs can change how the EP partitions and compiles the graph:
        # compare the tapped run's final outputs with the untouched model's on the same EP.
        if untapped is None:
            untapped = run_on_target(
                candidate, feeds, device, {"allow_cpu_fallback": True}, ep=ep
            ).outputs
        finals = [o.name for o in load_model(candidate, load_external_data=False).graph.output]
        agreement = compare_runs(
            [{n: r[n] for n in finals} for r in untapped],
            [{n: r[n] for n in finals} for r in target.outputs],
        )
        target.record["tapped_vs_untapped_db"] = round(
            min(m["sqnr_db"] for m in agreement.values()), 2
        )
    simulation = run_model(tapped_qdq, feeds)
    floats = run_model(tapped_float, all_feeds)

    def dequantized(runs: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        return [{t.tensor: t.dequantize(run[t.q_output]) for t in taps} for run in runs]

    ref = [{t.tensor: run[t.tensor] for t in taps} for run in floats]
    vs_float = compare_runs(ref, dequantized(target.outputs))
    sim_vs_float = compare_runs(ref, dequantized(simulation))
    vs_sim = compare_runs(dequantized(simulation), dequantized(target.outputs))
    incoming = _input_sqnr(float_model.graph, {t: m["sqnr_db"] for t, m in vs_float.items()})
    rows = []
    for tap in taps:
        t = tap.tensor
        node = float_producer.get(t)
        rows.append(
            TensorRow(
                tensor=t,
                op_type=node.op_type if node is not None else "(graph input)",
                node=node.name if node is not None else "",
                target_vs_float_db=vs_float[t]["sqnr_db"],
                simulation_vs_float_db=sim_vs_float[t]["sqnr_db"],
                target_vs_simulation_db=vs_sim[t]["sqnr_db"],
                input_db=incoming(node) if node is not None else None,
            )
        )
    return rows, target.record


def _input_sqnr(graph: onnx.GraphProto, measured: Mapping[str, float]):
    """A function giving, for a float-graph node, the worst measured SQNR among the tensors
    it reads, looking through ops whose outputs were not measured (None: only graph inputs
    and constants upstream). One pass over the nodes in their (topological) order: there
    is no onnx_ir/onnxscript pass for this, and it only reads names."""
    upstream: dict[str, float | None] = {}  # an unmeasured tensor: the worst measured before it
    by_node: dict[tuple[str, ...], float | None] = {}  # by outputs (protobuf wrappers vary)

    def value(name: str) -> float | None:
        return measured[name] if name in measured else upstream.get(name)

    for node in graph.node:
        values = [v for x in node.input if x and (v := value(x)) is not None]
        worst = min(values) if values else None
        by_node[tuple(node.output)] = worst
        for out in node.output:
            upstream[out] = worst
    return lambda node: by_node.get(tuple(node.output))


def rank_by_loss(rows: Sequence[TensorRow]) -> list[TensorRow]:
    """The layers that cost the most precision on the target first (noise added), ties in
    graph order."""
    order = {id(r): i for i, r in enumerate(rows)}
    return sorted(rows, key=lambda r: (-r.noise_added, -r.lost_db, order[id(r)]))


def _up_to_failing_region(
    error: ExecutionProviderError,
    candidate: Path,
    qdq: onnx.ModelProto,
    taps: list[Tap],
    feeds: Sequence[Mapping[str, np.ndarray]],
    device: str,
    work_dir: Path,
    ep: str | None = None,
) -> tuple[Path, list[Tap], Any]:
    """The EP cannot finalize the tapped graph: bisect the candidate, then run the taps of
    the prefix that ends before the smallest failing region (the tapped path, the taps kept
    and the target run, whose record holds the bisection and the prefix's input names)."""
    from winml_recipes.onnx.io import save_model
    from winml_recipes.runtime.bisect import GraphCutter, explain
    from winml_recipes.runtime.providers import provider_for_device
    from winml_recipes.runtime.target import run_on_target

    explained = explain(error, candidate, ep or provider_for_device(device).key, fallback=True)
    if "bisection" not in explained.data:
        raise explained
    region = explained.data["bisection"]
    cutter = GraphCutter(qdq)
    first = region["nodes"][0]["name"] if region["region_nodes"] <= 50 else None
    index = next((i for i in cutter.units if cutter.node_id(i)[0] == first), None)
    earlier = [u for u in cutter.units if index is not None and u < index]
    if not earlier:
        raise ExecutionProviderError(
            explained.message + "; compare has no layer before that region to report",
            where=explained.where,
            data=explained.data,
        )
    prefix = cutter.piece(0, earlier[-1])
    produced = {o for n in prefix.graph.node for o in n.output}
    kept = [t for t in taps if t.q_output in produced]
    path = save_model(_with_outputs(prefix, [t.q_output for t in kept]), work_dir / "prefix.onnx")
    target = run_on_target(path, feeds, device, {"allow_cpu_fallback": True}, ep=ep)
    target.record["bisection"] = {**region, "message": explained.message}
    target.record["compared_up_to"] = cutter.node_id(earlier[-1])[0]
    target.record["inputs"] = [i.name for i in prefix.graph.input]
    return path, kept, target


def first_divergence(
    rows: Sequence[TensorRow], threshold_db: float = 30.0, loss_db: float = 3.0
) -> TensorRow | None:
    """The first tensor (graph order) where the target departs from the simulation.

    Departs: the target's output is below `threshold_db` against the simulation's AND at
    least `loss_db` further from the float model than the simulation is (rounding noise
    between two correct runs is far smaller than either).
    """
    return next(
        (
            r
            for r in rows
            if r.target_vs_simulation_db < threshold_db
            and r.simulation_vs_float_db - r.target_vs_float_db >= loss_db
        ),
        None,
    )
