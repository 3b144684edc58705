"""The pass SDK: config dataclass -> JSON Schema, options -> config, and the constraints a
pass declares, enforced by the planner for a pass it has never heard of."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import jsonschema
import pytest

from tests.conftest import make_mlp_project
from winml_recipes import api
from winml_recipes.sdk import Pass, PlanError, StepResult, model_file
from winml_recipes.sdk import passes as registry
from winml_recipes.sdk.config import Schema, build_config, config_schema, option


@dataclass(frozen=True)
class Window:
    size: int = option(4, "Samples per window.", minimum=1, maximum=64)
    kind: Literal["hann", "box"] = "hann"


@dataclass(frozen=True)
class ToyConfig:
    level: int  # no default: required
    scale: float = option(1.0, exclusiveMinimum=0)
    mode: Literal["fast", "exact"] = option("fast", "How hard to try.")
    label: str | None = option(None, "Shown in the manifest.")
    tags: tuple[str, ...] | None = option(None, minItems=1)
    dims: Mapping[str, Annotated[int, Schema(minimum=1)]] | None = None
    window: Window | None = None
    plan: tuple[Window, ...] | Window | None = None


def test_schema_has_types_defaults_enums_bounds_and_descriptions() -> None:
    s = config_schema(ToyConfig)
    assert s["type"] == "object" and s["additionalProperties"] is False
    assert s["required"] == ["level"]
    p = s["properties"]
    assert p["level"] == {"type": "integer"}
    assert p["scale"] == {"type": "number", "exclusiveMinimum": 0, "default": 1.0}
    assert p["mode"] == {
        "enum": ["fast", "exact"],
        "description": "How hard to try.",
        "default": "fast",
    }
    # Optional (None) fields have no default and do not accept null: absent means unset.
    assert p["label"] == {"type": "string", "description": "Shown in the manifest."}
    assert p["tags"] == {"type": "array", "items": {"type": "string"}, "minItems": 1}
    assert p["dims"] == {
        "type": "object",
        "additionalProperties": {"type": "integer", "minimum": 1},
    }
    window = p["window"]
    assert window["additionalProperties"] is False and "required" not in window
    assert window["properties"]["size"] == {
        "type": "integer",
        "minimum": 1,
        "maximum": 64,
        "description": "Samples per window.",
        "default": 4,
    }
    assert [b.get("type") for b in p["plan"]["anyOf"]] == ["array", "object"]


def _valid(options: dict) -> bool:
    try:
        jsonschema.validate(options, config_schema(ToyConfig))
    except jsonschema.ValidationError:
        return False
    return True


@pytest.mark.parametrize(
    ("options", "ok"),
    [
        ({"level": 1}, True),
        ({}, False),  # required
        ({"level": 1, "bogus": 2}, False),  # unknown keys refused
        ({"level": 1, "window": {"size": 2, "bogus": 1}}, False),  # ... in nested objects too
        ({"level": 1, "mode": "slow"}, False),  # enum
        ({"level": 1, "scale": 0}, False),  # exclusive bound
        ({"level": 1, "window": {"size": 65}}, False),  # nested bound
        ({"level": 1, "label": None}, False),  # null is not "unset"
        ({"level": 1, "tags": []}, False),
        ({"level": 1, "dims": {"batch": 0}}, False),
        ({"level": 1, "dims": {"batch": 2}, "plan": [{"size": 2}], "tags": ["a"]}, True),
        ({"level": True}, False),  # a bool is not an integer
    ],
)
def test_schema_accepts_and_refuses(options: dict, ok: bool) -> None:
    assert _valid(options) is ok


def test_build_config_converts_nested_values() -> None:
    cfg = build_config(
        ToyConfig,
        {
            "level": 2,
            "scale": 3,
            "tags": ["a", "b"],
            "window": {"size": 8},
            "plan": {"kind": "box"},
        },
    )
    assert cfg == ToyConfig(
        level=2, scale=3.0, tags=("a", "b"), window=Window(size=8), plan=Window(kind="box")
    )
    assert cfg.scale == 3 and isinstance(cfg.scale, int)  # as written: 3, not 3.0, in messages
    assert build_config(ToyConfig, {"level": 1, "plan": [{"size": 2}]}).plan == (Window(2),)
    assert build_config(ToyConfig, {"level": 1}).window is None


def test_build_config_refuses_unknown_keys_naming_them() -> None:
    with pytest.raises(
        PlanError, match=r"toy\.window: unknown option\(s\) sizes; known: kind, size"
    ):
        build_config(ToyConfig, {"level": 1, "window": {"sizes": 2}}, "toy")


def test_mutable_defaults_and_bare_none_defaults_are_refused() -> None:
    with pytest.raises(TypeError, match="mutable"):
        option([])

    @dataclass(frozen=True)
    class Bad:
        x: int = None  # type: ignore[assignment]

    with pytest.raises(TypeError, match=r"T \| None"):
        config_schema(Bad)


# ------------------------------------------------------------ a third-party pass, planned


@dataclass(frozen=True)
class StampConfig:
    note: str = option("hello", "Written into the metrics.", minLength=1)
    copies: int = option(1, minimum=1, maximum=3)


class StampPass(Pass[StampConfig]):
    """Defined here like a plugin would be, from the SDK alone (registered by the fixture)."""

    name = "test_stamp"
    summary = "test pass: copies the model, reports its config"
    target_dependent = False
    once_per_component = True
    needs_float_input = True
    seen: list[StampConfig] = []

    def run(self, src, out_dir: Path, config: StampConfig, ctx) -> StepResult:
        StampPass.seen.append(config)
        out = model_file(out_dir)
        out.write_bytes(Path(src).read_bytes())
        return StepResult(out, {"note": config.note * config.copies})


@pytest.fixture
def stamp_registered(monkeypatch):
    registry.all_passes()  # load the entry points first
    monkeypatch.setitem(registry._REGISTRY, StampPass.name, StampPass)
    StampPass.seen.clear()
    return StampPass


def test_a_third_party_config_is_generated_validated_and_received(stamp_registered, tmp_path):
    from winml_recipes.schemas import recipe_schema

    defs = recipe_schema()["$defs"]
    assert defs["options.test_stamp"]["properties"]["copies"]["maximum"] == 3
    recipe = make_mlp_project(tmp_path, steps="[{test_stamp: {copies: 2}}]")
    plan = api.plan(recipe, device="cpu", precision="fp32")
    step = plan.components[0].steps[0]
    assert step.options == {"note": "hello", "copies": 2}  # the manifest's options: defaults in
    assert step.config == StampConfig(copies=2)
    result = api.build(recipe, device="cpu", precision="fp32", output_root=tmp_path / "b")
    assert StampPass.seen == [StampConfig(copies=2)]
    (component,) = result.manifest["components"].values()
    record = component["steps"][0]
    assert record["metrics"] == {"note": "hellohello"}
    bad = make_mlp_project(tmp_path / "bad", steps="[{test_stamp: {copies: 4}}]")
    with pytest.raises(Exception, match=r"mlp\.yaml:\d+.*copies.*4 is greater than the maximum"):
        api.plan(bad, device="cpu", precision="fp32")


def test_declared_constraints_are_enforced_for_any_pass(stamp_registered, tmp_path):
    twice = make_mlp_project(tmp_path / "twice", steps="[test_stamp, test_stamp]")
    with pytest.raises(PlanError, match=r"mlp\.yaml:\d+: model: two test_stamp steps; keep one"):
        api.plan(twice, device="cpu", precision="fp32")
    # needs_float_input: refused on a quantized model (a quantize step first makes one).
    quantized = _int8(make_mlp_project(tmp_path / "q", steps="[quantize, test_stamp]"))
    with pytest.raises(PlanError, match="test_stamp on an already-quantized model"):
        api.plan(quantized, device="cpu", precision="int8")
    float_first = _int8(make_mlp_project(tmp_path / "f", steps="[test_stamp, quantize]"))
    plan = api.plan(float_first, device="cpu", precision="int8")
    assert [s.name for s in plan.components[0].steps] == ["test_stamp", "quantize"]


def _int8(recipe: Path) -> Path:
    text = recipe.read_text().replace(
        "{device: cpu, precision: fp32}", "{device: cpu, precision: int8}"
    )
    recipe.write_text(text)
    return recipe


# ------------------------------------------------------------ declared capabilities


@dataclass(frozen=True)
class DataOptions:
    npz: str | None = None
    samples: int = 8


@dataclass(frozen=True)
class MeasureConfig:
    data: DataOptions | None = None


class MeasurePass(Pass[MeasureConfig]):
    name = "test_measure"
    sample_inputs = "data"
    makes = frozenset({"float"})

    def run(self, src, out_dir, config, ctx) -> StepResult:
        return StepResult(None)


def test_sample_inputs_are_read_from_the_declared_field() -> None:
    from winml_recipes.sdk.passes import sample_inputs_of

    measure = MeasurePass()
    given = MeasureConfig(DataOptions(npz="x/*.npz"))
    assert sample_inputs_of(measure, given) == {"npz": "x/*.npz", "samples": 8}
    assert sample_inputs_of(measure, MeasureConfig()) == {}  # runs on seeded inputs
    assert sample_inputs_of(StampPass(), StampConfig()) is None  # declares none
    quantize = registry.get_pass("quantize")
    options = {"calibration": {"npz": "a.npz"}}
    assert sample_inputs_of(quantize, quantize.make_config(options)) == {
        "method": "minmax",
        "samples": 16,
        "seed": 0,
        "npz": "a.npz",
        "samples_per_upstream": 1,
    }


def test_hints_name_the_pass_that_declares_what_is_missing(monkeypatch) -> None:
    from winml_recipes.sdk.passes import pass_making

    assert pass_making("float") == "dequantize"
    assert pass_making("onnx") == "export"
    monkeypatch.delitem(registry._REGISTRY, "dequantize")
    monkeypatch.setitem(registry._REGISTRY, MeasurePass.name, MeasurePass)
    assert pass_making("float") == "test_measure"


def test_a_subclass_of_a_configured_pass_keeps_its_config_and_schema() -> None:
    class LouderStamp(StampPass):
        name = "test_louder_stamp"

    assert LouderStamp.config_type is StampConfig
    assert LouderStamp.options_schema == config_schema(StampConfig)
    assert LouderStamp().make_config({"copies": 3}) == StampConfig(copies=3)


def _npu_w8a16(recipe: Path) -> Path:
    recipe.write_text(recipe.read_text().replace("precision: fp32}", "precision: w8a16}"))
    return recipe


def test_a_step_list_that_loses_the_eps_float_rewrites_is_told(tmp_path):
    """Quantizing for an EP with float rewrites (QNN HTP's) without `prepare` before it:
    the plan says so (they are not applied otherwise); listing prepare, even with no
    stages, or a target whose EP has none, says nothing."""
    lost = _npu_w8a16(make_mlp_project(tmp_path / "lost", steps="[fix_shapes, quantize]"))
    (note,) = api.plan(lost, device="npu", precision="w8a16").notes
    assert "no 'prepare' step before 'quantize'" in note and "qnn" in note
    for name, steps in {
        "listed": "[fix_shapes, prepare, quantize]",
        "said": "[fix_shapes, {prepare: {stages: []}}, quantize]",
    }.items():
        recipe = _npu_w8a16(make_mlp_project(tmp_path / name, steps=steps))
        assert api.plan(recipe, device="npu", precision="w8a16").notes == ()
    cpu = _int8(make_mlp_project(tmp_path / "cpu", steps="[quantize]"))
    assert api.plan(cpu, device="cpu", precision="int8").notes == ()
