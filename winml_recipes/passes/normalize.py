"""normalize: basic offline optimization that keeps standard ops, stamped so it runs once.

The stamp (metadata_props) records the tool and the graph fingerprint after normalizing.
A model whose stamp matches its current fingerprint is skipped; a model edited after
normalization no longer matches and is normalized again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from winml_recipes.sdk.config import option
from winml_recipes.sdk.passes import Pass, model_file, register
from winml_recipes.sdk.target import Target
from winml_recipes.sdk.types import ModelFacts, StepContext, StepResult
from winml_recipes.services.memory import RewritesGraph
from winml_recipes.services.models import TOOL_VERSION as __version__


@dataclass(frozen=True)
class NormalizeConfig:
    backend: Literal["ort", "onnxscript"] = option(
        "ort",
        "ort: onnxruntime BASIC offline optimization; onnxscript: "
        "onnxscript.optimizer (constant folding, dead code removal).",
    )
    force: bool = option(False, "Normalize even when the model's stamp says it already is.")


@register
class NormalizePass(RewritesGraph, Pass[NormalizeConfig]):
    name = "normalize"
    version = 5
    target_dependent = False
    summary = "Constant folding and cleanup that keeps standard ONNX ops (runs once per model)."

    def skip_reason(self, facts: ModelFacts, config: NormalizeConfig, target: Target) -> str | None:
        if facts.quantized:
            return f"source already quantized ({facts.quant_summary})"
        if facts.normalized and not config.force:
            return f"already normalized ({facts.normalized_why or 'stamped'})"
        return None

    def facts_after(self, facts: ModelFacts, config: NormalizeConfig) -> ModelFacts:
        return facts.evolve(normalized=True, normalized_why="normalized by an earlier step")

    def run(
        self, src: Path | None, out_dir: Path, config: NormalizeConfig, ctx: StepContext
    ) -> StepResult:
        from winml_recipes.services.models import (
            graph_digest,
            load_model,
            name_nodes,
            save_model,
            write_stamp,
        )

        assert src is not None
        source = load_model(src, load_external_data=False)
        before = len(source.graph.node)
        hoisted = _late_constants(source.graph)
        if hoisted:  # read by an If/Loop body before the node that makes them: move them up
            model = load_model(src)
            _constants_first(model.graph)
            src = save_model(model, ctx.work_dir / "constants-first" / "model.onnx")
        backend, fallback = config.backend, None
        model = _ort_basic(src, ctx.work_dir) if backend == "ort" else _onnxscript(src)
        broken = _invalid(model) if backend == "ort" else None
        if broken:
            # onnxruntime's saved graph drops outer-scope values that an If/Loop body reads
            # (silero-vad: "input '/Constant_1_output_0' ... is not output of any previous
            # nodes"); onnxscript's optimizer keeps scopes.
            backend, fallback = "onnxscript", f"onnxruntime's output was invalid: {broken}"
            model = _onnxscript(src)
        renamed = _rename_new_initializers(model, {t.name for t in source.graph.initializer})
        named = name_nodes(model.graph)
        model.graph.ClearField("value_info")
        write_stamp(model, tool=f"winml-recipes {__version__} normalize/{backend}")
        out = save_model(model, model_file(out_dir))
        after = graph_digest(model)["node_count"]
        return StepResult(
            out,
            {
                "nodes_before": before,
                "nodes_after": after,
                "initializers_renamed": renamed,
                "nodes_named": named,
                **({"constants_moved_up": hoisted} if hoisted else {}),
                **({"backend_used": backend, "fallback": fallback} if fallback else {}),
            },
        )


NEW_INITIALIZER_SUFFIX = "__normalized"


def _rename_new_initializers(model, source_names: set[str]) -> int:
    """Give the initializers the optimizer created names it will not create again.

    onnxruntime's Gemm fusion names its shape constants `gemm_input_shape` /
    `gemm_output_shape`. When a later session re-optimizes the model (after fix_shapes made
    more MatMul+Add pairs static, say), it creates them again and fails: "Attempt to replace
    the existing tensor". Renamed here, the names cannot collide.
    """
    graph = model.graph
    taken = {t.name for t in graph.initializer} | {o for n in graph.node for o in n.output}
    renames: dict[str, str] = {}
    for tensor in graph.initializer:
        if tensor.name in source_names:
            continue
        new = f"{tensor.name}{NEW_INITIALIZER_SUFFIX}"
        while new in taken:
            new += "_"
        taken.add(new)
        renames[tensor.name] = new
        tensor.name = new
    _rewire(graph, renames)
    for vi in graph.input:
        if vi.name in renames:
            vi.name = renames[vi.name]
    return len(renames)


def _ort_basic(src: Path, scratch: Path):
    """onnxruntime BASIC level: constant folding and redundant-node removal, standard ops only.

    ORT writes the optimized graph for us (no rewrite of its optimizer here); external data
    is written to a fresh sidecar in scratch so the original sidecar is never referenced.
    """
    from winml_recipes.services.models import load_model
    from winml_recipes.services.runtime import optimize_offline

    def configure(opts) -> None:
        opts.add_session_config_entry(
            "session.optimized_model_external_initializers_file_name", "optimized.onnx.data"
        )
        opts.add_session_config_entry(
            "session.optimized_model_external_initializers_min_size_in_bytes", str(1 << 30)
        )

    optimize_offline(src, scratch / "optimized.onnx", configure)
    model = load_model(scratch / "optimized.onnx")
    # ORT records its own producer; keep the source's metadata minus our stale stamp.
    return model


def _rewire(graph, renames: dict[str, str]) -> None:
    """Point every reader at the new names, in If/Loop bodies too (they read outer values:
    silero-vad's decoder lost `/Constant_output_0` when only the main graph was rewired)."""
    import onnx

    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in renames:
                node.input[i] = renames[name]
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                _rewire(attr.g, renames)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    _rewire(sub, renames)


def _late_constants(graph) -> int:
    """How many Constant nodes come after a node whose subgraph reads them (exporters write
    that; onnxruntime runs it, but its optimizer and onnx_ir lose the value: silero-vad's
    `/Constant_output_0`, read in an If branch, "cannot be found in any scope")."""
    import onnx

    made_at = {o: i for i, n in enumerate(graph.node) if n.op_type == "Constant" for o in n.output}
    late = set()
    for i, node in enumerate(graph.node):
        for attr in node.attribute:
            subgraphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subgraphs:
                for name in _names_read(sub):
                    if made_at.get(name, -1) > i:
                        late.add(name)
    return len(late)


def _names_read(graph):
    """Every value name a graph's nodes read, its subgraphs' included."""
    import onnx

    for node in graph.node:
        yield from node.input
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _names_read(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from _names_read(sub)


def _constants_first(graph) -> None:
    """Constant nodes (no inputs) first, the rest in their order: still topological."""
    nodes = list(graph.node)
    ordered = [n for n in nodes if n.op_type == "Constant"] + [
        n for n in nodes if n.op_type != "Constant"
    ]
    del graph.node[:]
    graph.node.extend(ordered)


def _invalid(model) -> str | None:
    """The first problem onnx's checker finds in the graph (scopes, order), or None."""
    import onnx

    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        return " ".join(str(exc).split())[:160]
    except ValueError:  # too large for an in-memory check: onnxruntime loads it next anyway
        return None
    return None


def _onnxscript(src: Path):
    import onnx_ir as ir
    import onnxscript.optimizer

    from winml_recipes.services.models import load_model

    model = ir.from_proto(load_model(src))
    onnxscript.optimizer.optimize(model)
    return ir.to_proto(model)
