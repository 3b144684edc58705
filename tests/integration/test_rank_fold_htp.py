"""Rank-6 tensors (a multi-scale deformable attention's sampling locations, as RT-DETR and
Deformable DETR compute them) on QNN HTP, which places rank 5 at most: the `htp` prepare
stage folds the region to rank 5 by merging adjacent axes (`fold_high_rank_axes`), exactly,
and the build places every node on HTP with CPU fallback off (before: refused, naming the
rank-6 Unsqueeze)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest

from tests.integration.test_fixed_range_htp import QNN_WHEELS
from winml_recipes import api

torch = pytest.importorskip("torch")
SHAPE = (1, 10, 16)  # [batch, queries, hidden]
HEADS, LEVELS, POINTS = 2, 3, 2


class DeformableSampling(torch.nn.Module):
    """transformers' RTDetrMultiscaleDeformableAttention's sampling locations, per level."""

    def __init__(self) -> None:
        super().__init__()
        self.offsets = torch.nn.Linear(16, HEADS * LEVELS * POINTS * 2)
        self.reference = torch.nn.Linear(16, 4)
        self.out = torch.nn.Linear(HEADS * POINTS * 2 * LEVELS, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, q, _ = x.shape
        offsets = self.offsets(x).view(b, q, HEADS, LEVELS, POINTS, 2)
        ref = torch.sigmoid(self.reference(x))[:, :, None, None, None, :]  # [b, q, 1, 1, 1, 4]
        loc = ref[..., :2] + offsets / POINTS * ref[..., 2:] * 0.5
        grids = 2 * loc - 1
        levels = [grids[:, :, :, level].flatten(2) for level in range(LEVELS)]
        return self.out(torch.cat(levels, -1))


def _export(path: Path) -> Path:
    torch.manual_seed(0)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            DeformableSampling().eval(), (torch.randn(*SHAPE),), str(path), input_names=["x"],
            output_names=["y"], dynamo=False, opset_version=17,
        )  # fmt: skip
    return path


def _ranks(model: onnx.ModelProto) -> list[int]:
    """The ranks of the tensors the nodes read and write."""
    inferred = onnx.shape_inference.infer_shapes(model)
    g = inferred.graph
    used = {t for n in g.node for t in (*n.input, *n.output)}
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in [*g.value_info, *g.output]}
    ranks |= {i.name: len(i.dims) for i in g.initializer}
    return [ranks[t] for t in used if t in ranks]


def test_deformable_sampling_folds_to_rank_5_exactly(tmp_path: Path) -> None:
    from winml_recipes.eps.qnn.rules import _shapes
    from winml_recipes.eps.qnn.rules.rank_fold import RankFoldPass
    from winml_recipes.graph.log import RewriteLog

    source = onnx.load(str(_export(tmp_path / "m.onnx")))
    assert max(_ranks(source)) == 6
    model, log = ir.from_proto(source), RewriteLog()
    _shapes(model, log)
    RankFoldPass(log)(model)
    folded = ir.to_proto(model)
    assert max(_ranks(folded)) == 5
    assert log.count("fold_high_rank_axes") > 0 and not log.kept
    x = np.random.default_rng(1).normal(size=(4, *SHAPE)).astype(np.float32)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    a = ort.InferenceSession(source.SerializeToString(), so)
    b = ort.InferenceSession(folded.SerializeToString(), so)
    for sample in x:
        (ya,), (yb,) = a.run(None, {"x": sample}), b.run(None, {"x": sample})
        assert np.abs(ya - yb).max() <= 1e-6  # the same sums in the same order


@pytest.mark.skipif(not QNN_WHEELS, reason="no onnxruntime-qnn wheel here")
def test_deformable_sampling_places_on_htp(tmp_path: Path) -> None:
    def npz(name: str, seed: int, n: int) -> str:
        x = np.random.default_rng(seed).normal(size=(n, *SHAPE)).astype(np.float32)
        np.savez(tmp_path / name, x=x)
        return str(tmp_path / name)

    result = api.build_onnx(
        _export(tmp_path / "m.onnx"), device="npu", precision="w8a16",
        calibration_data=npz("calib.npz", 0, 8), eval_data=npz("eval.npz", 1, 2),
        output_root=tmp_path / "out",
    )  # fmt: skip
    steps = {s["pass"]: s for s in result.manifest["components"]["model"]["steps"]}
    rewrites = {r["rule"]: r["count"] for r in steps["prepare"]["metrics"]["rewrites"]}
    assert rewrites.get("fold_high_rank_axes", 0) > 0
    verify = steps["verify"]["metrics"]
    assert verify["verified_on"] == "qnn-htp"
    assert set(verify["placement"]["nodes"]) == {"QNNExecutionProvider"}
    htp = verify["outputs"]["y"]["sqnr_db"]
    assert htp > 25 and abs(htp - verify["cpu_simulation"]["outputs"]["y"]["sqnr_db"]) < 3


def test_a_region_with_an_op_the_fold_does_not_know_is_kept(tmp_path: Path) -> None:
    """A Softmax at rank 6: nothing is rewritten, and `kept` names the node that stops it."""
    from tests.integration.test_rank_limit_htp import _graph
    from winml_recipes.eps.qnn.rules import _shapes
    from winml_recipes.eps.qnn.rules.rank_fold import RankFoldPass
    from winml_recipes.graph.log import RewriteLog

    model, log = ir.from_proto(onnx.load(str(_graph(6, tmp_path / "six.onnx")))), RewriteLog()
    _shapes(model, log)
    assert not RankFoldPass(log)(model).modified
    assert log.kept == [
        {"rule": "fold_high_rank_axes", "node": "unsqueeze2",
         "why": "softmax: Softmax is not an op the fold knows"}
    ]  # fmt: skip


def test_rank_6_constants_read_twice_and_sliced_fold_exactly() -> None:
    """Constants of the region laid out once per value; a Slice of a rank-6 constant."""
    from onnx import TensorProto, helper, numpy_helper

    from winml_recipes.eps.qnn.rules import _shapes
    from winml_recipes.eps.qnn.rules.rank_fold import RankFoldPass
    from winml_recipes.graph.log import RewriteLog

    rng = np.random.default_rng(0)
    inits = {
        "c": rng.normal(size=(1, 10, 1, 1, 1, 4)).astype(np.float32),
        "table": rng.normal(size=(1, 10, 2, 3, 2, 4)).astype(np.float32),
        "axes": np.array([2, 3, 4], np.int64), "starts": np.array([0], np.int64),
        "ends": np.array([2], np.int64), "slice_axes": np.array([-1], np.int64),
        "level": np.array(1, np.int64),
    }  # fmt: skip
    nodes = [
        helper.make_node("Unsqueeze", ["x", "axes"], ["u6"]),  # [1, 10, 1, 1, 1, 4]
        helper.make_node("Add", ["u6", "c"], ["a"]),
        helper.make_node("Mul", ["a", "c"], ["m"]),
        helper.make_node("Slice", ["m", "starts", "ends", "slice_axes"], ["ms"]),
        helper.make_node("Slice", ["table", "starts", "ends", "slice_axes"], ["t"]),
        helper.make_node("Mul", ["t", "ms"], ["p"]),  # [1, 10, 2, 3, 2, 2]
        helper.make_node("Gather", ["p", "level"], ["y"], axis=3),  # [1, 10, 2, 2, 2]
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 10, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )  # fmt: skip
    source = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    model, log = ir.from_proto(source), RewriteLog()
    _shapes(model, log)
    RankFoldPass(log)(model)
    folded = ir.to_proto(model)
    onnx.checker.check_model(folded, full_check=True)
    assert max(_ranks(folded)) <= 5 and not log.kept
    x = rng.normal(size=(1, 10, 4)).astype(np.float32)
    a = ort.InferenceSession(source.SerializeToString()).run(None, {"x": x})[0]
    b = ort.InferenceSession(folded.SerializeToString()).run(None, {"x": x})[0]
    assert a.shape == b.shape == (1, 10, 2, 2, 2) and np.array_equal(a, b)
