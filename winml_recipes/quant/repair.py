"""Divergence repair: where the target departs from the CPU simulation of the same QDQ model,
find the first layer that departs and quantize it another way, during the build.

The quantized model runs on the target's EP (fallback off, as verify runs it) and on the CPU
EP on a few held-out samples. Where an output departs (below DEPARTS_DB against the
simulation and LOSS_DB further from float), the first departing layer is found on prefixes
of the graph (quant/prefixes.py: no taps, so the EP compiles what it compiles in the model),
and these repairs are tried on it, in order, each re-quantized from the same ranges and
re-run on the target; the first that makes the target agree (or gains REPAIR_GAIN_DB) is
kept, and the search goes on with the next departing layer, up to MAX_ROUNDS:

- shared_encoding: the layer's quantized inputs and output get one range (one scale and
  zero point), what HTP needs for the ops that move integers without requantizing them
  (ScatterElements, reshaped Concat inputs, Identity: the HTP plugin's encoding rules);
- activations_16bit: its 8-bit inputs and output at 16 bits (uint8 builds);
- float: the node left out of quantization;
- float_normalizations: where the layer reads a LayerNormalization (within NORM_HOPS
  producers), every LayerNormalization of the graph left out of quantization. Measured on
  HTP with the tiny MobileViT (BatchNorm scales at 1): its transformer MLP
  (LayerNormalization -> MatMul -> x * sigmoid(x)) came out at 12.3 dB against the
  simulation from the LayerNormalization's input, while LayerNormalization alone (93.7 dB),
  LayerNormalization -> MatMul (63.3 dB) and MatMul -> x * sigmoid(x) (63.4 dB) agree; with
  its LayerNormalization's scale and bias in float, 62.6 dB. Floating the found layer alone
  did not repair it (logits 10.3 -> 12.0 dB), and the model has one such block per layer.

Every layer found, every repair tried with the outputs it gave, and what was kept are
recorded; the verdict (verify) still judges the model that results.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# an output departs: below DEPARTS_DB against the simulation and LOSS_DB further from float
# than the simulation is (a gross departure: rounding differences between two right runs
# stay above it; sam3-tiny's decoder, right on HTP, is 25 dB vs float there, 30 simulated)
DEPARTS_DB = 20.0
LOSS_DB = 6.0
# a layer departs (the search): a clear break, not rounding noise that grew on the way
# (MobileViT: matmul_2 at 28.1 dB target vs simulation, 3.1 dB loss, was noise; the
# layer HTP gets wrong, silu_17, is at -9.2 dB)
LAYER_DEPARTS_DB = 20.0
LAYER_LOSS_DB = 6.0
NORMALIZATIONS = frozenset({"LayerNormalization"})
NORM_HOPS = 3  # producers walked up from the departing layer to find a normalization
REPAIR_GAIN_DB = 3.0  # a repair that does not make the target agree must gain this much
MAX_ROUNDS = 3  # departing layers repaired per build
SAMPLES = 1  # held-out samples the checks run on (divergences are gross; each costs a target run)


@dataclass
class QuantizeState:
    """What a re-quantization takes: ranges, type overrides, nodes kept float."""

    ranges: dict[str, tuple[float, float]]
    overrides: dict[str, list[dict[str, Any]]]
    exclude: list[str] = field(default_factory=list)


Requantize = Callable[[QuantizeState, Path], None]  # writes the QDQ model at the path
Runner = Callable[[Path, Sequence[Mapping[str, np.ndarray]]], list[dict[str, np.ndarray]]]


def _sqnr(ref: list[dict[str, np.ndarray]], got: list[dict[str, np.ndarray]]) -> dict[str, float]:
    from winml_recipes.onnx.metrics import compare_runs

    return {k: round(v["sqnr_db"], 2) for k, v in compare_runs(ref, got).items()}


@dataclass
class Measured:
    target: dict[str, float]  # per output, SQNR dB vs float
    simulation: dict[str, float]
    apart: dict[str, float]  # target vs simulation

    def departs(self) -> bool:
        return any(
            self.apart[n] < DEPARTS_DB and self.simulation[n] - self.target[n] >= LOSS_DB
            for n in self.apart
        )

    def worst_apart(self) -> float:
        return min(self.apart.values())

    def worst_target(self) -> float:
        return min(self.target.values())

    def worst_simulation(self) -> float:
        return min(self.simulation.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "target_vs_float_db": self.target,
            "simulation_vs_float_db": self.simulation,
            "target_vs_simulation_db": self.apart,
        }


def _measure(path: Path, feeds: Sequence[Mapping[str, np.ndarray]], reference: list,
             on_target: Runner) -> Measured:  # fmt: skip
    from winml_recipes.runtime.sessions import run_model

    target = on_target(path, feeds)
    simulated = run_model(path, feeds)
    return Measured(_sqnr(reference, target), _sqnr(reference, simulated),
                    _sqnr(simulated, target))  # fmt: skip


def keeps(before: Measured, after: Measured) -> bool:
    """A repair is kept when the target agrees with its simulation afterwards (or gains
    REPAIR_GAIN_DB of agreement) and the target is no further from float than before: a
    repair that spoils the simulation too would "agree" with a model that is worse (MobileViT:
    a shared encoding at a Concat took the simulated logits from 23.3 to -0.5 dB), nor when
    the simulation loses more than LOSS_DB (the same repair with the target at -6.39 dB before
    and -6.34 after was kept: the target "agreed" with a simulation spoiled by 23.8 dB)."""
    agrees = not after.departs() or after.worst_apart() - before.worst_apart() >= REPAIR_GAIN_DB
    kept_simulation = after.worst_simulation() >= before.worst_simulation() - LOSS_DB
    return agrees and kept_simulation and after.worst_target() >= before.worst_target()


def _normalizations_upstream(node, graph, hops: int = NORM_HOPS) -> list[str]:
    """Names of every normalization node of `graph` of the op type found within `hops`
    producers above `node` (`node` itself included), or []."""
    producer = {o: n for n in graph.node for o in n.output}
    frontier, seen = [node], set()
    for _ in range(hops + 1):
        found = next((n.op_type for n in frontier if n.op_type in NORMALIZATIONS), None)
        if found is not None:
            return [n.name for n in graph.node if n.op_type == found and n.name]
        seen.update(id(n) for n in frontier)
        frontier = [
            up for n in frontier for t in n.input
            if (up := producer.get(t)) is not None and id(up) not in seen
        ]  # fmt: skip
    return []


def _repairs(
    node, state: QuantizeState, activation_type: str, graph=None
) -> list[tuple[str, QuantizeState]]:
    """The repairs that apply to `node` (a float-graph node of `graph`), in the order they
    are tried."""
    from winml_recipes.sdk.ranges import unify_ranges

    tensors = [t for t in [*node.input, *node.output] if t and t in state.ranges]
    tensors = list(dict.fromkeys(tensors))
    out: list[tuple[str, QuantizeState]] = []
    if len(tensors) > 1 and len({state.ranges[t] for t in tensors}) > 1:
        ranges = unify_ranges(state.ranges, [tensors])
        out.append(("shared_encoding", QuantizeState(ranges, state.overrides, state.exclude)))
    if activation_type in ("uint8", "int8") and tensors:
        wide = "uint16" if activation_type == "uint8" else "int16"
        overrides = {**state.overrides, **{t: [{"quant_type": wide}] for t in tensors}}
        out.append(("activations_16bit", QuantizeState(state.ranges, overrides, state.exclude)))
    if node.name and node.name not in state.exclude:
        exclude = [*state.exclude, node.name]
        out.append(("float", QuantizeState(state.ranges, state.overrides, exclude)))
    norms = _normalizations_upstream(node, graph) if graph is not None else []
    if [n for n in norms if n not in state.exclude]:
        exclude = [*state.exclude, *[n for n in norms if n not in state.exclude]]
        out.append(("float_normalizations", QuantizeState(state.ranges, state.overrides, exclude)))
    return out


def repair_divergence(
    float_src: Path,
    out: Path,
    state: QuantizeState,
    requantize: Requantize,
    feeds: Sequence[Mapping[str, np.ndarray]],
    on_target: Runner,
    activation_type: str,
    work_dir: Path,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, Any]:
    """Check `out` on the target against its simulation and repair the layers that depart
    (the repaired model replaces `out`); the record for the manifest."""
    from winml_recipes.onnx.io import load_model
    from winml_recipes.quant.prefixes import first_divergence_by_prefixes
    from winml_recipes.runtime.sessions import run_model
    from winml_recipes.sdk.errors import WinmlError

    feeds = list(feeds)[:SAMPLES]
    reference = run_model(float_src, feeds)
    graph = load_model(float_src, load_external_data=False).graph
    nodes = {n.name: n for n in graph.node if n.name}
    producer = {o: n for n in graph.node for o in n.output}
    try:
        measured = _measure(out, feeds, reference, on_target)
    except WinmlError as exc:  # verify runs it again and explains the failure
        return {"checked": False, "why": str(exc).splitlines()[0][:300]}
    record: dict[str, Any] = {"checked": True, "samples": len(feeds), "before": measured.to_json()}
    current, rounds = out, []
    for r in range(MAX_ROUNDS):
        if not measured.departs():
            break
        if progress is not None:
            progress("divergence repair rounds", r + 1, MAX_ROUNDS)
        first, search = first_divergence_by_prefixes(
            current, float_src, feeds, on_target, work_dir / f"round-{r}", LAYER_DEPARTS_DB,
            LAYER_LOSS_DB,
        )  # fmt: skip
        if first is None:
            rounds.append({"found": None, "prefix_loads": search["prefix_loads"]})
            break
        entry: dict[str, Any] = {"found": first.to_json(), "prefix_loads": search["prefix_loads"]}
        rounds.append(entry)
        node = nodes.get(first.node) or producer.get(first.tensor)
        tried: list[dict[str, Any]] = []
        entry["tried"] = tried
        for action, candidate in _repairs(node, state, activation_type, graph) if node else []:
            dest = work_dir / f"round-{r}-{action}" / "model.onnx"
            try:
                requantize(candidate, dest)
                after = _measure(dest, feeds, reference, on_target)
            except WinmlError as exc:
                tried.append({"repair": action, "error": str(exc).splitlines()[0][:200]})
                continue
            tried.append({"repair": action, **after.to_json()})
            if keeps(measured, after):
                entry["kept"] = action
                state, current, measured = candidate, dest, after
                break
        if "kept" not in entry:
            break
    record["rounds"] = rounds
    record["after"] = measured.to_json()
    record["repaired"] = [
        {"tensor": e["found"]["tensor"], "node": e["found"]["node"], "repair": e["kept"]}
        for e in rounds
        if e.get("kept")
    ]
    record["still_departs"] = measured.departs()
    if current != out:
        shutil.copyfile(current, out)
        for sidecar in current.parent.glob(current.name + "*data"):
            shutil.copyfile(sidecar, out.parent / sidecar.name)
        record["float_nodes"] = state.exclude
        record["tensor_overrides"] = sorted(state.overrides)
    return record
