"""Load and save ONNX models safely.

Loading turns every failure (missing, truncated, not ONNX) into one `ModelFileError`.
Saving writes `model.onnx` (plus `model.onnx_data` when the weights are large) into a
fresh temp name first and renames, so a reader never sees a half-written file.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import onnx

from winml_recipes.errors import ModelFileError

# Weights above this size go to an `<name>_data` sidecar (protobuf caps a file at 2 GiB).
EXTERNAL_DATA_THRESHOLD_BYTES = 1 << 30
# Tensors smaller than this stay inline even with external data: moving shape constants
# out makes onnxruntime fail to parse the model (FACTS.md).
EXTERNAL_TENSOR_MIN_BYTES = 1024


def sidecar_paths(model_path: Path) -> list[Path]:
    """Existing external-data files next to `model_path` that the model references."""
    try:
        proto = onnx.load(str(model_path), load_external_data=False)
    except Exception:
        return []
    names: set[str] = set()
    for tensor in _all_tensors(proto.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            for entry in tensor.external_data:
                if entry.key == "location":
                    names.add(entry.value)
    return [model_path.parent / n for n in sorted(names) if (model_path.parent / n).exists()]


def _all_tensors(graph: onnx.GraphProto):
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                yield attr.t
            elif attr.type == onnx.AttributeProto.GRAPH:
                yield from _all_tensors(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _all_tensors(g)


def load_model(path: Path | str, *, load_external_data: bool = True) -> onnx.ModelProto:
    """Load an ONNX model or raise a one-line `ModelFileError` naming the file."""
    path = Path(path)
    if not path.exists():
        raise ModelFileError("file not found; check the path", where=str(path))
    if path.is_dir():
        raise ModelFileError("is a directory, expected an .onnx file", where=str(path))
    try:
        model = onnx.load(str(path), load_external_data=load_external_data)
    except Exception as exc:  # protobuf DecodeError, missing sidecar, ...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelFileError(
            f"not a readable ONNX model ({first[:160]}); is the file complete?", where=str(path)
        ) from None
    if not model.graph.node and not model.graph.output:
        raise ModelFileError(
            "not an ONNX model (empty graph); is the file truncated or of another format?",
            where=str(path),
        )
    return model


def save_model(model: onnx.ModelProto, path: Path | str) -> Path:
    """Save atomically; weights above the threshold go to `<file>_data` beside the model."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data_name = path.name + "_data"
    external = model.ByteSize() > EXTERNAL_DATA_THRESHOLD_BYTES if _fits(model) else True
    tmp_dir = Path(tempfile.mkdtemp(prefix=".save-", dir=path.parent))
    try:
        tmp_model = tmp_dir / path.name
        if external:
            onnx.save_model(
                model,
                str(tmp_model),
                save_as_external_data=True,
                all_tensors_to_one_file=True,
                location=data_name,
                size_threshold=EXTERNAL_TENSOR_MIN_BYTES,
            )
            os.chmod(tmp_dir / data_name, 0o644)
            os.replace(tmp_dir / data_name, path.parent / data_name)
        else:
            onnx.save_model(model, str(tmp_model))
            stale = path.parent / data_name
            if stale.exists():
                stale.unlink()
        os.chmod(tmp_model, 0o644)
        os.replace(tmp_model, path)
    finally:
        for leftover in tmp_dir.iterdir():
            leftover.unlink()
        tmp_dir.rmdir()
    return path


def _fits(model: onnx.ModelProto) -> bool:
    try:
        model.ByteSize()
    except Exception:
        return False
    return True


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def artifact_sha256(model_path: Path) -> str:
    """Digest of a model file together with its external-data sidecars."""
    paths = [model_path, *sidecar_paths(model_path)]
    if len(paths) == 1:
        return file_sha256(model_path)
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode())
        h.update(file_sha256(p).encode())
    return h.hexdigest()
