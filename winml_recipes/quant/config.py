"""The one quantization config: recipe options + precision and device presets -> QuantConfig.

Every contradiction is refused here, once, at plan time, with a message saying what to
change. Nothing else in the project builds a quantization configuration.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Annotated, Any, ClassVar, Literal, get_args

from winml_recipes.presets import device_settings, precision_settings
from winml_recipes.sdk.config import Schema, config_schema, option
from winml_recipes.sdk.ep import ExecutionProvider, QuantRules, get_ep
from winml_recipes.sdk.errors import PlanError
from winml_recipes.sdk.held_to import HeldTo
from winml_recipes.sdk.target import Target

QuantType = Literal["uint8", "int8", "uint16", "int16"]
QUANT_TYPES = list(get_args(QuantType))
CalibrationMethod = Literal["minmax", "entropy", "percentile", "distribution"]
CALIBRATION_METHODS = list(get_args(CalibrationMethod))
Algorithm = Literal["cle", "smoothquant", "seqmse", "bias_correction"]


@dataclass(frozen=True)
class CalibrationConfig:
    """The calibration options: the one place their defaults are defined (the schema is
    generated from it; percentile and num_bins, unset, take the calibrator's own)."""

    schema_extra: ClassVar[dict[str, Any]] = {
        "description": "Static calibration. Data: synthetic from the catalog I/O contract "
        "unless one of npz, images, dataset or inputs_from is given."
    }

    method: CalibrationMethod = "minmax"
    samples: int = option(16, minimum=1, maximum=4096)
    seed: int = option(0, minimum=0)
    percentile: float | None = option(None, exclusiveMinimum=50, maximum=100)
    num_bins: int | None = option(None, minimum=128, maximum=65536)
    npz: str | None = option(
        None,
        "A .npz file or a glob of them (relative to the recipe); one sample per file, or "
        "arrays with a leading sample axis.",
    )
    images: str | None = option(None, "A folder of images, preprocessed as the catalog entry says.")
    dataset: str | None = option(
        None,
        "A Hugging Face `datasets` split saved with save_to_disk: a folder, relative to the recipe "
        "(`PATH:SPLIT` for a DatasetDict). A column per model input, by name; one sample per "
        "row. Read with pyarrow (pip install 'winml-recipes[datasets]').",
    )
    samples_per_upstream: int = option(
        1,
        "With inputs_from: how many samples share one upstream output (one image's "
        "embeddings with several prompts; an encoder forward is costly).",
        minimum=1,
        maximum=64,
    )
    inputs_from: str | None = option(
        None,
        "Run this component's float model on its own calibration inputs and feed its "
        "outputs to the inputs of the same name here.",
    )


@dataclass(frozen=True)
class MixedRegion:
    schema_extra: ClassVar[dict[str, Any]] = {
        "oneOf": [{"required": ["tensors"]}, {"required": ["nodes"]}]
    }

    type: Literal[QuantType, "float"]
    tensors: tuple[str, ...] | None = option(None, minItems=1)
    nodes: tuple[str, ...] | None = option(None, minItems=1)

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in vars(self).items() if v}


@dataclass(frozen=True)
class AutoPromotion:
    target_sqnr_db: float
    max_promoted: int = option(16, minimum=1)
    type: Literal["uint16", "int16"] = "uint16"
    samples: int = option(4, minimum=1, maximum=64)
    npz: str | None = option(
        None,
        "Held-out scoring data (.npz glob). Default: the verify step's data when it has any, "
        "else the calibration files' samples after the calibration ones.",
    )
    images: str | None = option(None, "Held-out scoring data: an image folder.")
    dataset: str | None = option(None, "Held-out scoring data: a saved `datasets` split.")
    skip: int = option(0, "With npz/images/dataset: leave out the first N samples.", minimum=0)


@dataclass(frozen=True)
class MixedAuto:
    auto: AutoPromotion


@dataclass(frozen=True)
class AlgorithmsAuto:
    """`algorithms: auto`: candidate combinations scored on held-out data on the target."""

    budget_seconds: float = option(600.0, "Stop trying candidates after this.", minimum=1)
    samples: int = option(8, "Held-out samples each candidate is scored on.", minimum=1,
                          maximum=64)  # fmt: skip
    npz: str | None = option(
        None, "Held-out scoring data (.npz glob). Default: the calibration files' samples "
        "after the calibration ones (build --onnx: its --eval-data)."
    )  # fmt: skip
    images: str | None = option(None, "Held-out scoring data: an image folder.")
    dataset: str | None = option(None, "Held-out scoring data: a saved `datasets` split.")


@dataclass(frozen=True)
class HeldOutData:
    """Where `mode: auto` scores the static model (one of them)."""

    npz: str | None = option(None, "Held-out scoring data (.npz glob).")
    images: str | None = option(None, "Held-out scoring data: an image folder.")
    dataset: str | None = option(None, "Held-out scoring data: a saved `datasets` split.")


@dataclass(frozen=True)
class QuantizeOptions:
    """The quantize step's options; unset ones come from the precision and device presets."""

    mode: Literal["static", "dynamic", "auto"] = option(
        "static",
        "static: calibrated ranges (QDQ). dynamic: onnxruntime's run-time activation ranges "
        "(MatMulInteger/ConvInteger; CPU EPs). auto (CPU EPs): static, unless it misses the "
        "verify step's gates (held_to) on held-out samples and a dynamic candidate holds them.",
    )
    format: Literal["qdq", "qoperator"] | None = option(None, "Default: the device preset.")
    activation_type: QuantType | None = option(None, "Default: the precision.")
    weight_type: QuantType | None = option(None, "Default: the precision.")
    per_channel: bool | None = option(None, "Default: the device preset.")
    activation_symmetric: bool | None = option(None, "Default: false.")
    weight_symmetric: bool | None = option(None, "Default: true for signed weight types.")
    reduce_range: bool | None = option(None, "Default: false.")
    op_types: tuple[str, ...] | None = option(
        None, "Op types to quantize (default: every type onnxruntime can)."
    )
    exclude: tuple[str, ...] | None = option(None, "Node-name globs left in float.")
    ep_rules: bool | None = option(
        None,
        "Apply the target execution provider's quantization rules (its plugin's: types, "
        "shared encodings, op constraints). Default: true for static QDQ when the EP has rules.",
    )
    calibration: CalibrationConfig | None = None
    held_out: HeldOutData | None = option(
        None,
        "mode auto: the data the static model is scored on. Default: the calibration "
        "files' samples after the calibration ones, else the bundled held-out photos or "
        "speech (build --onnx: its --eval-data).",
    )
    held_to: HeldTo | None = option(
        None,
        "mode auto: the gates each candidate must hold (verify's option names). Default: "
        "the verify step's after it (its thresholds, per-output ones and task gates), filled "
        "in when planning.",
    )
    algorithms: (
        Annotated[tuple[Algorithm, ...], Schema(uniqueItems=True)]
        | Literal["auto"]
        | AlgorithmsAuto
        | None
    ) = option(
        None,
        "Post-training algorithms beyond min/max ranges, any of cle (cross-layer "
        "equalization), smoothquant, seqmse (weight ranges by layer output error), "
        "bias_correction; or auto (or {budget_seconds, samples}) to keep the combination "
        "that scores best on held-out data on the target.",
    )
    mixed_precision: Annotated[tuple[MixedRegion, ...], Schema(minItems=1)] | MixedAuto | None = (
        option(
            None,
            "Regions kept at another precision, or {auto: {...}} to promote the most damaging "
            "activations to 16 bit until a target SQNR.",
        )
    )
    repair_divergence: bool = option(
        True,
        "On an NPU target: run the quantized model on the target's EP and on the CPU "
        "simulation; where the target departs, find the first departing layer and quantize "
        "it another way (shared encoding, 16-bit activations, float), recorded in the "
        "manifest. false: keep the model as quantized.",
    )


QUANTIZE_OPTIONS_SCHEMA: dict[str, Any] = config_schema(QuantizeOptions)


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
    ep_rules: bool  # the EP's QuantRules apply (quant_rules(cfg) gives them)
    ep: str = "cpu"  # the target's execution provider (key)
    op_types: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    calibration: CalibrationConfig | None = field(default_factory=CalibrationConfig)
    regions: tuple[dict[str, Any], ...] = ()
    auto: dict[str, Any] | None = None
    algorithms: tuple[str, ...] = ()  # applied as given
    algorithms_auto: dict[str, Any] | None = None  # `auto`: chosen by score
    held_out: dict[str, str] | None = None  # mode auto's scoring data (None: the default)
    # mode auto's gates (HeldTo options; None: the task metric's default gates)
    held_to: dict[str, Any] | None = None
    repair_divergence: bool = True  # where the target departs from the simulation

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


def resolve(options: QuantizeOptions, target: Target) -> QuantConfig:
    """Merge recipe options over the precision and device presets; refuse contradictions."""
    precision = precision_settings(target.precision)
    if precision["kind"] != "integer":
        raise PlanError(
            f"precision {target.precision} is not an integer precision; quantize applies to "
            "uint8, int8, w8a16 (use the fp16 pass for fp16)"
        )
    device = device_settings(target.device).get("quantize", {})
    ep = target_ep(target)
    rules = ep.quant_rules
    o = options
    mode = o.mode
    if mode == "auto" and not ep.is_cpu:
        raise PlanError(
            f"quantize: mode auto may choose dynamic quantization, which only the CPU EP runs "
            f"here ({target.device} builds for {ep.key}); use mode: static"
        )
    calibrated = mode in ("static", "auto")  # auto quantizes statically first
    fmt = _given(o.format, device.get("format", "qdq"))
    ep_rules = _given(o.ep_rules, rules is not None and calibrated and fmt == "qdq")
    if ep_rules and rules is None:
        raise PlanError(
            f"quantize: the execution provider {ep.key} has no quantization rules; remove ep_rules"
        )
    # what the EP's rules want where the recipe says nothing (the precision's types next)
    wants = dict(rules.defaults) if ep_rules and rules is not None else {}
    weight_type = _given(o.weight_type, wants.get("weight_type", precision["weight_type"]))
    activation_type = _given(
        o.activation_type, wants.get("activation_type", precision["activation_type"])
    )
    per_channel = _given(o.per_channel, wants.get("per_channel", device.get("per_channel", False)))
    if fmt == "qoperator" and ep_rules:
        assert rules is not None
        raise PlanError(
            f"quantize: format qoperator cannot be used with ep_rules ({ep.key} needs QDQ); "
            "set format: qdq or ep_rules: false"
        )
    if mode == "dynamic":
        fmt, activation_type = _check_dynamic(o, target, precision, ep)
    elif o.weight_symmetric is False and per_channel:
        raise PlanError(
            "quantize: onnxruntime quantizes per-channel weights symmetrically, so "
            "weight_symmetric: false does nothing; set per_channel: false or remove it"
        )
    if activation_type in ("uint16", "int16") and fmt == "qoperator":
        raise PlanError(
            f"quantize: {activation_type} activations need format: qdq; set format: qdq "
            "or an 8-bit activation_type"
        )
    if fmt == "qoperator" and o.mixed_precision:
        raise PlanError(
            "quantize: mixed_precision needs format: qdq; set format: qdq or remove mixed_precision"
        )
    mixed = o.mixed_precision
    regions = tuple(r.to_dict() for r in mixed) if isinstance(mixed, tuple) else ()
    auto = asdict(mixed.auto) if isinstance(mixed, MixedAuto) else None
    cal = None
    if calibrated:
        _check_ort_combination(fmt, activation_type, weight_type)
        c = o.calibration or CalibrationConfig()
        sources = [
            k for k in ("npz", "images", "dataset", "inputs_from") if getattr(c, k) is not None
        ]
        if len(sources) > 1:
            raise PlanError(
                f"quantize.calibration: {' and '.join(sources)} are two data sources; "
                "keep one of them"
            )
        if c.percentile is not None and c.method != "percentile":
            raise PlanError(
                "quantize.calibration: percentile is only used by method: percentile; "
                "set method: percentile or remove percentile"
            )
        if c.num_bins is not None and c.method == "minmax":
            raise PlanError(
                "quantize.calibration: num_bins is only used by the histogram "
                "methods; set method: entropy, percentile or distribution, or remove num_bins"
            )
        if c.samples_per_upstream != 1 and not c.inputs_from:
            raise PlanError(
                "quantize.calibration: samples_per_upstream needs inputs_from; add "
                "inputs_from or remove samples_per_upstream"
            )
        cal = c
    weight_symmetric = _given(
        o.weight_symmetric, wants.get("weight_symmetric", weight_type.startswith("int"))
    )
    if o.held_out is not None and mode != "auto":
        raise PlanError(
            "quantize: held_out is the data mode auto scores on; set mode: auto or remove held_out"
        )
    if o.held_to is not None and mode != "auto":
        raise PlanError(
            "quantize: held_to is what mode auto holds its candidates to; set mode: auto or "
            "remove held_to"
        )
    held = [k for k, v in asdict(o.held_out).items() if v] if o.held_out is not None else []
    if len(held) > 1:
        raise PlanError(
            f"quantize.held_out: {' and '.join(held)} are two data sources; keep one of them"
        )
    cfg = QuantConfig(
        mode=mode,
        format=fmt,
        activation_type=activation_type,
        weight_type=weight_type,
        per_channel=per_channel,
        weight_symmetric=weight_symmetric,
        activation_symmetric=_given(
            o.activation_symmetric, wants.get("activation_symmetric", False)
        ),
        reduce_range=_given(o.reduce_range, False),
        ep_rules=ep_rules,
        ep=ep.key,
        op_types=o.op_types or (),
        exclude=o.exclude or (),
        calibration=cal,
        regions=regions,
        auto=auto,
        repair_divergence=o.repair_divergence,
        held_out={k: v for k, v in asdict(o.held_out).items() if v} if o.held_out else None,
        held_to=_held_to(o.held_to),
        **_algorithms(o, mode),
    )
    problem = rules.check(cfg) if ep_rules and rules is not None else None
    if problem is not None:
        raise PlanError(f"quantize: {problem}; change it or set ep_rules: false")
    return cfg


def _held_to(held: HeldTo | None) -> dict[str, Any] | None:
    """HeldTo as plain options (what sdk.held_to.judged reads), unset fields left out."""
    if held is None:
        return None
    out = {k: v for k, v in asdict(held).items() if v is not None}
    if held.outputs:
        out["outputs"] = {
            name: {k: v for k, v in asdict(t).items() if v is not None}
            for name, t in held.outputs.items()
        }
    if held.task is not None:
        out["task"] = dict(held.task)
    return out


def _algorithms(options: QuantizeOptions, mode: str) -> dict[str, Any]:
    chosen = options.algorithms
    if not chosen:  # None, or [] (auto off, as the presets document)
        return {}
    if mode == "dynamic":
        raise PlanError(
            "quantize: algorithms need calibration data (mode: static); remove algorithms "
            "or use mode: static"
        )
    if chosen == "auto":
        return {"algorithms_auto": asdict(AlgorithmsAuto())}
    if isinstance(chosen, AlgorithmsAuto):
        return {"algorithms_auto": asdict(chosen)}
    order = ("cle", "smoothquant", "seqmse", "bias_correction")  # the order they run in
    return {"algorithms": tuple(a for a in order if a in chosen)}


def target_ep(target: Target) -> ExecutionProvider:
    """The execution provider a target builds for (its own, else its device's preset)."""
    key = target.execution_provider or str(
        device_settings(target.device).get("execution_provider", "cpu")
    )
    return get_ep(key)


def quant_rules(cfg: QuantConfig) -> QuantRules | None:
    """The EP's quantization rules when the config applies them."""
    return get_ep(cfg.ep).quant_rules if cfg.ep_rules else None


def _given(value: Any, default: Any) -> Any:
    """An option the recipe set (not None), else the preset's value."""
    return default if value is None else value


def _check_dynamic(
    options: QuantizeOptions,
    target: Target,
    precision: dict[str, Any],
    ep: ExecutionProvider,
) -> tuple[str, str]:
    """Dynamic mode: integer ops (MatMulInteger/ConvInteger) with run-time u8 activations."""
    if options.calibration is not None:
        raise PlanError(
            "quantize: calibration options do nothing in dynamic mode (ranges are computed at "
            "run time); remove calibration or use mode: static"
        )
    if options.ep_rules:
        raise PlanError(
            f"quantize: ep_rules needs mode: static (the {ep.key} rules are for static QDQ "
            "models); set ep_rules: false or mode: static"
        )
    if ep.quant_rules is not None and ep.quant_rules.requires_static_qdq:
        raise PlanError(
            f"quantize: {target.device} runs static QDQ models ({ep.key}); mode: dynamic "
            "writes integer ops it cannot run; use mode: static"
        )
    if options.mixed_precision:
        raise PlanError(
            "quantize: mixed_precision needs mode: static; remove mixed_precision or use "
            "mode: static"
        )
    if options.format is not None:
        raise PlanError(
            "quantize: dynamic mode always writes integer ops (MatMulInteger/ConvInteger); "
            "remove format"
        )
    for name in ("activation_type", "activation_symmetric"):
        if getattr(options, name) is not None:
            raise PlanError(
                f"quantize: dynamic mode quantizes activations to uint8 at run time; remove {name}"
            )
    if precision["activation_type"] != "uint8" and precision["activation_type"].endswith("16"):
        raise PlanError(
            f"quantize: precision {target.precision} asks for {precision['activation_type']} "
            "activations, but dynamic mode quantizes them to uint8; use mode: static, or "
            "precision uint8 or int8"
        )
    weight = _given(options.weight_type, precision["weight_type"])
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
