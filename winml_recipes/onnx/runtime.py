"""Run an ONNX file on the onnxruntime CPU provider, deterministically."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort

from winml_recipes.sdk.errors import ModelFileError

INTRA_OP_THREADS = 2


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
    return so


def load_session(path: Path | str) -> ort.InferenceSession:
    """A CPU session for `path`, or a one-line `ModelFileError` naming the file."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError("file not found; check the path", where=str(path))
    try:
        return ort.InferenceSession(
            str(path), sess_options=session_options(), providers=["CPUExecutionProvider"]
        )
    except Exception as exc:  # ORT raises Fail / InvalidGraph / NotImplemented / ...
        raise ModelFileError(
            f"onnxruntime cannot load the model: {_first_line(exc)}", where=str(path)
        ) from None


def run_model(
    path: Path | str, feeds: Sequence[Mapping[str, np.ndarray]]
) -> list[dict[str, np.ndarray]]:
    """Outputs (by name, in graph order) for each feed, from one session."""
    sess = load_session(path)
    names = [o.name for o in sess.get_outputs()]
    results: list[dict[str, np.ndarray]] = []
    for i, feed in enumerate(feeds):
        try:
            values = sess.run(names, dict(feed))
        except Exception as exc:
            raise ModelFileError(
                f"onnxruntime failed on input set {i}: {_first_line(exc)}; "
                "check the input names, dtypes and shapes",
                where=str(path),
            ) from None
        results.append(dict(zip(names, values, strict=True)))
    return results
