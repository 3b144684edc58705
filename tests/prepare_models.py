"""Graphs the prepare pass rewrites, built as users' exporters leave them.

- `detector`: a Conv head whose anchor grid is computed from the feature map's shape at
  run time (Shape -> Gather -> Range -> Expand / Concat / ConstantOfShape), with dynamic
  batch and image sides, as a single-stage detector exported with dynamic axes is;
- `gathernd`: GatherND with constant indices (a pooling that picks rows), batch_dims 0 and 1;
- `constant_if`: an If whose condition is computed from the input's static shape;
- `recurrent`: torch nn.LSTM / nn.GRU exported with the TorchScript exporter (ONNX LSTM/GRU).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _save(path: Path, nodes, inputs, outputs, inits=(), opset: int = 17) -> Path:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _i64(name: str, values) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, dtype=np.int64), name)


def _f32(name: str, values) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, dtype=np.float32), name)


STRIDE = 8


def detector(path: Path, seed: int = 0) -> Path:
    """images [batch, 3, height, width] -> boxes [batch, cells, 2], scores [batch, cells, 6].

    boxes = sigmoid(offsets) * 16 + (grid + 0.5) * stride, with the grid of cell corners
    built from Shape(feature map) at run time: Range over its height and width.
    """
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((8, 3, STRIDE, STRIDE)).astype(np.float32) * 0.1
    n = helper.make_node
    nodes = [
        n("Conv", ["images", "conv_w", "conv_b"], ["feat"], name="head/conv", strides=[STRIDE] * 2,
          kernel_shape=[STRIDE] * 2),
        # view(batch, 8, h, w) with the sizes read from the tensor, as exporters write it
        n("Shape", ["feat"], ["fshape0"], name="head/shape"),
        n("Gather", ["fshape0", "zero1"], ["b1"], name="head/gather_b", axis=0),
        n("Slice", ["fshape0", "s2", "s4"], ["hw0"], name="head/hw"),
        n("Concat", ["b1", "eight1", "hw0"], ["view"], name="head/view_shape", axis=0),
        n("Reshape", ["feat", "view"], ["feat4"], name="head/view"),
        n("Shape", ["feat4"], ["fshape"], name="grid/shape"),
        n("Gather", ["fshape", "two"], ["h"], name="grid/gather_h", axis=0),
        n("Gather", ["fshape", "three"], ["w"], name="grid/gather_w", axis=0),
        n("Cast", ["h"], ["hf"], name="grid/cast_h", to=TensorProto.FLOAT),
        n("Cast", ["w"], ["wf"], name="grid/cast_w", to=TensorProto.FLOAT),
        # torch.arange(float(ny)): a float Range
        n("Range", ["zero_f", "hf", "one_f"], ["ys"], name="grid/range_y"),
        n("Range", ["zero_f", "wf", "one_f"], ["xs"], name="grid/range_x"),
        n("Unsqueeze", ["ys", "ax1"], ["ys2"], name="grid/unsq_y"),
        n("Unsqueeze", ["xs", "ax0"], ["xs2"], name="grid/unsq_x"),
        n("Unsqueeze", ["h", "ax0"], ["h1"], name="grid/h1"),
        n("Unsqueeze", ["w", "ax0"], ["w1"], name="grid/w1"),
        n("Concat", ["h1", "w1"], ["hw"], name="grid/hw", axis=0),
        n("Expand", ["ys2", "hw"], ["gy"], name="grid/expand_y"),
        n("Expand", ["xs2", "hw"], ["gx"], name="grid/expand_x"),
        n("Unsqueeze", ["gx", "axm1"], ["gx3"], name="grid/gx3"),
        n("Unsqueeze", ["gy", "axm1"], ["gy3"], name="grid/gy3"),
        n("Concat", ["gx3", "gy3"], ["grid_hw2"], name="grid/xy", axis=-1),
        n("Mul", ["h1", "w1"], ["cells"], name="grid/cells"),
        n("Concat", ["one1", "cells", "two1"], ["gshape"], name="grid/gshape", axis=0),
        n("Reshape", ["grid_hw2", "gshape"], ["grid"], name="grid/reshape"),
        n("ConstantOfShape", ["gshape"], ["halves"], name="grid/halves",
          value=numpy_helper.from_array(np.array([0.5], np.float32))),
        n("Add", ["grid", "halves"], ["centers"], name="grid/centers"),
        n("Mul", ["centers", "stride"], ["anchors"], name="grid/anchors"),
        n("Reshape", ["feat4", "flat_shape"], ["flat"], name="head/flatten"),
        n("Transpose", ["flat"], ["cellwise"], name="head/transpose", perm=[0, 2, 1]),
        n("Slice", ["cellwise", "s0", "s2", "axm1"], ["offsets"], name="head/offsets"),
        n("Slice", ["cellwise", "s2", "s8", "axm1"], ["logits"], name="head/logits"),
        n("Sigmoid", ["offsets"], ["off_sig"], name="head/off_sigmoid"),
        n("Mul", ["off_sig", "sixteen"], ["off_px"], name="head/off_scale"),
        n("Add", ["off_px", "anchors"], ["boxes"], name="head/boxes"),
        n("Sigmoid", ["logits"], ["scores"], name="head/scores"),
    ]  # fmt: skip
    inits = [
        _f32("conv_w", w), _f32("conv_b", rng.standard_normal(8) * 0.1),
        _i64("two", 2), _i64("three", 3), _i64("zero", 0), _i64("one", 1),
        _i64("ax0", [0]), _i64("ax1", [1]), _i64("axm1", [-1]), _i64("one1", [1]),
        _i64("two1", [2]), _f32("stride", float(STRIDE)), _i64("flat_shape", [0, 8, -1]),
        _i64("s0", [0]), _i64("s2", [2]), _i64("s8", [8]), _f32("sixteen", 16.0),
        _i64("zero1", [0]), _i64("s4", [4]), _i64("eight1", [8]), _f32("zero_f", 0.0),
        _f32("one_f", 1.0),
    ]  # fmt: skip
    f = TensorProto.FLOAT
    return _save(
        path,
        nodes,
        [helper.make_tensor_value_info("images", f, ["batch", 3, "height", "width"])],
        [
            helper.make_tensor_value_info("boxes", f, ["batch", "cells", 2]),
            helper.make_tensor_value_info("scores", f, ["batch", "cells", 6]),
        ],
        inits,
    )


def detector_reference(images: np.ndarray, path: Path) -> np.ndarray:
    """The anchors the detector adds, computed in numpy (a check independent of onnx)."""
    h, w = images.shape[2] // STRIDE, images.shape[3] // STRIDE
    gx, gy = np.meshgrid(np.arange(w), np.arange(h))
    return ((np.stack([gx, gy], -1).reshape(1, h * w, 2) + 0.5) * STRIDE).astype(np.float32)


def gathernd(path: Path, batch_dims: int = 0, contiguous: bool = False) -> Path:
    """x [2, 5, 4] -> Relu -> GatherND(constant indices) -> Mul 2 (y)."""
    if batch_dims == 0:
        idx = [[0, 1], [1, 4], [0, -1]] if not contiguous else [[1, 1], [1, 2], [1, 3]]
        out_shape = [3, 4]
    else:  # per batch row, pick positions
        idx = [[[3], [0]], [[1], [-1]]]
        out_shape = [2, 2, 4]
    n = helper.make_node
    return _save(
        path,
        [
            n("Relu", ["x"], ["r"], name="relu"),
            n("GatherND", ["r", "idx"], ["g"], name="pick", batch_dims=batch_dims),
            n("Mul", ["g", "two"], ["y"], name="scale"),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
        [_i64("idx", idx), _f32("two", 2.0)],
    )


def constant_if(path: Path) -> Path:
    """y = x * 2 when x has more than 3 columns, else x - 1 (x is [2, 5]: the then branch)."""
    n = helper.make_node
    f = TensorProto.FLOAT
    then_g = helper.make_graph(
        [n("Mul", ["x", "two"], ["t_out"], name="then_mul")], "then", [],
        [helper.make_tensor_value_info("t_out", f, None)],
    )  # fmt: skip
    else_g = helper.make_graph(
        [n("Sub", ["x", "one_f"], ["e_out"], name="else_sub")], "else", [],
        [helper.make_tensor_value_info("e_out", f, None)],
    )  # fmt: skip
    return _save(
        path,
        [
            n("Shape", ["x"], ["s"], name="shape"),
            n("Gather", ["s", "one"], ["cols"], name="cols", axis=0),
            n("Greater", ["cols", "three"], ["wide"], name="wide"),
            n("If", ["wide"], ["b"], name="branch", then_branch=then_g, else_branch=else_g),
            n("Relu", ["b"], ["y"], name="relu"),
        ],
        [helper.make_tensor_value_info("x", f, ["rows", "columns"])],
        [helper.make_tensor_value_info("y", f, ["rows", "columns"])],
        [_i64("one", 1), _i64("three", 3), _f32("two", 2.0), _f32("one_f", 1.0)],
    )


def recurrent(path: Path, kind: str, bidirectional: bool, *, seq: int = 12, opset: int = 13,
              layers: int = 1, batch_first: bool = True, states: bool = False) -> Path:  # fmt: skip
    """torch nn.LSTM / nn.GRU (+ a Linear) exported with the TorchScript exporter.

    Input `x` [1, seq, 10] (batch_first) or [seq, 1, 10]; with `states`, the initial hidden
    (and cell) state are inputs too. Outputs `y` (Linear over every step) and `h` (last H).
    """
    import torch

    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            rnn = getattr(torch.nn, kind)
            self.rnn = rnn(10, 16, num_layers=layers, batch_first=batch_first,
                           bidirectional=bidirectional)  # fmt: skip
            self.fc = torch.nn.Linear(32 if bidirectional else 16, 4)

        def forward(self, x, *state):
            if kind == "LSTM" and state:
                y, (h, _) = self.rnn(x, (state[0], state[1]))
            elif state:
                y, h = self.rnn(x, state[0])
            else:
                y, rest = self.rnn(x)
                h = rest[0] if kind == "LSTM" else rest
            return self.fc(y), h

    net = Net().eval()
    dirs = 2 if bidirectional else 1
    x = torch.randn((1, seq, 10) if batch_first else (seq, 1, 10))
    args: tuple = (x,)
    names = ["x"]
    if states:
        args += (torch.randn(dirs * layers, 1, 16),)
        names.append("h0")
        if kind == "LSTM":
            args += (torch.randn(dirs * layers, 1, 16),)
            names.append("c0")
    with torch.no_grad():
        torch.onnx.export(net, args, str(path), dynamo=False, opset_version=opset,
                          input_names=names, output_names=["y", "h"])  # fmt: skip
    return path
