"""Load and save ONNX models safely.

Loading turns every failure (missing, truncated, not ONNX) into one `ModelFileError`.
Saving writes `model.onnx` (plus `model.onnx_data` when the weights are large) into a
fresh temp name first and renames, so a reader never sees a half-written file.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO

import onnx

from winml_recipes.sdk.errors import ModelFileError

# Weights above this size go to an `<name>_data` sidecar (protobuf caps a file at 2 GiB).
EXTERNAL_DATA_THRESHOLD_BYTES = 1 << 30
# Tensors smaller than this stay inline even with external data: moving shape constants
# out makes onnxruntime fail to parse the model (FACTS.md).
EXTERNAL_TENSOR_MIN_BYTES = 1024


def sidecar_paths(model_path: Path) -> list[Path]:
    """Existing external-data files next to `model_path` that the model references.

    Only files that pass `check_external_data` are returned, so a copy of "the model with
    its sidecars" never reaches outside the model's folder.
    """
    try:
        proto = onnx.load(str(model_path), load_external_data=False)
    except Exception:
        return []
    return check_external_data(proto, model_path)


def check_external_data(
    proto: onnx.ModelProto, model_path: Path, *, missing_ok: bool = True
) -> list[Path]:
    """The sidecars `proto` references, each a regular file inside the model's folder.

    A location that is absolute, escapes the folder (`..`, or a symlink resolving outside
    it), is not a regular file, or is shorter than the tensors it should hold raises a
    one-line ModelFileError before anything opens it; so does a missing one unless
    `missing_ok`. Returns the existing sidecars, sorted.
    """
    folder = model_path.parent.resolve()
    found: dict[str, Path] = {}
    needed: dict[str, int] = {}
    for tensor in _all_tensors(proto.graph):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location", "")
        where = f"{model_path}: tensor '{tensor.name}'"
        if not location or Path(location).is_absolute() or Path(location).drive:
            raise ModelFileError(
                f"external data location {location!r} must be a file name relative to the "
                "model's folder",
                where=where,
            )
        target = (model_path.parent / location).resolve()
        if folder != target.parent and folder not in target.parents:
            raise ModelFileError(
                f"external data {location!r} is outside the model's folder; keep the weights "
                "beside the model",
                where=where,
            )
        try:
            mode = os.stat(target).st_mode
        except OSError:
            if missing_ok:
                continue  # missing: onnx reports it when the data is loaded
            raise ModelFileError(
                f"external data {location!r} is missing (the model keeps its weights there); "
                "put it beside the model",
                where=where,
            ) from None
        if not stat.S_ISREG(mode):
            raise ModelFileError(f"external data {location!r} is not a regular file", where=where)
        try:
            end = int(info.get("offset") or 0) + int(info.get("length") or 0)
        except ValueError:
            raise ModelFileError(
                f"external data {location!r}: bad offset/length", where=where
            ) from None
        needed[location] = max(needed.get(location, 0), end)
        found[location] = model_path.parent / location
    for location, end in needed.items():
        size = os.stat(found[location]).st_size
        if size < end:
            raise ModelFileError(
                f"external data {location!r} holds {size} bytes, the model needs {end}; "
                "is the file complete?",
                where=str(model_path),
            )
    return [found[n] for n in sorted(found)]


def check_structure(proto: onnx.ModelProto, path: Path) -> None:
    """The main graph is a DAG over defined names, and initializers hold what they declare.

    onnxruntime refuses such models only when a session is made; `inspect`, `dequantize` and
    the fingerprint would otherwise describe (and hash) them as if they were fine. Checked
    here instead of onnx.checker, which also refuses valid contrib-op (com.microsoft) graphs.
    """
    graph = proto.graph
    where = str(path)
    produced: dict[str, str] = {}
    for value in [*graph.input, *graph.initializer]:
        produced.setdefault(value.name, "graph input")
    node_names = [n.name or f"#{i} ({n.op_type})" for i, n in enumerate(graph.node)]
    for name, node in zip(node_names, graph.node, strict=True):
        for out in node.output:
            if not out:
                continue
            if out in produced and produced[out] != "graph input":
                raise ModelFileError(
                    f"invalid graph: '{out}' is produced twice ({produced[out]} and {name})",
                    where=where,
                )
            if out in produced:
                raise ModelFileError(
                    f"invalid graph: node {name} overwrites the graph input '{out}'", where=where
                )
            produced[out] = name
    for name, node in zip(node_names, graph.node, strict=True):
        for inp in node.input:
            if inp and inp not in produced:
                raise ModelFileError(
                    f"invalid graph: node {name} reads '{inp}', which nothing produces",
                    where=where,
                )
    for out in graph.output:
        if out.name not in produced:
            raise ModelFileError(
                f"invalid graph: output '{out.name}' is produced by no node", where=where
            )
    _check_acyclic(graph, node_names, where)
    for tensor in graph.initializer:
        _check_tensor_size(tensor, where)


def _check_acyclic(graph: onnx.GraphProto, names: list[str], where: str) -> None:
    producer = {o: i for i, n in enumerate(graph.node) for o in n.output if o}
    waiting = [0] * len(graph.node)
    readers: dict[int, list[int]] = {}
    for i, node in enumerate(graph.node):
        deps = {producer[x] for x in node.input if x in producer}
        waiting[i] = len(deps)
        for d in deps:
            readers.setdefault(d, []).append(i)
    ready = [i for i, w in enumerate(waiting) if w == 0]
    done = 0
    while ready:
        i = ready.pop()
        done += 1
        for r in readers.get(i, []):
            waiting[r] -= 1
            if waiting[r] == 0:
                ready.append(r)
    if done != len(graph.node):
        stuck = next(names[i] for i, w in enumerate(waiting) if w > 0)
        raise ModelFileError(f"invalid graph: a cycle runs through node {stuck}", where=where)


def _check_tensor_size(tensor: onnx.TensorProto, where: str) -> None:
    import numpy as np

    try:
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except Exception:
        return  # strings, 4-bit and other packed types: sizes are not simple
    if tensor.data_type in (onnx.TensorProto.STRING,) or itemsize == 0:
        return
    elements = 1
    for d in tensor.dims:
        elements *= d
    expected = elements * itemsize
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        info = {e.key: e.value for e in tensor.external_data}
        got = int(info["length"]) if info.get("length", "").isdigit() else None
    elif tensor.HasField("raw_data"):
        got = len(tensor.raw_data)
    else:
        return  # typed fields: protobuf holds what it holds, onnx reads them by count
    if got is not None and got != expected:
        raise ModelFileError(
            f"invalid initializer '{tensor.name}': dims {list(tensor.dims)} need {expected} "
            f"bytes, it holds {got}",
            where=where,
        )


def check_regular_file(path: Path) -> None:
    """Refuse what is not a regular file (a FIFO would block a reader forever)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ModelFileError("file not found; check the path", where=str(path)) from None
    except OSError as exc:
        raise ModelFileError(f"cannot read: {exc.strerror}", where=str(path)) from None
    if stat.S_ISDIR(mode):
        raise ModelFileError("is a directory, expected an .onnx file", where=str(path))
    if not stat.S_ISREG(mode):
        raise ModelFileError("not a regular file (a pipe, device or socket)", where=str(path))


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


def load_model(
    path: Path | str, *, load_external_data: bool = True, sidecars_required: bool = False
) -> onnx.ModelProto:
    """Load an ONNX model or raise a one-line `ModelFileError` naming the file
    (`sidecars_required`: its external data files must exist even when not loaded)."""
    path = Path(path)
    check_regular_file(path)
    try:
        model = onnx.load(str(path), load_external_data=False)
        check_structure(model, path)
        check_external_data(model, path, missing_ok=not (load_external_data or sidecars_required))
        if load_external_data:
            from onnx.external_data_helper import load_external_data_for_model

            load_external_data_for_model(model, str(path.parent))
    except ModelFileError:
        raise
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
            moved = [t for t in _initializers(model) if t.HasField("raw_data")]
            try:
                onnx.save_model(
                    model,
                    str(tmp_model),
                    save_as_external_data=True,
                    all_tensors_to_one_file=True,
                    location=data_name,
                    size_threshold=EXTERNAL_TENSOR_MIN_BYTES,
                )
            finally:
                _bring_back(moved, tmp_dir)
            if (tmp_dir / data_name).exists():
                os.chmod(tmp_dir / data_name, 0o644)
                os.replace(tmp_dir / data_name, path.parent / data_name)
            else:  # no tensor was large enough to go out
                (path.parent / data_name).unlink(missing_ok=True)
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


def adopt_sidecars(path: Path) -> Path:
    """Make a model written by another tool follow our layout: `<file>_data` or inline.

    onnxruntime's quantizer writes `model.onnx.data` for models over its threshold; our
    outputs, cache entries and final copies use `model.onnx_data` (the onnx-community
    convention). Rewritten through save_model, then the foreign sidecars are removed.
    """
    sidecars = sidecar_paths(path)
    if all(p.name == f"{path.name}_data" for p in sidecars):
        return path
    save_model(load_model(path), path)
    keep = {f"{path.name}_data"}
    for old in sidecars:
        if old.name not in keep and old.exists():
            old.unlink()
    return path


def _initializers(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    """The initializers of the graph and of its subgraphs (If/Loop bodies)."""
    out: list[onnx.TensorProto] = []
    pending = [model.graph]
    while pending:
        graph = pending.pop()
        out.extend(graph.initializer)
        for node in graph.node:
            for attr in node.attribute:
                pending.extend([attr.g] if attr.HasField("g") else [])
                pending.extend(attr.graphs)
    return out


def _bring_back(tensors: list[onnx.TensorProto], folder: Path) -> None:
    """onnx.save_model moves the bytes of the tensors it writes to external data out of the
    caller's model (it marks them external and clears them): read them back, so a model
    stays usable after it is saved (a pass that saves, then goes on rewriting, would
    otherwise find its weights gone)."""
    from onnx.external_data_helper import ExternalDataInfo

    handles: dict[str, BinaryIO] = {}
    try:
        for tensor in tensors:
            if tensor.HasField("raw_data") or tensor.data_location != onnx.TensorProto.EXTERNAL:
                continue
            info = ExternalDataInfo(tensor)
            fh = handles.get(info.location)
            if fh is None:
                fh = handles[info.location] = open(folder / info.location, "rb")  # noqa: SIM115
            fh.seek(info.offset or 0)
            tensor.raw_data = fh.read(info.length) if info.length else fh.read()
            del tensor.external_data[:]
            tensor.ClearField("data_location")
    finally:
        for fh in handles.values():
            fh.close()


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
