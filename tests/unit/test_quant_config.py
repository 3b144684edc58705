"""The one quantization config: presets fill what the recipe leaves out; contradictions are
refused at plan time with a message that says what to change."""

from __future__ import annotations

import jsonschema
import pytest

from winml_recipes.presets import default_precision, devices, precisions
from winml_recipes.quant.config import (
    QUANTIZE_OPTIONS_SCHEMA,
    CalibrationConfig,
    QuantConfig,
    QuantizeOptions,
    resolve,
)
from winml_recipes.sdk.config import build_config
from winml_recipes.sdk.errors import PlanError
from winml_recipes.sdk.target import Target


def cfg(device: str, precision: str, **options) -> QuantConfig:
    return resolve(build_config(QuantizeOptions, options), Target(device, precision))


def refused(device: str, precision: str, **options) -> str:
    with pytest.raises(PlanError) as exc:
        cfg(device, precision, **options)
    assert exc.value.exit_code == 2
    text = str(exc.value)
    assert "\n" not in text
    return text


# --------------------------------------------------------------------------- presets


@pytest.mark.parametrize(
    ("precision", "activation", "weight"),
    [("uint8", "uint8", "uint8"), ("int8", "int8", "int8"), ("w8a16", "uint16", "uint8")],
)
@pytest.mark.parametrize("device", ["cpu", "npu", "gpu"])
def test_precision_sets_the_types(device, precision, activation, weight) -> None:
    c = cfg(device, precision)
    assert (c.activation_type, c.weight_type) == (activation, weight)


def test_npu_preset_is_static_qdq_with_its_eps_rules() -> None:
    c = cfg("npu", "uint8")
    assert (c.mode, c.format, c.ep_rules, c.per_channel) == ("static", "qdq", True, True)
    assert c.ep == "qnn-htp"
    assert c.calibration == CalibrationConfig()
    assert (c.calibration.method, c.calibration.samples, c.calibration.seed) == ("minmax", 16, 0)


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_cpu_and_gpu_presets_have_no_ep_rules(device) -> None:
    c = cfg(device, "int8")
    assert (c.mode, c.format, c.ep_rules, c.per_channel) == ("static", "qdq", False, True)


def test_device_default_precisions() -> None:
    assert default_precision("npu") == "w8a16"
    assert default_precision("cpu") == "int8"
    assert default_precision("gpu") == "fp16"


def test_weight_symmetry_follows_the_weight_type() -> None:
    assert cfg("cpu", "int8").weight_symmetric is True
    assert cfg("cpu", "uint8").weight_symmetric is False
    assert cfg("cpu", "uint8", weight_symmetric=True).weight_symmetric is True
    assert cfg("cpu", "int8", per_channel=False, weight_symmetric=False).weight_symmetric is False


def test_recipe_options_override_the_presets() -> None:
    c = cfg(
        "npu",
        "uint8",
        activation_type="uint16",
        per_channel=True,
        ep_rules=False,
        op_types=["MatMul"],
        exclude=["mm*"],
        calibration={"method": "entropy", "samples": 3, "seed": 7, "num_bins": 512},
    )
    assert (c.activation_type, c.weight_type, c.per_channel, c.ep_rules) == (
        "uint16",
        "uint8",
        True,
        False,
    )
    assert (c.op_types, c.exclude) == (("MatMul",), ("mm*",))
    assert c.calibration == CalibrationConfig(method="entropy", samples=3, seed=7, num_bins=512)


def test_dynamic_mode_has_no_calibration_and_uint8_activations() -> None:
    c = cfg("cpu", "int8", mode="dynamic")
    assert (c.mode, c.calibration, c.activation_type, c.weight_type) == (
        "dynamic",
        None,
        "uint8",
        "int8",
    )
    # Integer ops from dynamic mode are reported as the QOperator family.
    assert c.format == "qoperator"


def test_auto_mixed_precision_defaults_are_filled() -> None:
    c = cfg("npu", "uint8", mixed_precision={"auto": {"target_sqnr_db": 20}})
    assert c.auto == {
        "target_sqnr_db": 20,
        "max_promoted": 16,
        "type": "uint16",
        "samples": 4,
        # held-out data: none of its own (the verify step's, else after calibration's)
        "npz": None,
        "images": None,
        "dataset": None,
        "skip": 0,
    }
    assert c.regions == ()
    regions = [{"tensors": ["h*"], "type": "uint16"}, {"nodes": ["mm2"], "type": "float"}]
    c = cfg("npu", "uint8", mixed_precision=regions)
    assert c.regions == tuple(regions) and c.auto is None


def test_to_dict_is_plain_data() -> None:
    d = cfg("cpu", "int8", calibration={"npz": "data/*.npz"}).to_dict()
    assert d["calibration"]["npz"] == "data/*.npz"
    assert d["calibration"]["method"] == "minmax"
    assert d["activation_type"] == "int8"


# --------------------------------------------------------------------------- never a default


def test_unknown_precision_is_an_error() -> None:
    text = refused("cpu", "int4")
    assert (
        text == f"unknown precision 'int4' (did you mean 'int8'?); known: {', '.join(precisions())}"
    )


def test_unknown_device_is_an_error() -> None:
    text = refused("tpu", "uint8")
    assert text == f"unknown device 'tpu' (did you mean 'npu'?); known: {', '.join(devices())}"


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_float_precision_is_not_quantized(precision) -> None:
    assert refused("cpu", precision) == (
        f"precision {precision} is not an integer precision; quantize applies to uint8, int8, "
        "w8a16 (use the fp16 pass for fp16)"
    )


# --------------------------------------------------------------------------- contradictions

CONTRADICTIONS = [
    pytest.param(
        "npu",
        {"format": "qoperator", "ep_rules": True},
        "quantize: format qoperator cannot be used with ep_rules (qnn-htp needs QDQ); "
        "set format: qdq or ep_rules: false",
        id="qoperator-with-ep-rules",
    ),
    pytest.param(
        "cpu",
        {"mode": "dynamic", "calibration": {"samples": 4}},
        "quantize: calibration options do nothing in dynamic mode (ranges are computed at run "
        "time); remove calibration or use mode: static",
        id="calibration-in-dynamic-mode",
    ),
    pytest.param(
        "npu",
        {"mode": "dynamic"},
        "quantize: npu runs static QDQ models (qnn-htp); mode: dynamic writes integer ops it "
        "cannot run; use mode: static",
        id="dynamic-on-npu",
    ),
    pytest.param(
        "cpu",
        {"mode": "dynamic", "ep_rules": True},
        "quantize: the execution provider cpu has no quantization rules; remove ep_rules",
        id="ep-rules-without-rules",
    ),
    pytest.param(
        "cpu",
        {"mode": "dynamic", "format": "qdq"},
        "quantize: dynamic mode always writes integer ops (MatMulInteger/ConvInteger); "
        "remove format",
        id="format-in-dynamic-mode",
    ),
    pytest.param(
        "cpu",
        {"mode": "dynamic", "weight_type": "int16"},
        "quantize: dynamic mode supports uint8 and int8 weights, not int16; set weight_type: "
        "int8 or uint8",
        id="dynamic-16-bit-weights",
    ),
    pytest.param(
        "cpu",
        {"weight_symmetric": False},
        "quantize: onnxruntime quantizes per-channel weights symmetrically, so weight_symmetric: "
        "false does nothing; set per_channel: false or remove it",
        id="asymmetric-per-channel-weights",
    ),
    pytest.param(
        "cpu",
        {"format": "qoperator", "activation_type": "int8", "weight_type": "uint8"},
        "quantize: activation_type int8 with weight_type uint8 in format qoperator is not "
        "supported by onnxruntime (ONNXRuntime quantization doesn't support data "
        "format:activation_type=QuantType.QInt8, weight_type=QuantType.QUInt8); choose another "
        "combination",
        id="ort-unsupported-types",
    ),
    pytest.param(
        "cpu",
        {"mode": "dynamic", "mixed_precision": [{"tensors": ["h"], "type": "uint16"}]},
        "quantize: mixed_precision needs mode: static; remove mixed_precision or use mode: static",
        id="mixed-in-dynamic-mode",
    ),
    pytest.param(
        "cpu",
        {"mode": "dynamic", "activation_type": "int8"},
        "quantize: dynamic mode quantizes activations to uint8 at run time; remove activation_type",
        id="dynamic-int8-activations",
    ),
    pytest.param(
        "cpu",
        {"format": "qoperator", "activation_type": "uint16"},
        "quantize: uint16 activations need format: qdq; set format: qdq or an 8-bit "
        "activation_type",
        id="16-bit-qoperator",
    ),
    pytest.param(
        "cpu",
        {"format": "qoperator", "mixed_precision": [{"nodes": ["mm2"], "type": "float"}]},
        "quantize: mixed_precision needs format: qdq; set format: qdq or remove mixed_precision",
        id="mixed-with-qoperator",
    ),
    pytest.param(
        "cpu",
        {"calibration": {"percentile": 99.9}},
        "quantize.calibration: percentile is only used by method: percentile; set method: "
        "percentile or remove percentile",
        id="percentile-without-method",
    ),
    pytest.param(
        "cpu",
        {"calibration": {"method": "entropy", "percentile": 99.9}},
        "quantize.calibration: percentile is only used by method: percentile; set method: "
        "percentile or remove percentile",
        id="percentile-with-entropy",
    ),
    pytest.param(
        "cpu",
        {"calibration": {"num_bins": 512}},
        "quantize.calibration: num_bins is only used by the histogram methods; set method: "
        "entropy, percentile or distribution, or remove num_bins",
        id="num-bins-with-minmax",
    ),
    pytest.param(
        "cpu",
        {"calibration": {"npz": "a.npz", "inputs_from": "encoder"}},
        "quantize.calibration: npz and inputs_from are two data sources; keep one of them",
        id="two-calibration-sources",
    ),
    pytest.param(
        "cpu",
        {"calibration": {"images": "imgs", "npz": "a.npz"}},
        "quantize.calibration: npz and images are two data sources; keep one of them",
        id="npz-and-images",
    ),
]


@pytest.mark.parametrize(("device", "options", "message"), CONTRADICTIONS)
def test_contradiction_is_refused_with_what_to_change(device, options, message) -> None:
    assert refused(device, "uint8", **options) == message


def test_percentile_with_method_percentile_is_accepted() -> None:
    c = cfg("cpu", "uint8", calibration={"method": "percentile", "percentile": 99.0})
    assert (c.calibration.method, c.calibration.percentile) == ("percentile", 99.0)


def test_qoperator_is_accepted_without_ep_rules() -> None:
    c = cfg("cpu", "int8", format="qoperator")
    assert (c.format, c.ep_rules) == ("qoperator", False)


# --------------------------------------------------------------------------- schema


def _valid(options: dict) -> bool:
    try:
        jsonschema.validate(options, QUANTIZE_OPTIONS_SCHEMA)
    except jsonschema.ValidationError:
        return False
    return True


def test_schema_accepts_and_rejects() -> None:
    assert _valid({"mixed_precision": [{"tensors": ["a*"], "type": "uint16"}]})
    assert _valid({"mixed_precision": {"auto": {"target_sqnr_db": 20}}})
    # a region names tensors or nodes, not both, not neither
    assert not _valid({"mixed_precision": [{"tensors": ["a"], "nodes": ["b"], "type": "uint16"}]})
    assert not _valid({"mixed_precision": [{"type": "uint16"}]})
    assert not _valid({"mixed_precision": {"auto": {}}})
    assert not _valid({"calibration": {"method": "kl"}})
    assert not _valid({"calibration": {"samples": 0}})
    assert not _valid({"calibration": {"percentile": 40}})
    assert not _valid({"activation_type": "int4"})
    assert not _valid({"calibrate": {}})


@pytest.mark.parametrize("fmt", ["qdq", "qoperator"])
def test_type_rule_mirrors_onnxruntime(fmt: str) -> None:
    """Planning checks type combinations without importing onnxruntime; the mirror must
    say exactly what onnxruntime's own check says."""
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization.quantize import check_static_quant_arguments

    from winml_recipes.quant.config import QUANT_TYPES, static_combination_error
    from winml_recipes.quant.ort import quant_type

    for act in QUANT_TYPES:
        for weight in QUANT_TYPES:
            try:
                check_static_quant_arguments(
                    QuantFormat.QDQ if fmt == "qdq" else QuantFormat.QOperator,
                    quant_type(act),
                    quant_type(weight),
                )
                expected = None
            except ValueError as exc:
                expected = str(exc)
            assert static_combination_error(fmt, act, weight) == expected, (act, weight)


def test_planning_does_not_import_onnxruntime() -> None:
    import subprocess
    import sys

    from tests.conftest import RECIPES, REPO

    code = (
        "import sys\nfrom winml_recipes import api\n"
        f"api.plan({str(RECIPES / 'sam3-tiny.yaml')!r}, fetch=False, device='npu', "
        "precision='w8a16')\nprint('onnxruntime' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_auto_held_out_reads_skip_calibration_samples_only_from_calibration_files() -> None:
    """`mixed_precision: {auto}` on bundled speech stopped in quantize with "no input samples
    were produced": its held-out read skipped calibration's sample count, and the bundled
    held-out set (4 clips) is a set of its own. Measured after the fix on the tiny CTC model
    at cpu/int8: the search runs (85 s) and promotes the conv stack, logits 24.4 -> 33.6 dB."""
    from winml_recipes.passes.quantize import held_out_skip

    assert held_out_skip(False, {}, 16) == 0  # bundled or synthetic: their own held-out set
    assert held_out_skip(False, {"npz": "data/*.npz"}, 16) == 16  # after calibration's
    assert held_out_skip(True, {"npz": "data/*.npz"}, 16) == 0  # its own data
