"""QNN HTP's graph rewrites and encoding rules: one rule set, onnxscript rules and onnx_ir passes.

`float_rewrites()` is the ordered list of steps the `prepare` pass runs as its `htp` stage
(before calibration; exact in float): the library's passes where one exists
(IdentityEliminationPass, RemoveUnusedNodesPass, onnxscript's constant folder and its
transpose-transpose rule), the rules of rules.py, and attention.py's query chunking (score
tensors above the plugin's `max_tensor_elements`). `qdq_rewrites()` runs on the QDQ graph
after quantization (NaN guards). encodings.py holds the shared-encoding and range rules
calibration applies. Every step runs on the main graph and on its subgraphs (If/Loop/Scan
bodies): the rules match nodes there as well, reading outer values as inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import onnx
import onnx_ir as ir
import onnx_ir.passes.common

from winml_recipes.graph.log import RewriteLog

# Ops that compute from shapes: once every input dim is static, what they feed is a constant.
SHAPE_OPS = frozenset({"Shape", "Size", "Range", "ConstantOfShape"})

_RULE_METADATA = "pkg.onnxscript.rewriter.rule_name"
RULE_FOLD = "fold_shape_computations"
RULE_IDENTITY = "identity_elimination"
RULE_TRANSPOSES = "transpose_pair"
# Every rule name the float rewrites log (the `prepare` stage's rules).
RULES = (
    RULE_FOLD, RULE_IDENTITY, "batchnorm_to_mul_add", "where_of_constants_to_arithmetic",
    "erf_gelu_to_gelu", RULE_TRANSPOSES, "channel_scatter_to_elementwise",
    "constant_scatter_to_arithmetic", "constant_gathernd_to_gather", "merge_constant_chain",
    "zero_constant_add", "infinite_bound_to_identity", "rotate_pairwise_to_gather",
    "chunk_attention_queries", "waveform_conv_to_polyphase",
    "reduce_unit_axes", "whole_map_average_pool", "reduce_l2_to_sqrt_of_sum",
    "high_rank_unary_to_rank4", "fold_high_rank_axes",
)  # fmt: skip


@dataclass(frozen=True)
class Step:
    """One named rewrite step of the rule set: `run(model, log)` rewrites in place."""

    name: str
    run: Callable[[ir.Model, RewriteLog], object]


def _graphs(model: ir.Model) -> list[ir.Graph]:
    return [model.graph, *model.graph.subgraphs()]


def _rules(*make: Callable[[RewriteLog], list]) -> Callable[[ir.Model, RewriteLog], int]:
    """A step applying onnxscript rules (built on the run's log) to every graph."""

    def run(model: ir.Model, log: RewriteLog) -> int:
        import onnxscript.optimizer
        from onnxscript.rewriter import pattern

        rules = pattern.RewriteRuleSet([rule for m in make for rule in m(log)])
        count = 0
        for graph in _graphs(model):
            onnxscript.optimizer.basic_constant_propagation(graph)
            # RewriteRuleSet.apply_to_model visits the main graph and functions only
            count += rules._apply_to_graph_or_function(model, graph, verbose=None, tracer=None)
            # new nodes carry no rewriter metadata: a rewritten model is the model the
            # protobuf rewrites made
            for node in graph:
                node.metadata_props.pop(_RULE_METADATA, None)
        return count

    return run


class _IdentityElimination(ir.passes.common.IdentityEliminationPass):
    """onnx_ir's IdentityEliminationPass, keeping an Identity that gives a graph output its
    name (the library renames the producer's value instead: exact, but another graph to
    quantize; HTP's rewrites have always kept those Identities)."""

    def _try_eliminate_identity_node(self, node: ir.Node) -> bool:
        if node.op_type == "Identity" and node.outputs and node.outputs[0].is_graph_output():
            return False
        return super()._try_eliminate_identity_node(node)


def _library_pass(pass_: ir.passes.PassBase, rule: str | None = None):
    def run(model: ir.Model, log: RewriteLog) -> bool:
        before = {id(n): n.name for g in _graphs(model) for n in g} if rule else {}
        modified = pass_(model).modified
        if rule:
            kept = {id(n) for g in _graphs(model) for n in g}
            for key, name in before.items():
                if key not in kept:
                    log.add(rule, name)
        return modified

    return run


def _fold_shape_computations(model: ir.Model, log: RewriteLog) -> int:
    """onnxscript's optimizer (its folder and its size limits) when the graph still
    computes from shapes: HTP refuses Range and GatherND, and the rules need constant
    operands (a dynamo-exported BERT builds its mask's GatherND indices from Shape ->
    Range -> Expand, constants once `fix_shapes` ran). The `fold` stage usually did this."""
    import onnxscript.optimizer

    if not any(n.op_type in SHAPE_OPS for n in model.graph):
        return 0
    before = {id(n): n.name for n in model.graph}
    onnxscript.optimizer.optimize(model)
    kept = {id(n) for n in model.graph}
    for key, name in before.items():
        if key not in kept:
            log.add(RULE_FOLD, name)
    return len(before) - len(kept)


def _shapes(model: ir.Model, log: RewriteLog) -> None:
    """onnx_ir's ShapeInferencePass, keeping the initializers' order (the pass takes the
    large ones out while onnx infers and puts them back last: the model would change)."""
    import onnx_ir.passes.common as common

    order = list(model.graph.initializers)
    common.ShapeInferencePass(strict_mode=False)(model)
    values = dict(model.graph.initializers)
    if list(values) != order:
        model.graph.initializers.clear()
        for name in [*order, *(n for n in values if n not in order)]:
            if name in values:
                model.graph.initializers[name] = values[name]


def _transposes(log: RewriteLog) -> list:
    """onnxscript's transpose-transpose rule (inverse pairs become an Identity, which the
    identity pass then removes), counted in the log."""
    from onnxscript.rewriter.rules.common._basic_rules import TransposeTranspose

    class Logged(TransposeTranspose):
        def check(self, context, x, perm1, perm2):
            result = super().check(context, x, perm1, perm2)
            if not result:
                return result
            p, q = perm1.as_ints(), perm2.as_ints()
            if len(p) != len(q) or [p[i] for i in q] != list(range(len(p))):
                # the library merges any pair into one Transpose: HTP's rule removes only
                # pairs that cancel (a merged pair is another graph, quantized otherwise)
                return result.fail("the permutations do not cancel")
            return result

        def rewrite(self, op, x, perm1, perm2):
            log.add(RULE_TRANSPOSES, x.name)
            return super().rewrite(op, x, perm1, perm2)

    return [Logged.rule()]


def float_rewrites(max_tensor_elements: int | None = None, max_rank: int = 5) -> list[Step]:
    """The float rewrites HTP needs, in order (the `prepare` pass's `htp` stage);
    `max_tensor_elements`: attention scores above it are computed in query chunks;
    `max_rank`: tensors above it are folded to it where the ops allow."""
    import onnx_ir.passes.common as common

    from winml_recipes.eps.qnn.rules import rules as r
    from winml_recipes.eps.qnn.rules.attention import ChunkedAttentionPass
    from winml_recipes.eps.qnn.rules.rank_fold import RankFoldPass
    from winml_recipes.eps.qnn.rules.waveform_conv import WaveformConvPass

    def chunk(model: ir.Model, log: RewriteLog) -> object:
        assert max_tensor_elements is not None
        return ChunkedAttentionPass(log, max_tensor_elements)(model)

    def one(cls, *ops):
        return lambda log: [cls.rule(log, op) for op in ops or (None,)]

    return [
        Step("shapes", _shapes),
        Step(RULE_FOLD, _fold_shape_computations),
        Step(RULE_IDENTITY, _library_pass(_IdentityElimination(), RULE_IDENTITY)),
        Step("shapes", _shapes),
        Step(r.BatchNormToMulAdd.rule_name, _rules(one(r.BatchNormToMulAdd))),
        Step(r.WhereOfConstantsToArithmetic.rule_name, _rules(one(r.WhereOfConstantsToArithmetic))),
        Step(r.ErfGeluPass.rule_name, lambda m, log: r.ErfGeluPass(log)(m)),
        Step(WaveformConvPass.rule_name, lambda m, log: WaveformConvPass(log)(m)),
        Step(RULE_TRANSPOSES, _rules(_transposes)),
        Step(RULE_IDENTITY, _library_pass(_IdentityElimination())),
        Step(r.ChannelScatterToElementwise.rule_name, _rules(one(r.ChannelScatterToElementwise))),
        Step(
            r.ConstantScatterToArithmetic.rule_name,
            _rules(one(r.ConstantScatterToArithmetic, "ScatterElements", "ScatterND")),
        ),
        Step(r.ConstantGatherNDToGather.rule_name, _rules(one(r.ConstantGatherNDToGather))),
        # before the merge rule: it folds the rotation's signs into the sin table
        Step(r.RotatePairwiseToGather.rule_name, _rules(one(r.RotatePairwiseToGather))),
        Step("dead", _library_pass(common.RemoveUnusedNodesPass())),
        Step(RULE_IDENTITY, _library_pass(_IdentityElimination(), RULE_IDENTITY)),
        Step(r.MergeConstantChain.rule_name, _rules(one(r.MergeConstantChain, *_ELEMENTWISE))),
        Step("dead", _library_pass(common.RemoveUnusedNodesPass())),
        Step("shapes", _shapes),
        Step(
            r.ZeroConstantAddToIdentity.rule_name,
            _rules(one(r.ZeroConstantAddToIdentity, "Add", "Sub")),
        ),
        Step(
            r.InfiniteBoundToIdentity.rule_name,
            _rules(one(r.InfiniteBoundToIdentity, "Max", "Min")),
        ),
        Step(r.ReduceUnitAxes.rule_name, _rules(one(r.ReduceUnitAxes, *_REDUCTIONS))),
        Step(r.WholeMapAveragePoolToGlobal.rule_name, _rules(one(r.WholeMapAveragePoolToGlobal))),
        Step(r.ReduceL2ToSqrtOfSum.rule_name, _rules(one(r.ReduceL2ToSqrtOfSum))),
        Step(
            r.HighRankUnaryToRank4.rule_name,
            _rules(one(r.HighRankUnaryToRank4, *r.HIGH_RANK_REFUSED_UNARY)),
        ),
        Step(RankFoldPass.rule_name, lambda m, log: RankFoldPass(log, max_rank)(m)),
        # (no dead-code pass after: the bypassed zero constants stay initializers, as the
        # protobuf rewrite left them; quantize drops what no node reads)
        Step(RULE_IDENTITY, _library_pass(_IdentityElimination())),
        # last: the rules above see the graph as exported; the chunks are new nodes
        *([Step(ChunkedAttentionPass.rule_name, chunk)] if max_tensor_elements else []),
    ]


_ELEMENTWISE = ("Mul", "Div", "Add", "Sub")
_REDUCTIONS = ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin")


def qdq_rewrites() -> list[Step]:
    """What runs on the QDQ graph after quantization."""
    from winml_recipes.eps.qnn.rules.rules import NanGuardPass

    return [Step(NanGuardPass.rule_name, lambda m, log: NanGuardPass(log)(m))]


def rewrite(model: ir.Model, steps: list[Step], log: RewriteLog | None = None) -> RewriteLog:
    """Run `steps` on `model` in place; the log says what each rule replaced or kept."""
    log = log if log is not None else RewriteLog()
    for step in steps:
        step.run(model, log)
    return log


def fold_nan_guards(proto: onnx.ModelProto) -> list[str]:
    """Run the QDQ rewrites (NanGuardPass) on a quantized model in place; the Wheres removed.

    The model keeps the value_info onnxruntime's quantizer wrote (an onnx_ir round trip
    would add every type it knows), so a graph without guards is written byte for byte.
    """
    model = ir.from_proto(proto)
    log = rewrite(model, qdq_rewrites())
    folded = log.nodes.get("fold_nan_guard", [])
    if folded:
        written = ir.to_proto(model)
        written.graph.ClearField("value_info")
        written.graph.value_info.extend(proto.graph.value_info)
        proto.CopyFrom(written)
    return folded
