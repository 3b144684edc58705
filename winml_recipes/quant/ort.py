"""Calls into onnxruntime.quantization: the quantizers are ORT's; only the ranges are ours.

Ranges come from winml_recipes.quant.calibrate (streaming, real histograms) and reach
ORT's QDQ quantizer through quantize_static's `calibration_cache_path`. An EP's rules
(sdk.ep.QuantRules, from its plugin) may give the quantizer's arguments; mixed precision goes
through ORT's `MixedPrecisionTensorQuantOverridesFixer` (by way of the EP's own config
where its rules give one), which inserts the DQ->Q converts. Nothing here re-implements a
quantizer or a fixer.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from winml_recipes.onnx.io import adopt_sidecars
from winml_recipes.quant.config import QuantConfig
from winml_recipes.sdk.ep import QuantRules

if TYPE_CHECKING:
    import onnx

QUANT_TYPES = {"uint8": "QUInt8", "int8": "QInt8", "uint16": "QUInt16", "int16": "QInt16"}
LARGE_MODEL_BYTES = 1 << 30


def quant_type(name: str) -> Any:
    from onnxruntime.quantization import QuantType

    return getattr(QuantType, QUANT_TYPES[name])


@contextlib.contextmanager
def quiet_ort_logging() -> Iterator[None]:
    """ORT's quantizer logs advice through the root logger; keep the build output clean."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def _large(path: Path) -> bool:
    from winml_recipes.onnx.io import sidecar_paths

    return sum(p.stat().st_size for p in [path, *sidecar_paths(path)]) > LARGE_MODEL_BYTES


def static_args(
    cfg: QuantConfig,
    quant_format: Any,
    op_types: list[str] | None,
    tensor_overrides: dict[str, Any] | None,
    exclude: list[str],
) -> dict[str, Any]:
    """onnxruntime `quantize_static` keyword arguments for `cfg` (types, symmetry, per
    channel), in `quant_format`, with ORT's TensorQuantOverrides where given."""
    extra: dict[str, Any] = {
        "ActivationSymmetric": cfg.activation_symmetric,
        "WeightSymmetric": cfg.weight_symmetric,
    }
    if tensor_overrides is not None:
        extra["TensorQuantOverrides"] = tensor_overrides
    return {
        "quant_format": quant_format,
        "op_types_to_quantize": op_types,
        "per_channel": cfg.per_channel,
        "reduce_range": cfg.reduce_range,
        "activation_type": quant_type(cfg.activation_type),
        "weight_type": quant_type(cfg.weight_type),
        "nodes_to_exclude": exclude or None,
        "extra_options": extra,
    }


def quantize_static_qdq(
    src: Path,
    out: Path,
    cfg: QuantConfig,
    ranges_path: Path,
    overrides: dict[str, list[dict[str, Any]]],
    exclude: list[str],
    rules: QuantRules | None = None,
) -> list[dict[str, str]]:
    """Static quantization with precomputed ranges (QDQ or QOperator); `rules`: the target
    EP's quantization rules (its arguments for onnxruntime's quantizer and its rewrite of
    the written model), when the config applies them. Returns what was repaired of
    onnxruntime's known mistakes in the written graph (quant/validity.py)."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, quantize_static

    from winml_recipes.quant.validity import repair

    args = rules.quantizer_args(src, cfg, overrides, exclude) if rules is not None else None
    if args is None:
        tensor_overrides = fixed_overrides(src, overrides, cfg) if overrides else None
        if cfg.per_channel and cfg.format == "qdq":  # QOperator asks per channel of B
            per_tensor = {t: [{"symmetric": cfg.weight_symmetric}] for t in batched_weights(src)}
            tensor_overrides = {**per_tensor, **(tensor_overrides or {})} or None
        args = static_args(
            cfg,
            QuantFormat.QDQ if cfg.format == "qdq" else QuantFormat.QOperator,
            list(cfg.op_types) or None,
            tensor_overrides,
            exclude,
        )
    model, handed = _gemm_bias_vectors(src)
    with quiet_ort_logging(), _no_endless_sharing(), _unique_copies():
        quantize_static(
            model,
            str(out),
            calibration_data_reader=None,
            calibrate_method=CalibrationMethod.MinMax,
            calibration_cache_path=str(ranges_path),
            use_external_data_format=_large(src),
            **args,
        )
    adopt_sidecars(out)
    restore_float_inputs(out, exclude)
    _even_out_dead_channels(out)
    if rules is not None:
        rules.after_quantize(out)
    return [*handed, *(repair(out, src) if cfg.format == "qdq" else [])]


def _even_out_dead_channels(path: Path) -> None:
    """Dead per-channel weight channels get a live channel's scale (quant/dead_channels.py:
    exact, and what the HTP NPU needs)."""
    from winml_recipes.onnx.io import load_model, save_model
    from winml_recipes.quant.dead_channels import even_out_dead_channels

    model = load_model(path)
    if even_out_dead_channels(model):
        save_model(model, path)


@contextlib.contextmanager
def _no_endless_sharing() -> Iterator[None]:
    """onnxruntime's QDQ quantizer (1.31) loops for ever in `_quantize_sharing_param_tensors`
    when a tensor shares its quantization parameters with one that is never quantized (e.g.
    a tensor no range was calibrated for, after an op shape inference cannot type). No
    option of the library stops it, so the loop is checked first, the way it runs: a
    one-line error naming the tensors instead of a hang."""
    from onnxruntime.quantization.qdq_quantizer import QDQQuantizer

    from winml_recipes.sdk.errors import PassError

    original = QDQQuantizer._quantize_sharing_param_tensors

    def checked(self: Any) -> None:
        resolved = set(self.quantized_value_map)
        pending = {
            name: info.quant_para_provider.input_name if info.quant_para_provider else None
            for name, info in self.tensors_to_quantize.items()
        }
        while pending:
            ready = [n for n, provider in pending.items() if provider in resolved]
            if not ready:
                stuck = ", ".join(f"{n} (shares {p})" for n, p in list(pending.items())[:3])
                raise PassError(
                    f"onnxruntime's quantizer would never finish: {len(pending)} tensor(s) "
                    f"share the parameters of tensors that are not quantized: {stuck}; give "
                    "those tensors a calibration range (is their type known to shape "
                    "inference?) or keep their nodes in float with quantize: {exclude: [...]}"
                )
            for name in ready:
                resolved.add(name)
                del pending[name]
        original(self)

    QDQQuantizer._quantize_sharing_param_tensors = checked
    try:
        yield
    finally:
        QDQQuantizer._quantize_sharing_param_tensors = original


@contextlib.contextmanager
def _unique_copies() -> Iterator[None]:
    """onnxruntime's QDQ quantizer (1.31) copies a bias that several Convs share as `b0`,
    `b1`, ... after the largest number any *initializer* named `b<k>` has, not looking at
    the graph's other tensors: in tf2onnx graphs a Conv output is often named `b2` (basic
    pitch's CQT: 17 Convs share one bias), and the copy and that activation then share
    their quantized names, so the activation's readers get the bias ([TypeInferenceError]
    Invalid attribute perm {0, 2, 3, 1}, input shape = {36}). The copies are given names
    no tensor of the graph has."""
    from onnxruntime.quantization.qdq_quantizer import QDQQuantizer

    original = QDQQuantizer._dup_initializer

    def unique(self: Any, initializer: Any) -> Any:
        graph = self.model.graph()
        taken = {i for n in graph.node for i in (*n.input, *n.output)}
        taken |= {t.name for t in graph.initializer} | {v.name for v in graph.input}
        k = self.model.get_largest_initializer_name_suffix(initializer.name) + 1
        while f"{initializer.name}{k}" in taken:
            k += 1
        copy = type(initializer)()
        copy.CopyFrom(initializer)
        copy.name = f"{initializer.name}{k}"
        self.model.add_initializer(copy)
        return copy

    QDQQuantizer._dup_initializer = unique
    try:
        yield
    finally:
        QDQQuantizer._dup_initializer = original


def typed_overrides(overrides: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """Overrides with type names replaced by ORT QuantType values."""
    out = {}
    for tensor, entries in overrides.items():
        out[tensor] = [
            {k: (quant_type(v) if k == "quant_type" else v) for k, v in e.items()} for e in entries
        ]
    return out


def fixed_overrides(
    src: Path, overrides: dict[str, list[dict[str, Any]]], cfg: QuantConfig
) -> dict[str, Any]:
    """Generic path: ORT's fixer adds the converts a mixed-precision override needs."""
    from onnxruntime.quantization.execution_providers.qnn.mixed_precision_overrides_utils import (
        MixedPrecisionTensorQuantOverridesFixer,
    )
    from onnxruntime.quantization.tensor_quant_overrides import TensorQuantOverridesHelper

    from winml_recipes.onnx.io import load_model

    helper = TensorQuantOverridesHelper(typed_overrides(overrides))
    default = quant_type(cfg.activation_type)
    fixer = MixedPrecisionTensorQuantOverridesFixer.create_from_model(
        helper, load_model(src, load_external_data=False), default
    )
    fixer.apply(default, cfg.activation_symmetric)
    return helper.get_dict()


def quantize_dynamic_integer(src: Path, out: Path, cfg: QuantConfig, exclude: list[str]) -> None:
    from onnxruntime.quantization import quantize_dynamic

    with quiet_ort_logging():
        quantize_dynamic(
            _without_initializer_shapes(src),
            str(out),
            op_types_to_quantize=list(cfg.op_types) or None,
            per_channel=cfg.per_channel,
            reduce_range=cfg.reduce_range,
            weight_type=quant_type(cfg.weight_type),
            nodes_to_exclude=exclude or None,
            use_external_data_format=_large(src),
            extra_options={"WeightSymmetric": cfg.weight_symmetric},
        )
    adopt_sidecars(out)


def batched_weights(src: Path) -> list[str]:
    """Constant MatMul operands of rank 3 or more (a batch of matrices: SAM v1's relative
    position tables, [4, 16, 4]). Per channel, onnxruntime's quantizer gives them one scale
    per index of axis 1 (the reduction axis), and the CPU EP's QLinearMatMul, which its
    default optimization level fuses the QDQ MatMul into, refuses any 1-D per-axis zero point
    on such an operand at run time ("weight zero point must be a scalar, 1D tensor of size 1,
    or last to second dimension is 1"), whatever the axis: they are quantized per tensor."""
    from winml_recipes.onnx.io import load_model

    graph = load_model(src, load_external_data=False).graph
    ranks = {i.name: len(i.dims) for i in graph.initializer}
    readers: dict[str, set[str]] = {}
    for n in graph.node:
        for name in n.input:
            readers.setdefault(name, set()).add(n.op_type)
    # only MatMul reads them: a constant another op reads too stays as onnxruntime types it
    return sorted(t for t, ops in readers.items() if ranks.get(t, 0) >= 3 and ops == {"MatMul"})


def _gemm_bias_vectors(src: Path) -> tuple[str | onnx.ModelProto, list[dict[str, str]]]:
    """`src` with each Gemm's constant [1, N] C as the vector [N] (graph/gemm_bias.py: exact,
    and onnxruntime's quantizer takes a [1, N] C for a bias of N rows), and a record per C.
    Models over LARGE_MODEL_BYTES are handed over as they are: the rewrite would hold their
    weights."""
    from winml_recipes.onnx.io import load_model

    if _large(src) or not _has_row_bias(load_model(src, load_external_data=False).graph):
        return str(src), []
    # imported only here: onnx_ir and its dependencies would stay in memory through the
    # quantizer's peak (all-MiniLM-L6-v2's quantize step: +33 MB)
    import onnx_ir as ir

    from winml_recipes.graph.gemm_bias import GemmBiasAsVectorPass

    model = ir.from_proto(load_model(src))
    rewrite = GemmBiasAsVectorPass()
    rewrite(model)
    done = [
        {"node": gemm, "tensor": bias, "repair": "C [1, N] given to the quantizer as [N]",
         "why": "onnxruntime's quantizer takes a [1, N] Gemm bias for N rows (a ValueError "
                "in its int32-bias scale adjustment, or per-axis parameters on axis 0)"}
        for gemm, bias in rewrite.rewritten
    ]  # fmt: skip
    return ir.to_proto(model), done


def _has_row_bias(graph: onnx.GraphProto) -> bool:
    """Whether a Gemm in `graph` or its subgraphs reads a [1, N] initializer as C (the
    shapes alone: read here on the protobuf, which is freed at once; an onnx_ir model of it
    would hold the weights until the garbage collector breaks its reference cycles, and
    the quantizer's peak would carry them: all-MiniLM-L6-v2's quantize step +87 MB)."""
    dims = {t.name: list(t.dims) for t in graph.initializer}
    for node in graph.node:
        if (
            node.op_type == "Gemm"
            and len(node.input) > 2
            and len(dims.get(node.input[2], [])) == 2
            and dims[node.input[2]][0] == 1
        ):
            return True
        for attr in node.attribute:
            if any(
                _has_row_bias(g) for g in [*([attr.g] if attr.HasField("g") else []), *attr.graphs]
            ):
                return True
    return False  # fmt: skip


def _without_initializer_shapes(src: Path) -> str | onnx.ModelProto:
    """`src`, without value_info entries that repeat an initializer's shape (the dynamo
    exporter writes them). onnxruntime's dynamic quantizer re-infers shapes after it
    re-lays a per-channel Gemm weight, and such an entry then fails inference ("Inferred
    shape and existing shape differ in dimension 0: (320) vs (10)": EfficientNet's
    classifier). Initializers carry their own shapes, so nothing is lost."""
    from winml_recipes.onnx.io import load_model

    graph = load_model(src, load_external_data=False).graph
    initializers = {i.name for i in graph.initializer}
    if not any(v.name in initializers for v in graph.value_info):
        return str(src)
    model = load_model(src)
    kept = [v for v in model.graph.value_info if v.name not in initializers]
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept)
    return model


def quantizable_op_types() -> set[str]:
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    return set(QDQRegistry) | set(QLinearOpsRegistry)


def restore_float_inputs(model_path: Path, float_nodes: list[str]) -> int:
    """Make nodes kept in float read float tensors again; returns the inputs rewired.

    ORT's QDQ quantizer routes every reader of a quantized tensor through its
    DequantizeLinear (and the mixed-precision fixer may add a convert), so a node left out of
    quantization still sees the quantization error. Each such input is traced back through
    its DQ <- Q (<- DQ <- Q ...) chain to the float tensor; Q/DQ nodes left without readers
    are dropped.
    """
    from winml_recipes.onnx.io import load_model, save_model
    from winml_recipes.quant.validity import drop_unread_qdq

    if not float_nodes:
        return 0
    model = load_model(model_path)
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    wanted = set(float_nodes)
    rewired = 0
    for node in graph.node:
        if node.name not in wanted:
            continue
        for k, name in enumerate(node.input):
            source = name
            while (dq := producer.get(source)) is not None and dq.op_type == "DequantizeLinear":
                q = producer.get(dq.input[0])
                if q is None or q.op_type != "QuantizeLinear":
                    break
                source = q.input[0]
            if source != name:
                node.input[k] = source
                rewired += 1
    drop_unread_qdq(graph)
    save_model(model, model_path)
    return rewired
