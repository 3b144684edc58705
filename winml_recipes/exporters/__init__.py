"""torch -> ONNX exporters.

One entry point, `export_model(ExportRequest) -> onnx.ModelProto`. Exporter families are
plugins: an `ExporterFamily` declared in the `winml_recipes.exporters` entry-point group
(the built-ins, `sam3_tracker` and `auto`, in pyproject.toml like a third party's), found
the same way as passes. torch and transformers are imported only inside functions, so
importing this package stays cheap and works without the `export` extra installed.

Every export goes through `torch.onnx.export(dynamo=True)` with batch-2 example inputs (a graph
traced at batch 1 looks dynamic but can fail at batch 2, see FACTS.md), then the proto is
normalized: node metadata and doc strings are cleared and weights are inlined, so two exports
of the same request serialize to identical bytes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import onnx

from winml_recipes.console import quiet_stdout
from winml_recipes.modelfolder import TRUST_REMOTE_CODE, check_folder, refuse_auto_map
from winml_recipes.sdk.errors import InternalError, PlanError, SourceError
from winml_recipes.sdk.plugins import check_available, load_entry_points
from winml_recipes.untrusted import UntrustedInputError

__all__ = [
    "ExportOutput",
    "ExportRequest",
    "ExporterFamily",
    "export_model",
    "export_with_parity",
    "families",
]

ENTRY_POINT_GROUP = "winml_recipes.exporters"


@dataclass(frozen=True)
class ExportRequest:
    """What to export. Exactly one of `model_id` / `config` is set."""

    family: str  # a registered ExporterFamily's name
    component: str  # one of the family's components
    task: str | None = None  # auto only: a key of exporters.auto.TASKS
    model_id: str | None = None  # HF model id or local HF directory
    revision: str | None = None
    config: Mapping[str, Any] | None = None  # random weights: {"model_type": ..., **fields}
    seed: int = 0
    opset: int | None = None  # None = exporter default


@dataclass(frozen=True)
class ExportOutput:
    """The exported model and how closely onnxruntime reproduces torch on the trace inputs."""

    model: onnx.ModelProto
    parity: dict[str, dict[str, float]]  # per output: max_abs, mean_abs, cosine, sqnr_db


@dataclass(frozen=True)
class ExporterFamily:
    """An exporter family plugin: what it exports, and how."""

    name: str
    components: tuple[str, ...]
    export: Callable[[ExportRequest], ExportOutput]  # torch and transformers imported inside
    # Every catalog component of an entry of this family exports as this exporter
    # component (None: each under its own catalog name).
    component: str | None = None

    def component_for(self, catalog_component: str) -> str:
        return self.component or catalog_component


@cache
def families() -> dict[str, ExporterFamily]:
    """Every exporter family, from the `winml_recipes.exporters` entry points, by name."""
    found = load_entry_points(
        ENTRY_POINT_GROUP,
        lambda obj: isinstance(obj, ExporterFamily),
        "an ExporterFamily",
        named=lambda family: family.name,
    )
    if not found:
        raise PlanError(
            f"no exporter families registered: the {ENTRY_POINT_GROUP} entry points are "
            "missing; install winml-recipes (pip install -e . in a checkout, or make install)"
        )
    return dict(sorted(found.items()))


def export_model(req: ExportRequest) -> onnx.ModelProto:
    """Export one component of one model to an in-memory ONNX model (weights inline)."""
    return export_with_parity(req).model


def export_with_parity(req: ExportRequest) -> ExportOutput:
    """Export, then run the ONNX model in onnxruntime on the (batch-2) trace inputs and
    compare with torch: a wrong export or a batch dim that is not really dynamic shows up."""
    where = f"{req.family}/{req.component}"
    known = families()
    if req.family not in known:
        check_available(ENTRY_POINT_GROUP, req.family, "exporter family")
        raise SourceError(
            f"unknown exporter family '{req.family}'; use one of {', '.join(known)}",
            where=where,
        )
    family = known[req.family]
    if req.component not in family.components:
        raise SourceError(
            f"unknown component '{req.component}' for family '{req.family}'; "
            f"use one of {', '.join(family.components)}",
            where=where,
        )
    if (req.model_id is None) == (req.config is None):
        raise SourceError(
            "set exactly one of model_id (pretrained weights) or config (random weights)",
            where=where,
        )
    return family.export(req)


# --------------------------------------------------------------------------- shared helpers


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    text = text or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _looks_like_path(model_id: str) -> bool:
    """A Hub id is `name` or `org/name`; anything else that names a directory is a path."""
    if model_id.startswith(("/", "./", "../", "~", ".\\", "..\\")) or "\\" in model_id:
        return True
    if len(model_id) > 1 and model_id[1] == ":":  # Windows drive
        return True
    return model_id.count("/") > 1


def load_pretrained(
    loader: Callable[..., Any], model_id: str, revision: str | None, where: str
) -> Any:
    """`loader.from_pretrained(model_id, revision=...)` with failures as `SourceError`."""
    local = os.path.isdir(os.path.expanduser(model_id))
    if not local and _looks_like_path(model_id):
        raise SourceError(
            f"local model directory '{model_id}' does not exist; check the path "
            "(or use a Hugging Face model id)",
            where=where,
        )
    source = os.path.expanduser(model_id) if local else model_id
    if local:
        try:
            check_folder(Path(source))  # no code from it; its configs read within bounds
        except UntrustedInputError as exc:
            raise SourceError(f"cannot load '{model_id}': {exc.message}", where=where) from None
    else:  # transformers downloads through huggingface_hub: check what the Hub sends
        from winml_recipes.hubguard import install

        install()
    kwargs: dict[str, Any] = {"trust_remote_code": TRUST_REMOTE_CODE}
    if revision is not None and not local:
        kwargs["revision"] = revision
    try:
        with quiet_stdout(), _no_progress_bars():
            model = loader.from_pretrained(source, **kwargs)
    except Exception as exc:
        rev = f" at revision '{revision}'" if revision else ""
        hint = (
            "check that the directory holds a transformers checkpoint (config.json + weights)"
            if local
            else "check the model id and revision, or download it into the Hugging Face cache "
            "first (no network at build time)"
        )
        raise SourceError(
            f"cannot load '{model_id}'{rev}: {_one_line(exc)}; {hint}", where=where
        ) from exc
    return model.float().eval()


def build_config(config: Mapping[str, Any], default_model_type: str | None, where: str) -> Any:
    """A transformers config from `{"model_type": ..., **fields}`."""
    from transformers import AutoConfig

    fields = dict(config)
    refuse_auto_map(fields, where)  # the classes it names are code transformers would import
    model_type = fields.pop("model_type", default_model_type)
    if not model_type:
        raise SourceError("config needs a 'model_type' (e.g. 'bert')", where=where)
    try:
        return AutoConfig.for_model(str(model_type), **fields)
    except ValueError as exc:
        if "Unrecognized model identifier" in str(exc) or str(model_type) in str(exc):
            raise SourceError(
                f"unknown model_type '{model_type}'; use a model_type that transformers "
                "knows (e.g. 'bert', 'convnext', 'sam3_tracker')",
                where=where,
            ) from exc
        raise SourceError(
            f"invalid config for model_type '{model_type}': {_one_line(exc)}; "
            "fix the config fields",
            where=where,
        ) from exc
    except Exception as exc:
        raise SourceError(
            f"invalid config for model_type '{model_type}': {_one_line(exc)}; "
            "fix the config fields",
            where=where,
        ) from exc


def build_random(factory: Callable[[], Any], seed: int) -> Any:
    """Build a random-weight model under `torch.manual_seed(seed)`; global RNG is restored."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = factory()
    return model.float().eval()


@contextlib.contextmanager
def _no_progress_bars() -> Iterator[None]:
    """Hide transformers' "Loading weights" bars (stderr) for the duration of a load."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


# Known-harmless messages the dynamo exporter emits on every run.
_NOISY_WARNINGS = (
    r"Exporting a model while it is in training mode",
    r"# The axis name: .* will not be used",
    r".*isinstance\(treespec, LeafSpec\)",
)
_NOISY_LOGGERS = ("torch.onnx._internal.exporter._registration",)


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    saved = {}
    for name in _NOISY_LOGGERS:
        logger = logging.getLogger(name)
        saved[name] = logger.level
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), quiet_stdout():
            for pattern in _NOISY_WARNINGS:
                warnings.filterwarnings("ignore", message=pattern)
            yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


def torch_export(
    module: Any,
    args: Sequence[Any],
    *,
    input_names: Sequence[str],
    output_names: Sequence[str],
    dynamic_shapes: Mapping[str, Mapping[int, str]] | Sequence[Any],
    opset: int | None,
    kwargs: Mapping[str, Any] | None = None,
) -> ExportOutput:
    """`torch.onnx.export(dynamo=True)` into a temp dir, then load and normalize the proto.

    `dynamic_shapes` uses dim *names* (strings): the exporter turns them into
    `Dim.DYNAMIC` and writes the names as `dim_param` in the graph.
    """
    import torch

    module = module.eval()
    extra: dict[str, Any] = {}
    if opset is not None:
        extra["opset_version"] = int(opset)
    with tempfile.TemporaryDirectory(prefix="winml-export-") as tmp:
        path = Path(tmp) / "model.onnx"
        try:
            with _quiet_exporter(), torch.no_grad():
                torch.onnx.export(
                    module,
                    tuple(args),
                    str(path),
                    kwargs=dict(kwargs) if kwargs else None,
                    dynamo=True,
                    verbose=False,
                    external_data=True,
                    input_names=list(input_names),
                    output_names=list(output_names),
                    dynamic_shapes=dynamic_shapes,
                    **extra,
                )
        except Exception as exc:  # torch wraps the model's own error: name that one
            from winml_recipes.exporters.heads import export_cause

            raise SourceError(
                f"torch.onnx.export failed ({type(exc).__name__}), caused by "
                f"{export_cause(exc)}; check the model class and its inputs"
            ) from exc
        proto = onnx.load(str(path), load_external_data=True)
    _check_names(proto, input_names, output_names)
    proto = normalize(proto)
    return ExportOutput(proto, _parity(module, args, proto, input_names, output_names))


def _parity(
    module: Any,
    args: Sequence[Any],
    proto: onnx.ModelProto,
    input_names: Sequence[str],
    output_names: Sequence[str],
) -> dict[str, dict[str, float]]:
    import torch

    from winml_recipes.onnx.metrics import compare_outputs
    from winml_recipes.runtime.sessions import open_bytes_session

    with torch.no_grad():
        expected = module(*args)
    expected = expected if isinstance(expected, tuple | list) else (expected,)
    session = open_bytes_session(proto.SerializeToString())
    feeds = {n: a.numpy() for n, a in zip(input_names, args, strict=True)}
    got = dict(zip(output_names, session.run(list(output_names), feeds), strict=True))
    reference = {n: t.numpy() for n, t in zip(output_names, expected, strict=True)}
    return compare_outputs(reference, got)


def _check_names(proto: onnx.ModelProto, inputs: Sequence[str], outputs: Sequence[str]) -> None:
    got_in = [i.name for i in proto.graph.input]
    got_out = [o.name for o in proto.graph.output]
    if got_in != list(inputs) or got_out != list(outputs):
        raise InternalError(
            f"exported graph has inputs {got_in} / outputs {got_out}, expected "
            f"{list(inputs)} / {list(outputs)}; report this as an exporter bug"
        )


def normalize(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Drop doc strings, metadata and external-data references, in place; returns `proto`.

    Dynamo graphs carry megabytes of per-node metadata (stack traces, source paths); none of
    it is needed to run the model and all of it would make the bytes run-dependent.
    """
    proto.doc_string = ""
    del proto.metadata_props[:]
    _normalize_graph(proto.graph)
    for fn in proto.functions:
        fn.doc_string = ""
        del fn.metadata_props[:]
        for node in fn.node:
            _normalize_node(node)
        for vi in fn.value_info:
            _normalize_value(vi)
    return proto


def _normalize_graph(graph: onnx.GraphProto) -> None:
    graph.doc_string = ""
    del graph.metadata_props[:]
    for vi in (*graph.input, *graph.output, *graph.value_info):
        _normalize_value(vi)
    for tensor in graph.initializer:
        _normalize_tensor(tensor)
    for sparse in graph.sparse_initializer:
        _normalize_tensor(sparse.values)
        _normalize_tensor(sparse.indices)
    for node in graph.node:
        _normalize_node(node)


def _normalize_node(node: onnx.NodeProto) -> None:
    node.doc_string = ""
    del node.metadata_props[:]
    for attr in node.attribute:
        attr.doc_string = ""
        if attr.type == onnx.AttributeProto.TENSOR:
            _normalize_tensor(attr.t)
        elif attr.type == onnx.AttributeProto.TENSORS:
            for t in attr.tensors:
                _normalize_tensor(t)
        elif attr.type == onnx.AttributeProto.GRAPH:
            _normalize_graph(attr.g)
        elif attr.type == onnx.AttributeProto.GRAPHS:
            for g in attr.graphs:
                _normalize_graph(g)


def _normalize_value(vi: onnx.ValueInfoProto) -> None:
    vi.doc_string = ""
    del vi.metadata_props[:]


def _normalize_tensor(tensor: onnx.TensorProto) -> None:
    tensor.doc_string = ""
    del tensor.metadata_props[:]
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        # onnx.load(load_external_data=True) inlines data; a leftover reference is a bug.
        raise InternalError(f"tensor '{tensor.name}' still references external data")
    del tensor.external_data[:]
