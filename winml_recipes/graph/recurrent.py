"""LSTM and GRU unrolled over their static sequence length (exact in float).

HTP (the npu's EP) cannot finalize graphs holding LSTM (a MEM_ALLOC error on a 1 MB model);
written as MatMul / Add / Sigmoid / Tanh / Mul per time step, the same arithmetic reaches
the NPU. The input projection of all time steps is one MatMul ([seq, batch, in] x
[in, gates*hidden], biases added once); each step adds its slice to the recurrent MatMul.
Follows the ONNX operator definitions: gate order i, o, f, c (LSTM) and z, r, h (GRU), the
default activations (Sigmoid, Tanh, Tanh / Sigmoid, Tanh), peepholes, both
`linear_before_reset` forms, every direction, `layout` 0 and 1, initial states from inputs
or zeros (a zero state's terms are left out: adding 0 is exact). Outputs Y
[seq, dirs, batch, hidden] (layout 1: [batch, seq, dirs, hidden]), Y_h and Y_c
[dirs, batch, hidden] (layout 1: [batch, dirs, hidden]).

Left as they are (recorded with the reason): non-constant weights, `clip`, `input_forget`,
activations other than Sigmoid/Tanh/Relu, variable `sequence_lens`, dynamic shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from winml_recipes.graph.build import Emitter, constant, static_shape, used
from winml_recipes.graph.log import RewriteLog

RULE_LSTM = "unroll_lstm"
RULE_GRU = "unroll_gru"
# The NPU's EP prepares an unrolled graph in a time that grows about with the square of its
# steps (each step is about 55 nodes once quantized; the hidden size hardly matters: 2.7 /
# 4.0 CPU s at 64 steps for hidden 64 / 256). Measured on the emulated EP with a one-layer
# GRU, hidden 32, one session with fallback off (`python experiments/recurrent_budget.py`,
# docs/recurrent.md): (steps x directions, CPU seconds of that one graph preparation).
MEASURED_PREPARATION = ((16, 0.6), (64, 3.1), (128, 9.0), (256, 36.1))
# A build prepares the graph several times (quantize's divergence check, each of auto's
# candidates, verify, compile): one preparation may cost this much CPU time.
PREPARATION_CPU_SECONDS = 40.0
# Steps x directions over every recurrent node of a model that may be unrolled for the NPU:
# the longest measured that fits. Over it the build stops at `prepare`, naming the node and
# the next step (shorter windows), before any calibration: resemblyzer's 480 steps had not
# finished verifying after 30 minutes; kept as LSTM/GRU nodes, the EP cannot finalize them
# at all (MEM_ALLOC).
MAX_MODEL_STEPS = max(s for s, cpu in MEASURED_PREPARATION if cpu <= PREPARATION_CPU_SECONDS)
BUDGET_NOTE = (
    f"(one NPU graph preparation of {MAX_MODEL_STEPS} unrolled steps took "
    f"{dict(MEASURED_PREPARATION)[MAX_MODEL_STEPS]:g} CPU s, growing with the square of the steps)"
)
_ACTIVATIONS = {"sigmoid": "Sigmoid", "tanh": "Tanh", "relu": "Relu"}
_DEFAULTS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh")}


@dataclass
class _Cell:
    """One recurrent node's static facts (weights per direction, sizes, activations)."""

    kind: str  # "LSTM" | "GRU"
    seq: int
    batch: int
    hidden: int
    dirs: list[str]  # "forward" / "reverse" per direction
    w: np.ndarray  # [dirs, gates*hidden, in]
    r: np.ndarray  # [dirs, gates*hidden, hidden]
    b: np.ndarray  # [dirs, 2*gates*hidden]
    p: np.ndarray | None  # LSTM peepholes [dirs, 3*hidden]
    acts: list[tuple[str, ...]]  # per direction
    layout: int
    linear_before_reset: int


def _read(node: ir.Node) -> tuple[_Cell | None, str]:
    """The cell's facts, or None and why the node is left as it is."""
    kind = node.op_type
    gates = 4 if kind == "LSTM" else 3
    attrs = node.attributes
    inputs = list(node.inputs) + [None] * (8 - len(node.inputs))
    if attrs.get_float("clip", None) is not None:
        return None, "clip is set"
    if kind == "LSTM" and attrs.get_int("input_forget", 0):
        return None, "input_forget is set"
    w, r = constant(inputs[1]), constant(inputs[2])
    if w is None or r is None:
        return None, "W or R is not a constant"
    b = constant(inputs[3]) if inputs[3] is not None else None
    if inputs[3] is not None and b is None:
        return None, "B is not a constant"
    p = constant(inputs[7]) if kind == "LSTM" and inputs[7] is not None else None
    if kind == "LSTM" and inputs[7] is not None and p is None:
        return None, "P is not a constant"
    layout = attrs.get_int("layout", 0)
    x_shape = static_shape(inputs[0])
    if x_shape is None or len(x_shape) != 3:
        return None, "the input X has no static shape"
    seq, batch = (x_shape[0], x_shape[1]) if layout == 0 else (x_shape[1], x_shape[0])
    direction = attrs.get_string("direction", "forward")
    dirs = ["forward", "reverse"] if direction == "bidirectional" else [direction]
    if inputs[4] is not None:
        lens = constant(inputs[4])
        if lens is None or not (lens == seq).all():
            return None, "sequence_lens is not the full sequence length"
    hidden = int(r.shape[-1])
    per_dir = len(_DEFAULTS[kind])
    names = list(attrs.get_strings("activations", None) or _DEFAULTS[kind])
    if len(names) == per_dir and len(dirs) == 2:
        names = names * 2
    if len(names) != per_dir * len(dirs):
        return None, f"{len(names)} activations for {len(dirs)} direction(s)"
    mapped = [_ACTIVATIONS.get(n.lower()) for n in names]
    if None in mapped:
        return None, f"activation(s) {', '.join(names)}: only Sigmoid, Tanh, Relu are unrolled"
    acts = [tuple(mapped[d * per_dir : (d + 1) * per_dir]) for d in range(len(dirs))]
    if b is None:
        b = np.zeros((len(dirs), 2 * gates * hidden), dtype=w.dtype)
    cell = _Cell(
        kind, seq, batch, hidden, dirs, w, r, b, p, acts, layout,
        attrs.get_int("linear_before_reset", 0),
    )  # fmt: skip
    return cell, ""


def _slice(emit: Emitter, x: ir.Value, start: int, end: int, axis: int) -> ir.Value:
    return emit.op(
        "Slice",
        [
            x,
            emit.const(np.asarray([start], np.int64), "starts"),
            emit.const(np.asarray([end], np.int64), "ends"),
            emit.const(np.asarray([axis], np.int64), "axes"),
        ],
    )


def _concat(emit: Emitter, parts: list[ir.Value], axis: int) -> ir.Value:
    return parts[0] if len(parts) == 1 else emit.op("Concat", parts, axis=axis)


def _state(emit: Emitter, value: ir.Value | None, d: int, layout: int) -> ir.Value | None:
    """Direction d's initial state as [1, batch, hidden] (None: zeros)."""
    if value is None or not value.name:
        return None
    known = constant(value)
    if known is not None and not known.any():
        return None  # a zero state (exporters write one when none is given)
    if layout == 1:  # [batch, dirs, hidden] -> [dirs, batch, hidden]
        value = emit.op("Transpose", [value], perm=[1, 0, 2])
    return _slice(emit, value, d, d + 1, 0)


def _lstm_direction(
    emit: Emitter, cell: _Cell, d: int, xs: ir.Value, h0: ir.Value | None, c0: ir.Value | None
) -> tuple[list[ir.Value], ir.Value, ir.Value]:
    """H of every step (in time order), the last H and the last C of direction d."""
    hid = cell.hidden
    f_act, g_act, h_act = cell.acts[d]
    w_t = emit.const(np.ascontiguousarray(cell.w[d].T), "W_T")
    r_t = emit.const(np.ascontiguousarray(cell.r[d].T), "R_T")
    bias = cell.b[d][: 4 * hid] + cell.b[d][4 * hid :]
    xw = emit.op("Add", [emit.op("MatMul", [xs, w_t]), emit.const(bias, "B")])
    peep = None
    if cell.p is not None:
        peep = [emit.const(cell.p[d][k * hid : (k + 1) * hid], name) for k, name in
                enumerate(("P_i", "P_o", "P_f"))]  # fmt: skip
    h, c = h0, c0
    steps = range(cell.seq) if cell.dirs[d] == "forward" else range(cell.seq - 1, -1, -1)
    out: dict[int, ir.Value] = {}
    for t in steps:
        g = _slice(emit, xw, t, t + 1, 0)
        if h is not None:
            g = emit.op("Add", [g, emit.op("MatMul", [h, r_t])])
        i_pre, o_pre, f_pre, c_pre = (_slice(emit, g, k * hid, (k + 1) * hid, 2) for k in range(4))
        if peep is not None and c is not None:
            i_pre = emit.op("Add", [i_pre, emit.op("Mul", [peep[0], c])])
            f_pre = emit.op("Add", [f_pre, emit.op("Mul", [peep[2], c])])
        i_gate = emit.op(f_act, [i_pre])
        f_gate = emit.op(f_act, [f_pre])
        candidate = emit.op(g_act, [c_pre])
        new_c = emit.op("Mul", [i_gate, candidate])
        if c is not None:
            new_c = emit.op("Add", [emit.op("Mul", [f_gate, c]), new_c])
        if peep is not None:
            o_pre = emit.op("Add", [o_pre, emit.op("Mul", [peep[1], new_c])])
        o_gate = emit.op(f_act, [o_pre])
        h = emit.op("Mul", [o_gate, emit.op(h_act, [new_c])])
        c = new_c
        out[t] = h
    assert h is not None and c is not None
    return [out[t] for t in range(cell.seq)], h, c


def _gru_direction(
    emit: Emitter, cell: _Cell, d: int, xs: ir.Value, h0: ir.Value | None
) -> tuple[list[ir.Value], ir.Value]:
    """H of every step (in time order) and the last H of direction d."""
    hid = cell.hidden
    f_act, g_act = cell.acts[d]
    wb, rb = cell.b[d][: 3 * hid], cell.b[d][3 * hid :]
    w_t = emit.const(np.ascontiguousarray(cell.w[d].T), "W_T")
    r_zr = emit.const(np.ascontiguousarray(cell.r[d][: 2 * hid].T), "R_zr_T")
    r_h = emit.const(np.ascontiguousarray(cell.r[d][2 * hid :].T), "R_h_T")
    # Input-side bias for z and r holds both biases; h's recurrent bias Rbh goes inside the
    # reset product with linear_before_reset, outside it (with Wbh) without.
    bias = wb.copy()
    bias[: 2 * hid] += rb[: 2 * hid]
    if not cell.linear_before_reset:
        bias[2 * hid :] += rb[2 * hid :]
    xw = emit.op("Add", [emit.op("MatMul", [xs, w_t]), emit.const(bias, "B")])
    rbh = emit.const(rb[2 * hid :], "Rb_h") if cell.linear_before_reset else None
    one = emit.const(np.ones((), dtype=cell.w.dtype), "one")
    h = h0
    steps = range(cell.seq) if cell.dirs[d] == "forward" else range(cell.seq - 1, -1, -1)
    out: dict[int, ir.Value] = {}
    for t in steps:
        x_t = _slice(emit, xw, t, t + 1, 0)
        zr = _slice(emit, x_t, 0, 2 * hid, 2)
        if h is not None:
            zr = emit.op("Add", [zr, emit.op("MatMul", [h, r_zr])])
        z = emit.op(f_act, [_slice(emit, zr, 0, hid, 2)])
        r = emit.op(f_act, [_slice(emit, zr, hid, 2 * hid, 2)])
        xh = _slice(emit, x_t, 2 * hid, 3 * hid, 2)
        if cell.linear_before_reset:
            assert rbh is not None
            rec = rbh if h is None else emit.op("Add", [emit.op("MatMul", [h, r_h]), rbh])
            pre = emit.op("Add", [xh, emit.op("Mul", [r, rec])])
        elif h is None:
            pre = xh  # (r * 0) Rh adds nothing
        else:
            pre = emit.op("Add", [xh, emit.op("MatMul", [emit.op("Mul", [r, h]), r_h])])
        cand = emit.op(g_act, [pre])
        new_h = emit.op("Mul", [emit.op("Sub", [one, z]), cand])
        if h is not None:
            new_h = emit.op("Add", [new_h, emit.op("Mul", [z, h])])
        h = new_h
        out[t] = h
    assert h is not None
    return [out[t] for t in range(cell.seq)], h


def _unroll(graph: ir.Graph, node: ir.Node, cell: _Cell) -> None:
    emit = Emitter(graph, node)
    inputs = list(node.inputs) + [None] * (8 - len(node.inputs))
    xs = inputs[0]
    assert xs is not None
    if cell.layout == 1:
        xs = emit.op("Transpose", [xs], perm=[1, 0, 2])
    ys, last_h, last_c = [], [], []
    for d in range(len(cell.dirs)):
        h0 = _state(emit, inputs[5], d, cell.layout)
        if cell.kind == "LSTM":
            c0 = _state(emit, inputs[6], d, cell.layout)
            hs, h, c = _lstm_direction(emit, cell, d, xs, h0, c0)
            last_c.append(c)
        else:
            hs, h = _gru_direction(emit, cell, d, xs, h0)
        last_h.append(h)
        y = _concat(emit, hs, 0)  # [seq, batch, hidden]
        shape = np.asarray([cell.seq, 1, cell.batch, cell.hidden], np.int64)
        ys.append(emit.op("Reshape", [y, emit.const(shape, "Y_shape")]))
    outs = list(node.outputs)
    new: list[ir.Value | None] = [None] * len(outs)
    if used(outs[0]):
        y = _concat(emit, ys, 1)  # [seq, dirs, batch, hidden]
        new[0] = emit.op("Transpose", [y], perm=[2, 0, 1, 3]) if cell.layout == 1 else y
    for k, states in ((1, last_h), (2, last_c)):
        if k < len(outs) and used(outs[k]):
            s = _concat(emit, states, 0)  # [dirs, batch, hidden]
            new[k] = emit.op("Transpose", [s], perm=[1, 0, 2]) if cell.layout == 1 else s
    emit.replace(outs, new)


def _steps(node: ir.Node) -> int:
    """Steps x directions of a recurrent node with a static input (checked by _read)."""
    x_shape = static_shape(node.inputs[0]) or (1, 1, 1)
    layout = node.attributes.get_int("layout", 0)
    seq = x_shape[0] if layout == 0 else x_shape[1]
    return seq * (2 if node.attributes.get_string("direction", "forward") == "bidirectional" else 1)


class UnrollBudgetError(ValueError):
    """The model's recurrent nodes unroll to more steps than the NPU's budget (one line)."""


def over_budget(nodes: list[ir.Node], total: int) -> str:
    """The one-line refusal: the longest node, the model's total, the budget, the next step
    (windows short enough that every node's steps fit the budget together)."""
    node = max(nodes, key=_steps)
    dirs = 2 if node.attributes.get_string("direction", "forward") == "bidirectional" else 1
    seq = _steps(node) // dirs
    window = max(1, seq * MAX_MODEL_STEPS // total)
    return (
        f"recurrent node {node.name or '<unnamed>'!r} ({node.op_type}, {seq} steps x {dirs} "
        f"direction(s)): the model's {len(nodes)} recurrent node(s) unroll to {total} steps x "
        f"directions, over the NPU's budget of {MAX_MODEL_STEPS} {BUDGET_NOTE}; next step: "
        f"export the model over windows of at most {window} steps (the state carried between "
        "calls) or build it for --device cpu"
    )


def unroll_recurrent(model: ir.Model, log: RewriteLog) -> dict[str, int]:
    """Unroll every LSTM and GRU of the main graph that can be; counts per op type.
    Raises UnrollBudgetError when they would unroll to more than MAX_MODEL_STEPS in all."""
    graph = model.graph
    counts = {"LSTM": 0, "GRU": 0}
    cells = []
    for node in list(graph):
        if node.op_type not in counts or node.domain != "":
            continue
        rule = RULE_LSTM if node.op_type == "LSTM" else RULE_GRU
        cell, why = _read(node)
        if cell is None:
            log.keep(rule, node.name, why)
            continue
        cells.append((node, rule, cell))
    total = sum(_steps(node) for node, _, _ in cells)
    if total > MAX_MODEL_STEPS:
        raise UnrollBudgetError(over_budget([node for node, _, _ in cells], total))
    for node, rule, cell in cells:
        _unroll(graph, node, cell)
        log.add(rule, node.name)
        counts[node.op_type] += 1
    return counts
