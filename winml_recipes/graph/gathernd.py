"""GatherND with constant indices as Gather or Slice (+ Reshape): HTP refuses GatherND.

With indices `I` of shape [B..., M..., k] (b batch dims) into data of static shape
[B..., D1..Dk, R...], every index tuple names one row of data flattened to
[prod(B... D1..Dk), R...]. The row numbers are computed here (numpy's ravel_multi_index,
negative indices wrapped, out-of-range ones left alone), so one Gather on axis 0 with a
constant [B..., M...] index tensor gives exactly GatherND's [B..., M..., R...] output. A
run of consecutive rows is a Slice instead (and a Reshape to that shape).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from winml_recipes.graph.build import Emitter, constant, static_shape
from winml_recipes.graph.log import RewriteLog

RULE = "gathernd_to_gather"


def rows(data_shape: tuple[int, ...], indices: np.ndarray, batch_dims: int) -> np.ndarray | None:
    """Row numbers into data flattened over its first `batch_dims + k` axes (None: invalid)."""
    k = indices.shape[-1]
    lead = data_shape[: batch_dims + k]
    if k == 0 or len(lead) != batch_dims + k or indices.ndim < batch_dims + 1:
        return None
    idx = indices.astype(np.int64)
    dims = np.asarray(data_shape[batch_dims : batch_dims + k], dtype=np.int64)
    idx = np.where(idx < 0, idx + dims, idx)
    if (idx < 0).any() or (idx >= dims).any():
        return None
    grid_shape = idx.shape[:-1]
    coords = [
        np.broadcast_to(
            np.arange(grid_shape[a]).reshape([-1 if i == a else 1 for i in range(len(grid_shape))]),
            grid_shape,
        )
        for a in range(batch_dims)
    ]
    coords += [idx[..., j] for j in range(k)]
    return np.ravel_multi_index(tuple(coords), lead).astype(np.int64)


def rewrite_gathernd(model: ir.Model, log: RewriteLog) -> int:
    """Replace every GatherND whose indices are constant and data shape static."""
    graph = model.graph
    done = 0
    for node in list(graph):
        if node.op_type != "GatherND" or node.domain != "":
            continue
        data, index_value = node.inputs[0], node.inputs[1]
        indices = constant(index_value)
        shape = static_shape(data)
        if indices is None or shape is None:
            continue
        batch_dims = node.attributes.get_int("batch_dims", 0)
        flat_rows = rows(shape, indices, batch_dims)
        if flat_rows is None:
            continue
        k = indices.shape[-1]
        rest = shape[batch_dims + k :]
        lead = int(np.prod(shape[: batch_dims + k], dtype=np.int64))
        out_shape = (*flat_rows.shape, *rest)
        emit = Emitter(graph, node)
        flat = data
        if batch_dims + k != 1:
            flat_shape = emit.const(np.asarray([lead, *rest], np.int64), "shape")
            flat = emit.op("Reshape", [data, flat_shape])
        line = flat_rows.reshape(-1)
        if line.size and (line.size == 1 or (np.diff(line) == 1).all()):
            start, end = int(line[0]), int(line[-1]) + 1
            sliced = emit.op(
                "Slice",
                [
                    flat,
                    emit.const(np.asarray([start], np.int64), "starts"),
                    emit.const(np.asarray([end], np.int64), "ends"),
                    emit.const(np.asarray([0], np.int64), "axes"),
                ],
            )
            out = emit.op("Reshape", [sliced, emit.const(np.asarray(out_shape, np.int64), "shape")])
        else:
            out = emit.op("Gather", [flat, emit.const(flat_rows, "rows")], axis=0)
        out.shape = ir.Shape(out_shape)
        out.type = node.outputs[0].type
        emit.replace(node.outputs, [out])
        log.add(RULE, node.name)
        done += 1
    return done
