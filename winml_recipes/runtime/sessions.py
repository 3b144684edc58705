"""Open onnxruntime sessions on an execution provider, report placement, run feeds.

Nothing else in the project creates an `InferenceSession`. CPU sessions are deterministic
(fixed threads, sequential). Sessions on a plugin EP select its devices; with
`fallback=False` every node must be placed on that EP, and a graph it cannot take fails
with the first nodes it refused, their op types and the EP's own reason when it logs one.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from winml_recipes.runtime.native import native_output_captured
from winml_recipes.runtime.providers import (
    CPU,
    ExecutionProvider,
    availability,
    ep_devices,
    get_provider,
)
from winml_recipes.sdk.errors import ExecutionProviderError, ModelFileError

INTRA_OP_THREADS = 2
_DISABLE_FALLBACK = "session.disable_cpu_ep_fallback"
_EXTERNAL_DATA_FOLDER = "session.model_external_initializers_file_folder_path"
_RECORD_PLACEMENT = "session.record_ep_graph_assignment_info"
_FALLBACK_REFUSED = "fallback to CPU EP has been explicitly disabled"
MAX_NODES_SHOWN = 5


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def session_options() -> ort.SessionOptions:
    """BASIC optimizations, fixed thread counts, sequential, deterministic, quiet."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.intra_op_num_threads = INTRA_OP_THREADS
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.use_deterministic_compute = True
    so.log_severity_level = 3
    # No arena, no memory pattern: from its second run on, a session with both holds the
    # first run's arena chunks and a pattern block beside them. Full-size SAM 3 encoder,
    # w8a16 QDQ on the CPU EP, two runs: 8.9 GB peak with both, 5.8 GB without the pattern,
    # 5.3 GB without the arena (4.9 GB after one run); the same speed.
    so.enable_mem_pattern = False
    so.enable_cpu_mem_arena = False
    return so


@dataclass(frozen=True)
class Placement:
    """Where the nodes of a session run: nodes and partitions per EP."""

    nodes: dict[str, int]
    partitions: dict[str, int]
    fallback_nodes: tuple[tuple[str, str], ...]  # (name, op_type) placed on another EP

    def to_manifest(self) -> dict[str, Any]:
        out: dict[str, Any] = {"nodes": self.nodes, "partitions": self.partitions}
        if self.fallback_nodes:
            out["fallback_nodes"] = [
                {"name": n, "op_type": t} for n, t in self.fallback_nodes[:MAX_NODES_SHOWN]
            ]
        return out


def _placement(session: ort.InferenceSession, ep: ExecutionProvider) -> Placement:
    nodes: dict[str, int] = {}
    partitions: dict[str, int] = {}
    fallback: list[tuple[str, str]] = []
    for sub in session.get_provider_graph_assignment_info():
        sub_nodes = sub.get_nodes()
        nodes[sub.ep_name] = nodes.get(sub.ep_name, 0) + len(sub_nodes)
        partitions[sub.ep_name] = partitions.get(sub.ep_name, 0) + 1
        if sub.ep_name != ep.provider:
            fallback += [(n.name, n.op_type) for n in sub_nodes]
    return Placement(nodes, partitions, tuple(fallback))


class RuntimeSession:
    """An onnxruntime session on one EP, with its placement when it was recorded."""

    def __init__(
        self,
        session: ort.InferenceSession,
        ep: ExecutionProvider,
        where: str,
        placement: Placement | None = None,
    ) -> None:
        self.session = session
        self.ep = ep
        self.where = where
        self.placement = placement
        self.output_names = [o.name for o in session.get_outputs()]

    def run(self, feed: Mapping[str, np.ndarray], index: int = 0) -> dict[str, np.ndarray]:
        try:
            values = self.session.run(self.output_names, dict(feed))
        except Exception as exc:
            raise ModelFileError(
                f"onnxruntime ({self.ep.key}) failed on input set {index}: {_first_line(exc)}; "
                "check the input names, dtypes and shapes",
                where=self.where,
            ) from None
        return dict(zip(self.output_names, values, strict=True))


def open_session(
    path: Path | str,
    ep_key: str = CPU,
    *,
    fallback: bool = True,
    record_placement: bool = False,
    configure: Callable[[ort.SessionOptions], None] | None = None,
    provider_options: Mapping[str, str] | None = None,
    path_independent: bool = False,
    device: str | None = None,
) -> RuntimeSession:
    """A session for `path` on the EP `ep_key`, or a one-line error naming the file.

    `configure` may add session config entries (e.g. EPContext generation). Raises
    ExecutionProviderError when the EP cannot load here or (fallback=False) refuses nodes.
    `path_independent`: load the model from its bytes, so what the EP writes does not
    depend on where the file is (onnxruntime names an EP's partitions, and so the EPContext
    node and binary, with a hash of the model's path). A model with external data is read
    from its folder, which onnxruntime then hashes instead: still path-dependent.
    `device`: the preset device the session is for (the EP's plugin picks its onnxruntime
    devices and provider options for it).
    """
    path = Path(path)
    if not path.is_file():
        raise ModelFileError("file not found; check the path", where=str(path))
    ep = get_provider(ep_key)
    so = session_options()
    if configure is not None:
        configure(so)
    if ep.is_cpu:
        if record_placement:
            so.add_session_config_entry(_RECORD_PLACEMENT, "1")
        session = _create(path, so, providers=["CPUExecutionProvider"])
        return RuntimeSession(
            session, ep, str(path), _placement(session, ep) if record_placement else None
        )
    avail = availability(ep_key)
    if not avail.available:
        raise ExecutionProviderError(f"{ep.provider} cannot be used here: {avail.reason}")
    options = ep.provider_options(device, provider_options)
    so.add_provider_for_devices(ep_devices(ep, device), options)
    so.add_session_config_entry(_RECORD_PLACEMENT, "1")
    if not fallback:
        so.add_session_config_entry(_DISABLE_FALLBACK, "1")
    so.log_severity_level = 3
    with native_output_captured() as log:
        try:
            session = _create(path, so, from_bytes=path_independent)
            error = None
        except ModelFileError as exc:
            session, error = None, exc
    if error is not None:
        if not fallback and _FALLBACK_REFUSED in error.message:
            raise _refused(path, ep, configure, options, "".join(log), device) from None
        raise ExecutionProviderError(
            f"{ep.provider} cannot load the model: {error.message.split(': ', 1)[-1]}",
            where=str(path),
        )
    assert session is not None
    return RuntimeSession(session, ep, str(path), _placement(session, ep))


# onnxruntime's load errors repeat the path and node signature before the cause; the
# cause ("Unrecognized attribute: axis for operator DequantizeLinear") is what helps.
_ORT_PREFIX = re.compile(r"^\[ONNXRuntimeError\] : \d+ : \w+ : (Load model from .*? failed:)?")
_NODE_SIGNATURE = re.compile(r"In Node, \(.*?\) : \(.*?\) -> \(.*?\) , Error ", re.S)


def _load_error(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    text = _NODE_SIGNATURE.sub("", _ORT_PREFIX.sub("", text))
    return text[:300] if text else type(exc).__name__


def _create(
    path: Path, so: ort.SessionOptions, from_bytes: bool = False, **kwargs: Any
) -> ort.InferenceSession:
    model: str | bytes = str(path)
    if from_bytes:
        from winml_recipes.onnx.io import sidecar_paths

        model = path.read_bytes()
        if sidecar_paths(path):  # then its folder counts again (onnxruntime hashes it)
            so.add_session_config_entry(_EXTERNAL_DATA_FOLDER, str(path.parent))
    try:
        return ort.InferenceSession(model, sess_options=so, **kwargs)
    except Exception as exc:  # ORT raises Fail / InvalidGraph / NotImplemented / EP_FAIL
        raise ModelFileError(
            f"onnxruntime cannot load the model: {_load_error(exc)}", where=str(path)
        ) from None


def _refused(
    path: Path,
    ep: ExecutionProvider,
    configure: Callable[[ort.SessionOptions], None] | None,
    options: Mapping[str, str],
    log: str,
    device: str | None = None,
) -> ExecutionProviderError:
    """Which nodes the EP refused: open again with fallback allowed and read the placement."""
    so = session_options()
    if configure is not None:
        configure(so)
    so.add_provider_for_devices(ep_devices(ep, device), dict(options))
    so.add_session_config_entry(_RECORD_PLACEMENT, "1")
    refused: tuple[tuple[str, str], ...] = ()
    with native_output_captured() as more, contextlib.suppress(ModelFileError):
        refused = _placement(_create(path, so), ep).fallback_nodes
    text = log + "".join(more)
    shown = ", ".join(f"{n} ({t})" for n, t in refused[:MAX_NODES_SHOWN])
    more_count = len(refused) - MAX_NODES_SHOWN
    if more_count > 0:
        shown += f" and {more_count} more"
    reason = ep.refusal_reason(text)  # the EP's plugin reads its own log
    why = f"; the EP says: {reason}" if reason else ""
    if not refused:
        shown = "unknown nodes"
    over = _over_rank(path, [n for n, _ in refused], ep.max_rank) if ep.max_rank else []
    if over:
        node, tensor, shape = over[0]
        why += (
            f"; {len(over)} of them touch a tensor of rank above {ep.max_rank}, the highest "
            f"{ep.display_name or ep.key} takes (e.g. {node}: {tensor} {shape}): fold those "
            f"dims into rank {ep.max_rank} or less in the model, or run them on the CPU"
        )
    dynamic = _dynamic_inputs(path)
    if dynamic and not ep.is_cpu:
        why += (
            f"; the graph's inputs have dynamic dims ({', '.join(dynamic)}) and "
            f"{ep.provider} needs static shapes: add fix_shapes before this step"
        )
    return ExecutionProviderError(
        f"{ep.provider} ({ep.backend or ep.key}) refused {len(refused) or 'some'} node(s): "
        f"{shown}{why}; allow CPU fallback (verify: {{allow_cpu_fallback: true}}) or keep "
        "those ops out of the graph",
        where=str(path),
    )


def _over_rank(
    path: Path, names: Sequence[str], max_rank: int
) -> list[tuple[str, str, list[int | str]]]:
    """The refused nodes that read or write a tensor of rank above `max_rank` (from the
    graph's inferred shapes): (node, tensor, shape), in the refusal's order."""
    import onnx

    from winml_recipes.onnx.io import load_model

    try:
        model = onnx.shape_inference.infer_shapes(load_model(path, load_external_data=False))
    except Exception:  # a graph shape inference cannot read: no hint, the refusal stands
        return []
    graph = model.graph
    shapes = {
        v.name: [d.dim_value if d.HasField("dim_value") else d.dim_param
                 for d in v.type.tensor_type.shape.dim]
        for v in [*graph.value_info, *graph.input, *graph.output]
        if v.type.tensor_type.HasField("shape")
    }  # fmt: skip
    nodes = {n.name: n for n in graph.node if n.name}
    out: list[tuple[str, str, list[int | str]]] = []
    for name in names:
        node = nodes.get(name)
        tensors = [*node.input, *node.output] if node is not None else []
        wide = [t for t in tensors if t in shapes and len(shapes[t]) > max_rank]
        if wide:
            out.append((name, wide[0], shapes[wide[0]]))
    return out


def _dynamic_inputs(path: Path) -> list[str]:
    from winml_recipes.onnx.io import load_model

    try:
        graph = load_model(path, load_external_data=False).graph
    except Exception:
        return []
    initializers = {t.name for t in graph.initializer}
    dims: list[str] = []
    for vi in graph.input:
        if vi.name in initializers:
            continue
        for d in vi.type.tensor_type.shape.dim:
            if not d.HasField("dim_value"):
                name = d.dim_param or "?"
                if name not in dims:
                    dims.append(name)
    return dims


def load_session(path: Path | str) -> ort.InferenceSession:
    """A plain CPU session (calibration and data plumbing read outputs directly)."""
    return open_session(path).session


def run_model(
    path: Path | str,
    feeds: Sequence[Mapping[str, np.ndarray]],
    ep_key: str = CPU,
    *,
    fallback: bool = True,
    configure: Callable[[ort.SessionOptions], None] | None = None,
) -> list[dict[str, np.ndarray]]:
    """Outputs (by name, in graph order) for each feed, from one session."""
    session = open_session(path, ep_key, fallback=fallback, configure=configure)
    return [session.run(feed, i) for i, feed in enumerate(feeds)]


def run_at_default_level(
    path: Path | str, feeds: Sequence[Mapping[str, np.ndarray]]
) -> list[dict[str, np.ndarray]]:
    """Outputs on the CPU EP at onnxruntime's default graph optimization level (ALL: what
    a plain `InferenceSession` in a user's app runs, QDQ fusions included), where every
    other session here runs BASIC."""

    def default_level(so: ort.SessionOptions) -> None:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL

    return run_model(path, feeds, configure=default_level)


def open_bytes_session(model_bytes: bytes) -> ort.InferenceSession:
    """A CPU session over a serialized model (the exporter's parity check)."""
    return ort.InferenceSession(
        model_bytes, sess_options=session_options(), providers=["CPUExecutionProvider"]
    )


def optimize_offline(src: Path, out: Path, configure: Callable[[ort.SessionOptions], None]) -> None:
    """Let onnxruntime write its optimized graph to `out` (normalize)."""
    so = session_options()
    so.optimized_model_filepath = str(out)
    configure(so)
    _create(src, so, providers=["CPUExecutionProvider"])


def calibration_session(path: Path, configure: Callable[[ort.SessionOptions], None] | None):
    """A CPU session for an augmented calibration graph.

    PRIORITY_BASED execution follows the graph's node order among ready nodes, so reductions
    placed right after each producer run at once and the activation is freed. The default
    order runs them after the whole forward pass: on a 40-activation chain of 16 MB tensors
    the peak was 759 MB against 121 MB (a plain forward pass: 113 MB).
    """
    so = session_options()
    so.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    if configure is not None:
        configure(so)
    return _create(path, so, providers=["CPUExecutionProvider"])
