"""The one quantization config: recipe options + precision and device presets -> QuantConfig.

Every contradiction is refused here, once, at plan time, with a message saying what to
change. Nothing else in the project builds a quantization configuration.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from winml_recipes.presets import device_settings, precision_settings
from winml_recipes.sdk.errors import PlanError
from winml_recipes.sdk.target import Target

QUANT_TYPES = ["uint8", "int8", "uint16", "int16"]
CALIBRATION_METHODS = ["minmax", "entropy", "percentile", "distribution"]

CALIBRATION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "description": "Static calibration. Data: synthetic from the catalog I/O contract unless "
    "one of npz, images or inputs_from is given.",
    "properties": {
        "method": {"enum": CALIBRATION_METHODS, "default": "minmax"},
        "samples": {"type": "integer", "minimum": 1, "maximum": 4096, "default": 16},
        "seed": {"type": "integer", "minimum": 0, "default": 0},
        "percentile": {"type": "number", "exclusiveMinimum": 50, "maximum": 100},
        "num_bins": {"type": "integer", "minimum": 128, "maximum": 65536},
        "npz": {
            "type": "string",
            "description": "A .npz file or a glob of them (relative to the recipe); one sample "
            "per file, or arrays with a leading sample axis.",
        },
        "images": {
            "type": "string",
            "description": "A folder of images, preprocessed as the catalog entry says.",
        },
        "samples_per_upstream": {
            "type": "integer",
            "minimum": 1,
            "maximum": 64,
            "default": 1,
            "description": "With inputs_from: how many samples share one upstream output (one "
            "image's embeddings with several prompts; an encoder forward is costly).",
        },
        "inputs_from": {
            "type": "string",
            "description": "Run this component's float model on its own calibration inputs and "
            "feed its outputs to the inputs of the same name here.",
        },
    },
}

MIXED_REGION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["type"],
    "properties": {
        "tensors": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "nodes": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "type": {"enum": [*QUANT_TYPES, "float"]},
    },
    "oneOf": [{"required": ["tensors"]}, {"required": ["nodes"]}],
}

MIXED_AUTO_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["auto"],
    "properties": {
        "auto": {
            "type": "object",
            "additionalProperties": False,
            "required": ["target_sqnr_db"],
            "properties": {
                "target_sqnr_db": {"type": "number"},
                "max_promoted": {"type": "integer", "minimum": 1, "default": 16},
                "type": {"enum": ["uint16", "int16"], "default": "uint16"},
                "samples": {"type": "integer", "minimum": 1, "maximum": 64, "default": 4},
            },
        }
    },
}

QUANTIZE_OPTIONS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "mode": {"enum": ["static", "dynamic"], "default": "static"},
        "format": {"enum": ["qdq", "qoperator"], "description": "Default: the device preset."},
        "activation_type": {"enum": QUANT_TYPES, "description": "Default: the precision."},
        "weight_type": {"enum": QUANT_TYPES, "description": "Default: the precision."},
        "per_channel": {"type": "boolean", "description": "Default: the device preset."},
        "activation_symmetric": {"type": "boolean", "description": "Default: false."},
        "weight_symmetric": {
            "type": "boolean",
            "description": "Default: true for signed weight types.",
        },
        "reduce_range": {"type": "boolean", "description": "Default: false."},
        "op_types": {
            "type": "array",
            "items": {"type": "string"},
            "description": "Op types to quantize (default: every type onnxruntime can).",
        },
        "exclude": {
            "type": "array",
            "items": {"type": "string"},
            "description": "Node-name globs left in float.",
        },
        "qnn": {
            "type": "boolean",
            "description": "Apply QNN execution-provider rules (get_qnn_qdq_config). "
            "Default: the device preset.",
        },
        "calibration": CALIBRATION_SCHEMA,
        "mixed_precision": {
            "description": "Regions kept at another precision, or {auto: {...}} to promote the "
            "most damaging activations to 16 bit until a target SQNR.",
            "anyOf": [
                {"type": "array", "items": MIXED_REGION_SCHEMA, "minItems": 1},
                MIXED_AUTO_SCHEMA,
            ],
        },
    },
}


@dataclass(frozen=True)
class CalibrationConfig:
    method: str = "minmax"
    samples: int = 16
    seed: int = 0
    percentile: float = 99.999
    num_bins: int = 2048
    npz: str | None = None
    images: str | None = None
    inputs_from: str | None = None
    samples_per_upstream: int = 1


@dataclass(frozen=True)
class QuantConfig:
    mode: str
    format: str
    activation_type: str
    weight_type: str
    per_channel: bool
    activation_symmetric: bool
    weight_symmetric: bool
    reduce_range: bool
    qnn: bool
    op_types: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    calibration: CalibrationConfig | None = field(default_factory=CalibrationConfig)
    regions: tuple[dict[str, Any], ...] = ()
    auto: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


def resolve(options: dict[str, Any], target: Target) -> QuantConfig:
    """Merge recipe options over the precision and device presets; refuse contradictions."""
    precision = precision_settings(target.precision)
    if precision["kind"] != "integer":
        raise PlanError(
            f"precision {target.precision} is not an integer precision; quantize applies to "
            "uint8, int8, w8a16 (use the fp16 pass for fp16)"
        )
    device = device_settings(target.device).get("quantize", {})
    mode = options.get("mode", "static")
    fmt = options.get("format", device.get("format", "qdq"))
    qnn_default = device.get("qnn", False) and mode == "static" and fmt == "qdq"
    qnn = options.get("qnn", qnn_default)
    weight_type = options.get("weight_type", precision["weight_type"])
    activation_type = options.get("activation_type", precision["activation_type"])
    calibration = options.get("calibration")
    if fmt == "qoperator" and qnn:
        raise PlanError(
            "quantize: format qoperator cannot be used with qnn (QNN needs QDQ); "
            "set format: qdq or qnn: false"
        )
    if mode == "dynamic":
        fmt, activation_type = _check_dynamic(options, target, device, precision)
    elif (
        "weight_symmetric" in options
        and not options["weight_symmetric"]
        and options.get("per_channel", device.get("per_channel", False))
    ):
        raise PlanError(
            "quantize: onnxruntime quantizes per-channel weights symmetrically, so "
            "weight_symmetric: false does nothing; set per_channel: false or remove it"
        )
    if activation_type in ("uint16", "int16") and fmt == "qoperator":
        raise PlanError(
            f"quantize: {activation_type} activations need format: qdq; set format: qdq "
            "or an 8-bit activation_type"
        )
    if fmt == "qoperator" and options.get("mixed_precision"):
        raise PlanError(
            "quantize: mixed_precision needs format: qdq; set format: qdq or remove mixed_precision"
        )
    mixed = options.get("mixed_precision")
    regions = tuple(mixed) if isinstance(mixed, list) else ()
    auto = dict(mixed["auto"]) if isinstance(mixed, dict) else None
    if auto is not None:
        auto.setdefault("max_promoted", 16)
        auto.setdefault("type", "uint16")
        auto.setdefault("samples", 4)
    cal = None
    if mode == "static":
        _check_ort_combination(fmt, activation_type, weight_type)
        c = dict(calibration or {})
        sources = [k for k in ("npz", "images", "inputs_from") if k in c]
        if len(sources) > 1:
            raise PlanError(
                f"quantize.calibration: {' and '.join(sources)} are two data sources; "
                "keep one of them"
            )
        if "percentile" in c and c.get("method", "minmax") != "percentile":
            raise PlanError(
                "quantize.calibration: percentile is only used by method: percentile; "
                "set method: percentile or remove percentile"
            )
        if "num_bins" in c and c.get("method", "minmax") == "minmax":
            raise PlanError(
                "quantize.calibration: num_bins is only used by the histogram "
                "methods; set method: entropy, percentile or distribution, or remove num_bins"
            )
        if c.get("samples_per_upstream", 1) != 1 and not c.get("inputs_from"):
            raise PlanError(
                "quantize.calibration: samples_per_upstream needs inputs_from; add "
                "inputs_from or remove samples_per_upstream"
            )
        cal = CalibrationConfig(**c)
    weight_symmetric = options.get("weight_symmetric", weight_type.startswith("int"))
    return QuantConfig(
        mode=mode,
        format=fmt,
        activation_type=activation_type,
        weight_type=weight_type,
        per_channel=options.get("per_channel", device.get("per_channel", False)),
        activation_symmetric=options.get("activation_symmetric", False),
        weight_symmetric=weight_symmetric,
        reduce_range=options.get("reduce_range", False),
        qnn=qnn,
        op_types=tuple(options.get("op_types", ())),
        exclude=tuple(options.get("exclude", ())),
        calibration=cal,
        regions=regions,
        auto=auto,
    )


def _check_dynamic(
    options: dict[str, Any],
    target: Target,
    device: dict[str, Any],
    precision: dict[str, Any],
) -> tuple[str, str]:
    """Dynamic mode: integer ops (MatMulInteger/ConvInteger) with run-time u8 activations."""
    if options.get("calibration") is not None:
        raise PlanError(
            "quantize: calibration options do nothing in dynamic mode (ranges are computed at "
            "run time); remove calibration or use mode: static"
        )
    if options.get("qnn"):
        raise PlanError(
            "quantize: qnn needs mode: static (QNN runs static QDQ models); set qnn: false or "
            "mode: static"
        )
    if device.get("qnn"):
        raise PlanError(
            f"quantize: {target.device} runs static QDQ models (QNN); mode: dynamic writes "
            "integer ops it cannot run; use mode: static"
        )
    if options.get("mixed_precision"):
        raise PlanError(
            "quantize: mixed_precision needs mode: static; remove mixed_precision or use "
            "mode: static"
        )
    if "format" in options:
        raise PlanError(
            "quantize: dynamic mode always writes integer ops (MatMulInteger/ConvInteger); "
            "remove format"
        )
    for option in ("activation_type", "activation_symmetric"):
        if option in options:
            raise PlanError(
                f"quantize: dynamic mode quantizes activations to uint8 at run time; "
                f"remove {option}"
            )
    if precision["activation_type"] != "uint8" and precision["activation_type"].endswith("16"):
        raise PlanError(
            f"quantize: precision {target.precision} asks for {precision['activation_type']} "
            "activations, but dynamic mode quantizes them to uint8; use mode: static, or "
            "precision uint8 or int8"
        )
    weight = options.get("weight_type", precision["weight_type"])
    if weight not in ("uint8", "int8"):
        raise PlanError(
            f"quantize: dynamic mode supports uint8 and int8 weights, not {weight}; "
            "set weight_type: int8 or uint8"
        )
    return "qoperator", "uint8"


def static_combination_error(fmt: str, activation_type: str, weight_type: str) -> str | None:
    """onnxruntime's rule for static quantization types (`check_static_quant_arguments`)
    over the types offered here: no int8 activations with uint8 weights, and 16-bit types
    need the QDQ format. Mirrored rather than called so planning does not import
    onnxruntime (0.1-0.2 s a process); tests/unit/test_quant_config.py checks the mirror
    against onnxruntime's own check for every combination."""
    if activation_type == "int8" and weight_type == "uint8":
        return (
            "ONNXRuntime quantization doesn't support data format:"
            "activation_type=QuantType.QInt8, weight_type=QuantType.QUInt8"
        )
    if fmt != "qdq" and (activation_type.endswith("16") or weight_type.endswith("16")):
        return "Only QuantFormat.QDQ supports 16-bit quantization types."
    return None


def _check_ort_combination(fmt: str, activation_type: str, weight_type: str) -> None:
    problem = static_combination_error(fmt, activation_type, weight_type)
    if problem is not None:
        raise PlanError(
            f"quantize: activation_type {activation_type} with weight_type {weight_type} "
            f"in format {fmt} is not supported by onnxruntime ({problem}); "
            "choose another combination"
        )
