"""Split compilation: a graph too large to prepare at once, compiled as consecutive parts.

The graph is cut at tensor boundaries (onnx/split.py), each part compiled to its own
EPContext model (a fresh process each, as `compile_epcontext` does), then the parts'
EPContext nodes are stitched into ONE model: onnxruntime 1.31.1 with the NPU's plugin EP
loads a model holding several EPContext nodes in sequence, each with its own context
binary, with CPU fallback off, and its outputs equal the unsplit compiled model's bit for
bit (measured: docs/split-compile.md). So `run`, `perf` and an application load `model_ctx.onnx` as
before; the manifest records the parts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx
from onnx import helper

from winml_recipes.sdk.errors import ExecutionProviderError, PassError
from winml_recipes.untrusted import printable

if TYPE_CHECKING:
    from winml_recipes.onnx.split import Boundary, Part, Splitter
    from winml_recipes.sdk.ep import ExecutionProvider

MOST_PARTS = 16
SPLIT_VERSION = 2  # bumped when the cut choice changes (cache key)


@dataclass(frozen=True)
class SplitPlan:
    """The parts a compile makes and each one's estimated preparation peak (MB)."""

    parts: tuple[Part, ...]
    estimates_mb: tuple[float, ...]
    whole_mb: float | None  # the unsplit graph's estimate
    why: str  # "asked" (parts: N) or why the budget needed it

    @property
    def count(self) -> int:
        return len(self.parts)


def _estimate(model: onnx.ModelProto, ep: ExecutionProvider, shapes: Mapping) -> float | None:
    from winml_recipes.engine.budget import graph_preparation_estimate

    found = graph_preparation_estimate(model, dict(shapes), ep)
    return None if found is None else found.mb


def plan_split(
    src: Path,
    ep: ExecutionProvider,
    shapes: Mapping[str, tuple[int, ...]],
    parts: int | None,
    budget_mb: float | None,
    boundary: Boundary = "quantized",
    cut_after: Sequence[str] = (),
) -> SplitPlan:
    """The parts to compile: cut after the tensors `cut_after` names when given, else
    `parts` when given, else one unless the EP's preparation estimate of the whole graph
    exceeds `budget_mb` or the EP's largest_mb (then the fewest, up to MOST_PARTS, whose
    every part fits; cuts prefer the places between transformer blocks)."""
    # the estimate, the cache key and the run ask the same question: answered once
    key = (str(src), src.stat().st_mtime_ns, ep.key, ep.preparation_cost(),
           tuple(sorted(shapes.items())), parts, budget_mb, boundary, tuple(cut_after))  # fmt: skip
    if _LAST and _LAST[0] == key:
        return _LAST[1]
    plan = _plan(src, ep, dict(shapes), parts, budget_mb, boundary, tuple(cut_after))
    _LAST[:] = [key, plan]
    return plan


_LAST: list[Any] = []  # (key, plan) of the last plan: one model's parts in memory at most


def _plan(
    src: Path,
    ep: ExecutionProvider,
    shape_map: dict[str, tuple[int, ...]],
    parts: int | None,
    budget_mb: float | None,
    boundary: Boundary,
    cut_after: tuple[str, ...],
) -> SplitPlan:
    from winml_recipes.onnx.io import load_model
    from winml_recipes.onnx.split import Splitter

    model = load_model(src, load_external_data=False)
    if cut_after:
        splitter = Splitter(model, boundary)
        try:
            made = splitter.parts(splitter.cuts_after(cut_after))
        except ValueError as exc:
            raise PassError(f"compile: cut_after: {exc}") from None
        costs = [_estimate(p.model, ep, shape_map) or 0.0 for p in made]
        whole = _estimate(model, ep, shape_map)
        return SplitPlan(
            tuple(made), tuple(costs), whole, f"cut after {len(made) - 1} tensors asked"
        )
    whole = _estimate(model, ep, shape_map)
    limit, why_limit = _limit(ep, budget_mb)
    if parts == 1 or (parts is None and (whole is None or limit is None or whole <= limit)):
        return SplitPlan((), (), whole, "")
    splitter = Splitter(model, boundary)
    if parts is not None:
        _check_cut_points(splitter, parts)
    points = len(splitter.cut_points())
    most = min(MOST_PARTS, points + 1)
    counts = [parts] if parts is not None else range(2, most + 1)
    largest: float | None = None  # the largest part's estimate at the most parts tried
    for n in counts:
        try:
            made = splitter.parts(splitter.choose_cuts(n))
        except ValueError as exc:
            if parts is not None:
                raise PassError(f"compile: cannot split into {n} parts: {exc}; ask fewer") from None
            break  # no more places to cut
        # a part's own inputs are sized by shape inference (fix_shapes made them static)
        costs = [_estimate(p.model, ep, shape_map) or 0.0 for p in made]
        largest = max(costs)
        if parts is not None or max(costs) <= (limit or float("inf")):
            why = (
                f"parts: {parts} asked"
                if parts is not None
                else f"the whole graph's preparation estimate {whole:.0f} MB exceeds {why_limit}"
            )
            return SplitPlan(tuple(made), tuple(costs), whole, why)
    if most < MOST_PARTS:  # the graph ran out of places to cut before the count did
        at_most = f" ({largest:.0f} MB at {most} parts)" if largest is not None else ""
        raise PassError(
            f"compile: this graph has {points} cut points (places between nodes that keep "
            f"every Q/DQ pair whole), so at most {most} parts, and no split brings every "
            f"part's preparation estimate under {why_limit}{at_most}; raise the budget or "
            "shrink the graph's largest tensors"
        )
    raise PassError(
        f"compile: no split into at most {MOST_PARTS} parts brings every part's preparation "
        f"estimate under {why_limit}; raise the budget or shrink the graph's largest tensors"
    )


def _check_cut_points(splitter: Splitter, parts: int) -> None:
    """`parts` needs parts - 1 places to cut; say how many the graph has when it has fewer."""
    points = len(splitter.cut_points())
    if parts - 1 > points:
        raise PassError(
            f"compile: parts: {parts} needs {parts - 1} cut points, but this graph has "
            f"{points} (places between nodes that keep every Q/DQ pair whole); the largest "
            f"parts value that works here is {points + 1}"
        )


def _limit(ep: ExecutionProvider, budget_mb: float | None) -> tuple[float | None, str]:
    """The largest part estimate a split allows: the memory budget, or the EP's largest
    preparation known to finish at once (PreparationCost.largest_mb) where that is lower."""
    cost = ep.preparation_cost()
    largest = cost.largest_mb if cost is not None else None
    if largest is not None and (budget_mb is None or largest < budget_mb):
        return largest, f"the largest graph {ep.key} prepares at once ({largest:.0f} MB)"
    if budget_mb is None:
        return None, "no limit"
    return budget_mb, f"the memory budget {budget_mb:.0f} MB"


def compile_parts(
    plan: SplitPlan,
    whole: Path,
    work_dir: Path,
    out: Path,
    ep_key: str,
    *,
    embed: bool,
    provider_options: Mapping[str, str],
    device: str | None,
) -> list[dict[str, Any]]:
    """Compile each part (child processes) and stitch them into `out`; what each part is."""
    from winml_recipes.runtime.epcontext import compile_epcontext

    work_dir.mkdir(parents=True, exist_ok=True)
    compiled: list[Path] = []
    records: list[dict[str, Any]] = []
    for j, part in enumerate(plan.parts):
        src = work_dir / f"part{j}.onnx"
        onnx.save(part.model, src)
        # the EP writes its context binary beside it, named after its stem, in `out`'s folder
        ctx = out.parent / f"{out.stem}_part{j}.onnx"
        try:
            measured = compile_epcontext(
                src, ctx, ep_key, embed=embed, provider_options=provider_options, device=device
            )
        except ExecutionProviderError as exc:
            raise ExecutionProviderError(
                f"part {j} of {plan.count} ({part.nodes} nodes from "
                f"{printable(', '.join(part.inputs[:3]))}): {exc.message}; try more parts"
            ) from None
        if not ctx.is_file():
            raise PassError(f"compile: part {j} produced no EPContext model")
        compiled.append(ctx)
        records.append(
            {
                "index": j,
                "nodes": part.nodes,
                "inputs": list(part.inputs),
                "outputs": list(part.outputs),
                "estimate_mb": round(plan.estimates_mb[j]),
                # the part's own process (one at a time): what its preparation took
                "prepare_seconds": measured.get("seconds"),
                "prepare_peak_rss_mb": measured.get("peak_rss_mb"),
            }
        )
    stitch(compiled, onnx.load(whole, load_external_data=False), out)
    for j, ctx in enumerate(compiled):
        records[j]["binaries"] = _binaries(ctx)
        ctx.unlink()
    return records


def part_models(plan: SplitPlan, work_dir: Path) -> list[Path]:
    """The uncompiled parts, written under `work_dir` (compile_parts writes them too)."""
    paths = []
    for j, part in enumerate(plan.parts):
        path = work_dir / f"part{j}.onnx"
        if not path.is_file():
            onnx.save(part.model, path)
        paths.append(path)
    return paths


def _binaries(ctx: Path) -> list[str]:
    """Context binary files an EPContext model points at (embed mode 0)."""
    names = []
    for node in onnx.load(ctx, load_external_data=False).graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "EPContext" and attrs.get("embed_mode") == 0:
            names.append(attrs["ep_cache_context"].decode())
    return names


def stitch(parts: Sequence[Path], whole: onnx.ModelProto, out: Path) -> None:
    """One model whose nodes are the compiled parts' nodes in order (EPContext nodes, each
    naming its own binary), with the unsplit graph's inputs and outputs."""
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    value_info: list[onnx.ValueInfoProto] = []
    opsets: dict[str, int] = {}
    ir_version = whole.ir_version
    outputs = {o.name for o in whole.graph.output}
    names: set[str] = set()
    for path in parts:
        part = onnx.load(path)  # embedded binaries are attributes: loaded whole
        ir_version = max(ir_version, part.ir_version)
        for node in part.graph.node:
            if node.name in names:
                raise PassError(f"compile: two parts' nodes are both named '{node.name}'")
            names.add(node.name)
        nodes += part.graph.node
        inits += part.graph.initializer
        value_info += [o for o in part.graph.output if o.name not in outputs]
        for op in part.opset_import:
            opsets[op.domain] = max(opsets.get(op.domain, 0), op.version)
    graph = helper.make_graph(
        nodes,
        whole.graph.name or "split",
        list(whole.graph.input),
        list(whole.graph.output),
        inits,
        value_info=value_info,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid(d, v) for d, v in sorted(opsets.items())],
        ir_version=ir_version,
    )
    model.producer_name = "winml-recipes (split compile)"
    onnx.save(model, out)
