"""A graph with tensors above QNN HTP's rank (RT-DETR's deformable attention works at rank
6): the refusal says so, naming a node, its tensor and the shape, not only "refused N
nodes". The same graph at rank 5 places (the limit is measured, not assumed). The rank-6
graph ends its chain in a Softmax, which `fold_high_rank_axes` does not fold (a foldable
chain is computed at rank 5 instead: tests/integration/test_rank_fold_htp.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import cli
from tests.integration.test_tiny_ranges_htp import QNN_WHEELS

pytestmark = pytest.mark.skipif(not QNN_WHEELS, reason="no onnxruntime-qnn wheel here")


def _graph(rank: int, path: Path) -> Path:
    """Sigmoid on [1, 10, 4], unsqueezed up to `rank`, plus a constant, flattened back
    (through a Softmax above rank 5: an op the rank fold leaves as it is)."""
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"], name="sig")]
    shape, current, inits = [1, 10, 4], "s", []
    while len(shape) < rank:
        i = len(inits)
        inits.append(numpy_helper.from_array(np.array([2], np.int64), f"axis{i}"))
        nodes.append(helper.make_node("Unsqueeze", [current, f"axis{i}"], [f"u{i}"],
                                      name=f"unsqueeze{i}"))  # fmt: skip
        shape.insert(2, 1)
        current = f"u{i}"
    nodes.append(helper.make_node("Add", [current, "b"], ["a"], name="add"))
    if rank > 5:
        nodes.append(helper.make_node("Softmax", ["a"], ["sm"], name="softmax", axis=1))
    nodes.append(helper.make_node("Reshape", ["sm" if rank > 5 else "a", "flat"], ["y"],
                                  name="flatten"))  # fmt: skip
    inits += [
        numpy_helper.from_array(np.full(shape, 0.5, np.float32), "b"),
        numpy_helper.from_array(np.array([1, 40], np.int64), "flat"),
    ]
    graph = helper.make_graph(
        nodes, "rank", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 10, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 40])], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_rank_6_is_named_in_the_refusal_and_rank_5_places(tmp_path: Path) -> None:
    five = cli("build", "--onnx", _graph(5, tmp_path / "five.onnx"), "--device", "npu",
               "--precision", "w8a16", "-o", tmp_path / "out5")  # fmt: skip
    assert five.exit_code == 0, five.stderr[-1500:]
    six = cli("build", "--onnx", _graph(6, tmp_path / "six.onnx"), "--device", "npu",
              "--precision", "w8a16", "-o", tmp_path / "out6")  # fmt: skip
    assert six.exit_code == 2, six.stderr[-1500:]
    (line,) = [x for x in six.stderr.splitlines() if x.startswith("error:")]
    assert "refused" in line and "rank above 5, the highest QNN HTP takes" in line, line
    assert "[1, 10, 1, 1, 1, 4]" in line, line  # the shape of a rank-6 tensor it names
