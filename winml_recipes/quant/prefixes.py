"""The first layer where a QDQ model departs from its CPU simulation, found on prefixes.

Making every activation a graph output (quant/divergence.py) can change how an NPU's EP
partitions and compiles the graph: on a Swin build the tapped graph agreed with the
simulation while the untouched one did not. Here no graph gets an extra output: a prefix
of the QDQ model, cut at one quantized activation's DequantizeLinear (its output becomes
the prefix's only output, as a model output is in the full graph), is compiled and run on
the target and on the CPU EP, and a binary search over the activations (graph order)
finds the first whose prefix departs. A prefix holds the same nodes and Q/DQ parameters
as the model up to that tensor, so the EP compiles them as it compiles the model.

Departing is `divergence.first_divergence`'s rule: below `threshold_db` target vs
simulation AND at least `loss_db` further from the float model than the simulation is. A
divergence usually stays downstream (the damage propagates), which the search assumes;
the answer is checked (its prefix departs, the one before it does not).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from winml_recipes.quant.divergence import Tap, TensorRow, activation_taps


@dataclass(frozen=True)
class PrefixTap:
    tap: Tap
    dq_output: str  # the DequantizeLinear output the prefix ends at


def prefix_taps(qdq: onnx.ModelProto, float_names: set[str]) -> list[PrefixTap]:
    """The quantized activations (one per float tensor, graph order) with the DQ output a
    prefix can end at."""
    dq_of = {n.input[0]: n.output[0] for n in qdq.graph.node if n.op_type == "DequantizeLinear"}
    out: dict[str, PrefixTap] = {}
    for tap in activation_taps(qdq):
        if tap.tensor in float_names and tap.q_output in dq_of and tap.tensor not in out:
            out[tap.tensor] = PrefixTap(tap, dq_of[tap.q_output])
    return list(out.values())


class PrefixModels:
    """Prefixes of one QDQ model ending at a tensor, extracted with onnx's Extractor."""

    def __init__(self, qdq: onnx.ModelProto) -> None:
        import contextlib

        from onnx import shape_inference

        # without shapes the extractor needs the declared types only
        with contextlib.suppress(Exception):
            qdq = shape_inference.infer_shapes(qdq)
        self.model = qdq
        self.producer = {o: n for n in qdq.graph.node for o in n.output if o}
        self.inputs = [i.name for i in qdq.graph.input]
        self.extractor = onnx.utils.Extractor(qdq)

    def used_inputs(self, tensor: str) -> list[str]:
        """The graph inputs `tensor` depends on (graph order)."""
        seen: set[str] = set()
        todo = [tensor]
        found: set[str] = set()
        inputs = set(self.inputs)
        while todo:
            name = todo.pop()
            if name in seen or not name:
                continue
            seen.add(name)
            if name in inputs:
                found.add(name)
            node = self.producer.get(name)
            if node is not None:
                todo += list(node.input)
        return [i for i in self.inputs if i in found]

    def prefix(self, tensor: str) -> onnx.ModelProto:
        """The model up to `tensor`, which is its only output."""
        if tensor not in self.extractor.value_infos:  # shape inference could not type it
            elem = onnx.TensorProto.FLOAT  # a DequantizeLinear's output: its scale's type
            self.extractor.value_infos[tensor] = onnx.helper.make_tensor_value_info(
                tensor, elem, None
            )
        model = self.extractor.extract_model(self.used_inputs(tensor), [tensor])
        del model.graph.value_info[:]  # the EP infers them (stale ones can mislead it)
        return model


def _sqnr(ref: Sequence[np.ndarray], got: Sequence[np.ndarray]) -> float:
    from winml_recipes.onnx.metrics import compare_runs

    return compare_runs([{"t": r} for r in ref], [{"t": g} for g in got])["t"]["sqnr_db"]


Runner = Callable[[Path, Sequence[Mapping[str, np.ndarray]]], list[dict[str, np.ndarray]]]


@dataclass
class PrefixSearch:
    """Scores prefixes on the target and the CPU EP against float values of the tensors."""

    prefixes: PrefixModels
    taps: list[PrefixTap]
    floats: list[dict[str, np.ndarray]]  # per feed: float tensor name -> value
    feeds: Sequence[Mapping[str, np.ndarray]]
    on_target: Runner
    work_dir: Path
    threshold_db: float = 30.0
    loss_db: float = 3.0
    float_producer: Mapping[str, onnx.NodeProto] | None = None  # names the layer

    def __post_init__(self) -> None:
        self.rows: dict[int, TensorRow] = {}
        self.loads = 0

    def row(self, index: int) -> TensorRow:
        """Tap `index` scored on its prefix (each prefix compiled once)."""
        if index in self.rows:
            return self.rows[index]
        from winml_recipes.onnx.io import save_model
        from winml_recipes.runtime.sessions import run_model

        pt = self.taps[index]
        model = self.prefixes.prefix(pt.dq_output)
        path = save_model(model, self.work_dir / f"prefix-{index}" / "model.onnx")
        wanted = [i.name for i in model.graph.input]
        feeds = [{k: v for k, v in f.items() if k in wanted} for f in self.feeds]
        self.loads += 1
        target = [r[pt.dq_output] for r in self.on_target(path, feeds)]
        simulated = [r[pt.dq_output] for r in run_model(path, feeds)]
        ref = [f[pt.tap.tensor] for f in self.floats]
        node = (self.float_producer or self.prefixes.producer).get(pt.tap.tensor)
        row = TensorRow(
            tensor=pt.tap.tensor,
            op_type=node.op_type if node is not None else "(graph input)",
            node=node.name if node is not None else "",
            target_vs_float_db=_sqnr(ref, target),
            simulation_vs_float_db=_sqnr(ref, simulated),
            target_vs_simulation_db=_sqnr(simulated, target),
        )
        self.rows[index] = row
        return row

    def departs(self, index: int) -> bool:
        """The target departs here: far from the simulation and further from float. Not
        where the simulation keeps nothing of the tensor either (SQNR <= 0 dB vs float): the
        tiny MobileViT's attention scores at 1e-20, which both round to nothing before a
        Softmax that makes them uniform alike, were named as where HTP departed."""
        r = self.row(index)
        return (
            r.target_vs_simulation_db < self.threshold_db
            and r.simulation_vs_float_db - r.target_vs_float_db >= self.loss_db
            and r.simulation_vs_float_db > 0.0
        )

    def first(self) -> TensorRow | None:
        """The first departing tap by binary search (None: the last tap does not depart)."""
        if not self.taps or not self.departs(len(self.taps) - 1):
            return None
        lo, hi = 0, len(self.taps) - 1  # hi departs; every index < lo is known not to
        while lo < hi:
            mid = (lo + hi) // 2
            if self.departs(mid):
                hi = mid
            else:
                lo = mid + 1
        return self.row(hi)

    def record(self) -> dict[str, Any]:
        return {
            "located_by": "prefixes",
            "prefix_loads": self.loads,
            "prefixes_scored": [self.rows[i].to_json() for i in sorted(self.rows)],
        }


def first_divergence_by_prefixes(
    candidate: Path,
    reference: Path,
    feeds: Sequence[Mapping[str, np.ndarray]],
    on_target: Runner,
    work_dir: Path,
    threshold_db: float = 30.0,
    loss_db: float = 3.0,
) -> tuple[TensorRow | None, dict[str, Any]]:
    """The first activation whose prefix departs from the simulation, and a record of the
    search (prefix loads, the prefixes scored)."""
    from winml_recipes.onnx.io import load_model, save_model
    from winml_recipes.quant.divergence import _with_outputs
    from winml_recipes.runtime.sessions import run_model

    qdq = load_model(candidate)
    float_model = load_model(reference)
    names = {i.name for i in float_model.graph.input}
    names |= {o for n in float_model.graph.node for o in n.output}
    taps = prefix_taps(qdq, names)
    tapped = save_model(
        _with_outputs(float_model, [t.tap.tensor for t in taps]), work_dir / "float-taps.onnx"
    )
    floats = run_model(tapped, feeds)
    producer = {o: n for n in float_model.graph.node for o in n.output}
    search = PrefixSearch(
        PrefixModels(qdq), taps, floats, feeds, on_target, work_dir, threshold_db, loss_db,
        producer,
    )  # fmt: skip
    first = search.first()
    return first, search.record()
