"""Recipes: sandboxed rendering, -D variables, partials, YAML/schema errors, targets, presets."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from tests.conftest import CATALOG, PARTIALS, RECIPES, known_names
from winml_recipes.catalog import entry_names
from winml_recipes.presets import default_steps, precisions, resolve_target
from winml_recipes.recipe import (
    Step,
    load_recipe,
    parse_defines,
    used_variables,
)
from winml_recipes.sdk.errors import PlanError, RecipeError, WinmlError
from winml_recipes.sdk.target import Target

CATALOG_TEXT = """\
schema_version: 1
name: tiny
task: feature-extraction
license: mit
components:
  encoder:
    source: {ref: ./model.onnx}
    dims: {batch: 2}
    inputs:
      x: {dtype: float32, shape: [batch, 4]}
    outputs:
      y: {shape: [batch, 3]}
  decoder:
    source: {ref: ./model.onnx}
    dims: {batch: 1}
    inputs:
      x: {dtype: float32, shape: [batch, 4]}
    outputs:
      y: {shape: [batch, 3]}
"""

PASSES, DEVICES, PRECISIONS = known_names()

HEAD = """\
schema_version: 1
name: r
model: tiny
targets:
  - {device: cpu, precision: fp32}
  - {device: npu, precision: fp32}
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "catalog").mkdir()
    (tmp_path / "catalog" / "tiny.yaml").write_text(CATALOG_TEXT)
    (tmp_path / "recipes" / "_partials").mkdir(parents=True)
    return tmp_path


def write(project: Path, text: str, name: str = "r") -> Path:
    path = project / "recipes" / f"{name}.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def error(path: Path, **kwargs) -> str:
    """The one-line error of loading `path` (never a traceback, never two lines)."""
    with pytest.raises(WinmlError) as exc:
        load_recipe(path, **kwargs)
    text = str(exc.value)
    assert "\n" not in text
    assert exc.value.exit_code == 2
    return text


# --- good paths -------------------------------------------------------------------------


@pytest.mark.parametrize("recipe", sorted(RECIPES.glob("*.yaml")), ids=lambda p: p.name)
def test_repo_recipes_load_for_each_target(recipe: Path) -> None:
    first = load_recipe(recipe)
    assert first.target == first.targets[0]
    for target in first.targets:
        r = load_recipe(
            recipe, device=target.device, precision=target.precision, ep=target.ep or None
        )
        assert r.target == target
        assert r.variables["device"] == target.device
        assert list(r.components) == list(r.catalog.components)
        assert all(steps for steps in r.components.values())


@pytest.mark.parametrize("recipe", sorted(RECIPES.glob("*.yaml")), ids=lambda p: p.name)
def test_recipes_carry_schema_comment(recipe: Path) -> None:
    first = recipe.read_text().splitlines()[0]
    assert first == "# yaml-language-server: $schema=../schemas/recipe.schema.json"
    assert (recipe.parent / "../schemas/recipe.schema.json").resolve().is_file()


@pytest.mark.parametrize("entry", sorted(CATALOG.glob("*.yaml")), ids=lambda p: p.name)
def test_catalog_entries_carry_schema_comment(entry: Path) -> None:
    first = entry.read_text().splitlines()[0]
    assert first == "# yaml-language-server: $schema=../schemas/catalog.schema.json"


def test_defines_reach_the_template(project: Path) -> None:
    path = write(
        project,
        HEAD + "seed: {{ seed }}\n"
        "description: '{{ label }} {{ fast | string }}'\n"
        "steps:\n"
        "  - normalize\n"
        "  - verify: {samples: {{ samples }}, min_sqnr_db: {{ sqnr }}}\n",
    )
    defines = parse_defines(["seed=7", "label=hello world", "fast=true", "samples=3", "sqnr=12.5"])
    assert defines == {
        "seed": 7,
        "label": "hello world",
        "fast": True,
        "samples": 3,
        "sqnr": 12.5,
    }
    r = load_recipe(path, defines=defines)
    assert r.seed == 7
    assert "description: 'hello world True'" in r.rendered
    assert r.components["encoder"][1] == Step("verify", {"samples": 3, "min_sqnr_db": 12.5}, 11)
    assert r.variables["samples"] == 3


def test_device_and_precision_are_template_variables(project: Path) -> None:
    path = write(
        project,
        HEAD + "steps:\n  - normalize\n{% if device == 'npu' %}  - fix_shapes\n{% endif %}"
        "  - verify: {min_sqnr_db: {{ 10 if precision == 'fp32' else 1 }}}\n",
    )
    assert [s.name for s in load_recipe(path).components["encoder"]] == ["normalize", "verify"]
    npu = load_recipe(path, device="npu")
    assert [s.name for s in npu.components["encoder"]] == ["normalize", "fix_shapes", "verify"]
    assert npu.components["decoder"][-1].options == {"min_sqnr_db": 10}


def test_catalog_is_a_template_variable(project: Path) -> None:
    path = write(
        project,
        HEAD + "description: '{{ catalog.name }}: {{ catalog.components | list | join(\",\") }}'\n",
    )
    assert "description: 'tiny: encoder,decoder'" in load_recipe(path).rendered


def test_includes_from_partials(project: Path) -> None:
    partials = project / "recipes" / "_partials"
    (partials / "steps.yaml").write_text("  - normalize\n{% include 'verify.yaml' %}")
    (partials / "verify.yaml").write_text("  - verify: {samples: {{ n }}}\n")
    path = write(project, HEAD + "steps:\n{% include 'steps.yaml' %}")
    r = load_recipe(path, defines={"n": 5})
    assert [(s.name, s.options) for s in r.components["decoder"]] == [
        ("normalize", {}),
        ("verify", {"samples": 5}),
    ]
    assert used_variables(path) == {"n"}


@pytest.mark.parametrize("recipe", sorted(RECIPES.glob("*.yaml")), ids=lambda p: p.name)
def test_repo_recipe_includes_exist(recipe: Path) -> None:
    names = re.findall(r"{%-?\s*include\s+[\"']([^\"']+)[\"']", recipe.read_text())
    for name in names:
        assert (PARTIALS / name).is_file(), name
    assert used_variables(recipe) is not None


def test_recipe_without_steps_uses_presets(project: Path) -> None:
    path = write(project, HEAD)
    for device in ("cpu", "npu"):
        r = load_recipe(path, device=device)
        expected = default_steps(Target(device, "fp32"))
        for steps in r.components.values():
            assert [s.name for s in steps] == expected
            assert all(s.options == {} and s.line == 0 for s in steps)
    assert default_steps(Target("cpu", "fp32")) == ["export", "normalize", "verify"]
    assert default_steps(Target("npu", "fp32")) == [
        "export",
        "normalize",
        "fix_shapes",
        "prepare",
        "verify",
    ]


def test_component_steps_and_dims_override(project: Path) -> None:
    path = write(
        project,
        HEAD
        + """\
dims: {batch: 4}
steps: [normalize, verify]
components:
  decoder:
    steps: [fix_shapes]
    dims: {batch: 8}
""",
    )
    r = load_recipe(path)
    assert list(r.components) == ["encoder", "decoder"]  # catalog order
    assert [s.name for s in r.components["encoder"]] == ["normalize", "verify"]
    assert r.components["decoder"] == (Step("fix_shapes", {}, 11),)
    assert r.dims == {"encoder": {"batch": 4}, "decoder": {"batch": 8}}


def test_target_selection(project: Path) -> None:
    path = write(project, HEAD)
    assert load_recipe(path).target == Target("cpu", "fp32")
    assert load_recipe(path, precision="fp32").target == Target("cpu", "fp32")
    assert load_recipe(path, device="npu").target == Target("npu", "fp32")


def test_rendered_text_and_sha(project: Path) -> None:
    path = write(project, HEAD + "description: '{{ device }}'\n")
    a, b = load_recipe(path), load_recipe(path, device="npu")
    assert a.rendered.endswith("description: 'cpu'\n")
    assert b.rendered.endswith("description: 'npu'\n")
    assert a.sha256 != b.sha256 and len(a.sha256) == 64


def test_utf8_bom_and_crlf(project: Path) -> None:
    path = project / "recipes" / "r.yaml"
    path.write_bytes(b"\xef\xbb\xbf" + HEAD.replace("\n", "\r\n").encode())
    assert load_recipe(path).name == "r"


# --- -D -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("novalue", "-D 'novalue': expected key=value with an identifier key"),
        ("1x=2", "-D '1x=2': expected key=value with an identifier key"),
        ("a-b=2", "-D 'a-b=2': expected key=value with an identifier key"),
        ("=2", "-D '=2': expected key=value with an identifier key"),
        ("device=npu", "-D 'device=npu': 'device' is set by the tool; use --device"),
        ("precision=int8", "-D 'precision=int8': 'precision' is set by the tool; use --precision"),
        ("catalog=x", "-D 'catalog=x': 'catalog' is set by the tool; use --catalog DIR"),
    ],
)
def test_bad_defines(item: str, message: str) -> None:
    with pytest.raises(RecipeError) as exc:
        parse_defines([item])
    assert str(exc.value) == message


def test_define_given_twice() -> None:
    with pytest.raises(RecipeError) as exc:
        parse_defines(["a=1", "a=2"])
    assert str(exc.value) == "-D 'a=2': 'a' is given twice"


def test_define_values() -> None:
    assert parse_defines(["a=", "b=x=y", "c=[1, 2]", "d='7'", "e=: bad"]) == {
        "a": "",
        "b": "x=y",
        "c": [1, 2],
        "d": "7",
        "e": ": bad",
    }


def test_unused_define_is_an_error(project: Path) -> None:
    path = write(project, HEAD + "seed: {{ samples }}\n")
    assert error(path, defines={"samples": 1, "smples": 2}) == (
        f"{path}: -D smples: the recipe does not use 'smples' (did you mean 'samples'?); "
        "variables it reads: samples"
    )


def test_define_used_only_in_a_partial_is_fine(project: Path) -> None:
    (project / "recipes" / "_partials" / "seed.yaml").write_text("seed: {{ s }}\n")
    path = write(project, HEAD + "{% include 'seed.yaml' %}")
    assert load_recipe(path, defines={"s": 3}).seed == 3


# --- template errors ---------------------------------------------------------------------


def test_undefined_variable(project: Path) -> None:
    path = write(project, HEAD + "seed: {{ sead }}\n")
    assert error(path) == (
        f"{path}:7: undefined variable: 'sead' is undefined; known: catalog, device, "
        "precision (add more with -D key=value)"
    )


def test_undefined_variable_in_partial_reports_the_include_line(project: Path) -> None:
    (project / "recipes" / "_partials" / "p.yaml").write_text("seed: {{ missing }}\n")
    path = write(project, HEAD + "\n{% include 'p.yaml' %}")
    err = error(path)
    assert err.startswith(f"{path}:8: undefined variable: 'missing' is undefined")


def test_jinja_syntax_error(project: Path) -> None:
    path = write(project, HEAD + "steps:\n{% for s in [1] %}\n  - normalize\n")
    err = error(path)
    assert re.fullmatch(rf"{re.escape(str(path))}:\d+: template syntax error: .+", err)
    assert "for" in err


def test_jinja_syntax_error_in_partial_points_into_the_partial(project: Path) -> None:
    partial = project / "recipes" / "_partials" / "p.yaml"
    partial.write_text("# shared\nseed: {{ 1 + }}\n")
    path = write(project, HEAD + "{% include 'p.yaml' %}\n")
    assert error(path) == (
        f"{partial}:2: template syntax error: unexpected 'end of print statement'"
    )


def test_jinja_syntax_error_line(project: Path) -> None:
    path = write(project, HEAD + "seed: {{ 1 + }}\n")
    assert error(path) == f"{path}:7: template syntax error: unexpected 'end of print statement'"


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("''.__class__.__mro__", "access to attribute '__class__' of 'str' object is unsafe."),
        (
            "cycler.__init__.__globals__",
            "access to attribute '__init__' of 'type' object is unsafe.",
        ),
        (
            "self.__init__",
            "access to attribute '__init__' of 'TemplateReference' object is unsafe.",
        ),
        (
            "().__class__.__base__.__subclasses__()",
            "access to attribute '__class__' of 'tuple' object is unsafe.",
        ),
        (
            "catalog.update({'name': 'x'})",
            "access to attribute 'update' of 'dict' object is unsafe.",
        ),
        (
            "catalog.components.encoder.source.clear()",
            "access to attribute 'clear' of 'dict' object is unsafe.",
        ),
        ("'x' * 10**9", "repeating a sequence 1000000000 times is too large for a recipe"),
        ("[0] * 10**7", "repeating a sequence 10000000 times is too large for a recipe"),
        ("2 ** 100000", "2 ** 100000 is too large for a recipe"),
    ],
)
def test_sandbox(project: Path, expr: str, message: str) -> None:
    path = write(project, HEAD + f'description: "{{{{ {expr} }}}}"\n')
    assert error(path) == f"{path}:7: not allowed in a recipe: {message}"


def test_catalog_values_render(project: Path) -> None:
    path = write(project, HEAD + 'description: "{{ catalog.components.encoder.dims }}"\n')
    r = load_recipe(path)
    assert r.catalog.data["components"]["encoder"]["dims"] == {"batch": 2}
    assert "description: \"{'batch': 2}\"" in r.rendered


def test_small_arithmetic_is_allowed(project: Path) -> None:
    path = write(project, HEAD + "description: \"{{ 'ab' * 2 }} {{ 2 ** 10 }} {{ [1] * 3 }}\"\n")
    assert 'description: "abab 1024 [1, 1, 1]"' in load_recipe(path).rendered


def test_template_type_error_is_one_line(project: Path) -> None:
    path = write(project, HEAD + "description: \"{{ 1 + 'a' }}\"\n")
    assert error(path) == (
        f"{path}:7: template error: TypeError: unsupported operand type(s) for +: 'int' and 'str'"
    )


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("../other.yaml", "leaves the partials directory ('..')"),
        ("sub/../../other.yaml", "leaves the partials directory ('..')"),
        ("/etc/passwd", "is an absolute path"),
        ("C:\\\\Windows\\\\win.ini", "is an absolute path"),
    ],
)
def test_include_outside_partials(project: Path, name: str, problem: str) -> None:
    write(project, HEAD, name="other")
    path = write(project, HEAD + f"{{% include '{name}' %}}\n")
    shown = name.replace("\\\\", "\\")
    partials = project / "recipes" / "_partials"
    assert error(path) == (
        f"{path}:7: include '{shown}' {problem}; includes are file names inside {partials}"
    )


def test_include_missing(project: Path) -> None:
    path = write(project, HEAD + "\n{% include 'nope.yaml' %}\n")
    partials = project / "recipes" / "_partials"
    assert error(path) == (
        f"{path}:8: include 'nope.yaml' not found in {partials} or the built-in partials"
    )


def test_builtin_partials_are_available_and_a_project_partial_overrides_one(
    project: Path,
) -> None:
    """Partials ship inside the package: a recipe anywhere includes them; the recipe's own
    _partials/ file of the same name wins."""
    recipe = HEAD + "steps:\n  - verify: {% include 'verify-float.yaml' %}\n"
    path = write(project, recipe)
    builtin = load_recipe(path).components["decoder"][0].options
    assert builtin == {"min_sqnr_db": 60, "min_cosine": 0.9999, "samples": 2}
    (project / "recipes" / "_partials" / "verify-float.yaml").write_text("{samples: 7}\n")
    assert load_recipe(path).components["decoder"][0].options == {"samples": 7}


# --- YAML and schema errors ----------------------------------------------------------------


def test_malformed_yaml(project: Path) -> None:
    path = write(project, HEAD + "steps: [normalize, verify\ndims: {batch: 1}\n")
    err = error(path)
    assert re.fullmatch(rf"{re.escape(str(path))}:8: invalid YAML: .+", err), err


def test_malformed_yaml_indentation(project: Path) -> None:
    path = write(project, HEAD + "steps:\n  - normalize\n - verify\n")
    err = error(path)
    assert re.fullmatch(rf"{re.escape(str(path))}:9: invalid YAML: .+", err), err


def test_python_tags_are_refused(project: Path) -> None:
    path = write(project, HEAD + "description: !!python/object/apply:os.getcwd []\n")
    assert error(path) == (
        f"{path}:7: invalid YAML: could not determine a constructor for the tag "
        "'tag:yaml.org,2002:python/object/apply:os.getcwd'"
    )


def test_duplicate_key(project: Path) -> None:
    path = write(project, HEAD + "steps: [normalize]\nseed: 1\nsteps: [verify]\n")
    assert error(path) == f"{path}:9: $: duplicate key 'steps' (first at line 7)"


def test_duplicate_nested_key(project: Path) -> None:
    path = write(project, HEAD + "steps:\n  - verify:\n      samples: 2\n      samples: 3\n")
    assert error(path) == f"{path}:10: $.steps[0].verify: duplicate key 'samples' (first at line 9)"


def test_non_string_key(project: Path) -> None:
    path = write(project, HEAD + "dims: {1: 2}\n")
    assert error(path) == f"{path}:7: $.dims: key 1 is not a string; quote it ('1')"


def test_alias_bomb_is_refused_quickly(project: Path) -> None:
    lines = ["dims:", "  l0: &l0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    for i in range(1, 9):
        lines.append(f"  l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]")
    path = write(project, HEAD + "\n".join(lines) + "\n")
    err = error(path)
    assert re.fullmatch(
        rf"{re.escape(str(path))}:\d+: \$\.dims\.l\d\S*: more than 100000 values after "
        r"expanding YAML aliases; is an alias \(\*name\) repeated recursively\?",
        err,
    ), err


def test_small_aliases_are_fine(project: Path) -> None:
    path = write(project, HEAD + "dims: &d {batch: 3}\ncomponents:\n  encoder: {dims: *d}\n")
    assert load_recipe(path).dims["encoder"] == {"batch": 3}


def test_not_a_mapping(project: Path) -> None:
    path = write(project, "- a\n- b\n")
    assert error(path) == f"{path}:1: a recipe must be a YAML mapping"


def test_empty_recipe(project: Path) -> None:
    path = write(project, "# nothing\n")
    assert error(path) == f"{path}:1: a recipe must be a YAML mapping"


def test_binary_recipe(project: Path) -> None:
    path = project / "recipes" / "r.yaml"
    path.write_bytes(b"\x08\x01\xff\xfe\x00")
    assert error(path) == f"{path}: not a UTF-8 text file (byte 2); is this really a recipe?"


def test_recipe_not_found(project: Path) -> None:
    assert error(project / "recipes" / "nope.yaml") == (
        f"{project / 'recipes' / 'nope.yaml'}: recipe not found"
    )
    assert error(project / "recipes") == (
        f"{project / 'recipes'}: is a directory, expected a recipe file"
    )


@pytest.mark.parametrize(
    ("body", "line", "message"),
    [
        ("seed: abc\n", 7, "$.seed: 'abc' is not of type 'integer'"),
        ("seed: -1\n", 7, "$.seed: -1 is less than the minimum of 0"),
        ("steps: normalize\n", 7, "$.steps: 'normalize' is not of type 'array'"),
        ("dims: {batch: 0}\n", 7, "$.dims.batch: 0 is less than the minimum of 1"),
        ("tagets: []\n", 7, "$: unknown key 'tagets' (did you mean 'targets'?)"),
        ("step: [normalize]\n", 7, "$: unknown key 'step' (did you mean 'steps'?)"),
        (
            "zzz: 1\n",
            7,
            "$: unknown key 'zzz'; allowed: schema_version, name, description, model, seed, "
            "source, targets, steps, dims, components",
        ),
        (
            "steps: [normalise]\n",
            7,
            "$.steps[0]: unknown value 'normalise' (did you mean 'normalize'?); expected one "
            f"of: {PASSES}",
        ),
        (
            "steps:\n  - normalize\n  - verfy: {samples: 2}\n",
            9,
            "$.steps[1]: unknown key 'verfy' (did you mean 'verify'?)",
        ),
        (
            "steps:\n  - normalize: {bakend: ort}\n",
            8,
            "$.steps[0].normalize: unknown key 'bakend' (did you mean 'backend'?)",
        ),
        (
            "steps:\n  - verify:\n      smples: 4\n",
            9,
            "$.steps[0].verify: unknown key 'smples' (did you mean 'samples'?)",
        ),
        (
            "steps:\n  - verify: {samples: two}\n",
            8,
            "$.steps[0].verify.samples: 'two' is not of type 'integer'",
        ),
        (
            "steps:\n  - normalize: {backend: onnxruntime}\n",
            8,
            "$.steps[0].normalize.backend: unknown value 'onnxruntime'; expected one of: "
            "ort, onnxscript",
        ),
        (
            "components:\n  encoder:\n    stepz: [normalize]\n",
            9,
            "$.components.encoder: unknown key 'stepz' (did you mean 'steps'?)",
        ),
        (
            "components:\n  encoder:\n    steps: [normalise]\n",
            9,
            "$.components.encoder.steps[0]: unknown value 'normalise' (did you mean "
            f"'normalize'?); expected one of: {PASSES}",
        ),
    ],
)
def test_schema_errors(project: Path, body: str, line: int, message: str) -> None:
    path = write(project, HEAD + body)
    assert error(path) == f"{path}:{line}: {message}"


def test_unknown_key_format_is_exact(project: Path) -> None:
    """The issue's required shape: FILE:LINE: $.path: unknown key 'x' (did you mean 'y'?)."""
    path = write(
        project,
        "schema_version: 1\nname: r\nmodel: tiny\ntagets:\n  - {device: cpu, precision: fp32}\n",
    )
    assert error(path) == f"{path}:4: $: unknown key 'tagets' (did you mean 'targets'?)"


@pytest.mark.parametrize(
    ("target", "line", "message"),
    [
        (
            "{device: tpu, precision: fp32}",
            5,
            f"$.targets[0].device: unknown value 'tpu' (did you mean 'npu'?); expected one of: "
            f"{DEVICES}",
        ),
        (
            "{device: cpu, precision: zzz}",
            5,
            f"$.targets[0].precision: unknown value 'zzz'; expected one of: {PRECISIONS}",
        ),
        ("{device: cpu}", 5, "$.targets[0]: 'precision' is required"),
        (
            "{device: cpu, precision: fp32, provider: x}",
            5,
            "$.targets[0]: unknown key 'provider'; allowed: device, precision, ep",
        ),
    ],
)
def test_bad_targets(project: Path, target: str, line: int, message: str) -> None:
    path = write(project, f"schema_version: 1\nname: r\nmodel: tiny\ntargets:\n  - {target}\n")
    assert error(path) == f"{path}:{line}: {message}"


def test_no_targets(project: Path) -> None:
    path = write(project, "schema_version: 1\nname: r\nmodel: tiny\ntargets: []\n")
    assert error(path) == f"{path}:4: $.targets: [] should be non-empty"


def test_required_keys(project: Path) -> None:
    path = write(project, "schema_version: 1\nname: r\ntargets: [{device: cpu, precision: fp32}]\n")
    assert error(path) == f"{path}:1: $: 'model' is required"


def test_bad_name(project: Path) -> None:
    path = write(project, HEAD.replace("name: r", "name: ../../evil"))
    assert error(path) == (
        f"{path}:2: $.name: '../../evil' does not match '^[A-Za-z0-9][A-Za-z0-9._-]*$'"
    )


def test_target_not_declared(project: Path) -> None:
    path = write(project, HEAD.replace("  - {device: npu, precision: fp32}\n", ""))
    assert error(path, device="npu") == (
        f"{path}:5: $.targets: npu/* is not a target of this recipe (declared: cpu/fp32); "
        "add it to targets"
    )
    other = next(p for p in precisions() if p != "fp32")
    assert error(path, precision=other) == (
        f"{path}:5: $.targets: */{other} is not a target of this recipe (declared: cpu/fp32); "
        "add it to targets"
    )
    assert error(path, device="gpu", precision="fp32") == (
        f"{path}:5: $.targets: gpu/fp32 is not a target of this recipe (declared: cpu/fp32); "
        "add it to targets"
    )


def test_unknown_device_and_precision_arguments(project: Path) -> None:
    # the template must not see a bad value: this one would fail to render with it
    path = write(project, HEAD + "seed: {{ {'cpu': 1, 'gpu': 2, 'npu': 3}[device] }}\n")
    with pytest.raises(PlanError) as exc:
        load_recipe(path, device="tpu")
    assert str(exc.value) == f"unknown device 'tpu' (did you mean 'npu'?); known: {DEVICES}"
    with pytest.raises(PlanError) as exc:
        load_recipe(path, precision="zzz")
    assert str(exc.value) == f"unknown precision 'zzz'; known: {PRECISIONS}"


def test_unknown_catalog_entry(project: Path) -> None:
    path = write(project, HEAD.replace("model: tiny", "model: tinny"))
    assert error(path) == (
        f"{path}:3: $.model: unknown catalog entry 'tinny' (did you mean 'tiny'?); entries in "
        f"{project / 'catalog'}: tiny; built-in: {', '.join(entry_names())}"
    )


def test_templated_unknown_catalog_entry(project: Path) -> None:
    path = write(project, HEAD.replace("model: tiny", "model: '{{ m }}'"))
    assert error(path, defines={"m": "tinny"}) == (
        f"{path}:3: $.model: unknown catalog entry 'tinny' (did you mean 'tiny'?); entries in "
        f"{project / 'catalog'}: tiny; built-in: {', '.join(entry_names())}"
    )


def test_model_is_not_a_path(project: Path) -> None:
    path = write(project, HEAD.replace("model: tiny", "model: ../recipes/r"))
    assert error(path) == (
        f"{path}:3: $.model: invalid catalog entry name '../recipes/r': a bare name like "
        "'sam3' (catalog/NAME.yaml), not a path"
    )


def test_invalid_catalog_entry_points_into_the_catalog(project: Path) -> None:
    cat = project / "catalog" / "tiny.yaml"
    cat.write_text(CATALOG_TEXT.replace("license: mit", "licence: mit"))
    path = write(project, HEAD)
    assert error(path) == f"{cat}:4: $: unknown key 'licence' (did you mean 'license'?)"


def test_explicit_catalog_dir(project: Path, tmp_path_factory) -> None:
    other = tmp_path_factory.mktemp("other-catalog")
    (other / "tiny.yaml").write_text(CATALOG_TEXT.replace("  decoder:", "  head:"))
    path = write(project, HEAD)
    assert list(load_recipe(path, catalog_dir=other).components) == ["encoder", "head"]


def test_unknown_component(project: Path) -> None:
    path = write(project, HEAD + "components:\n  encodr:\n    steps: [normalize]\n")
    assert error(path) == (
        f"{path}:8: $.components: unknown component 'encodr' (did you mean 'encoder'?); "
        "catalog 'tiny' has: encoder, decoder"
    )


def test_unknown_component_without_close_match(project: Path) -> None:
    path = write(project, HEAD + "components:\n  vision: {}\n")
    assert error(path) == (
        f"{path}:8: $.components: unknown component 'vision'; catalog 'tiny' has: encoder, decoder"
    )


def test_errors_point_at_the_template_or_partial_line_not_the_rendered_one(tmp_path) -> None:
    """Comments and includes change the rendered line count; errors still name the source."""
    import shutil

    from tests.conftest import CATALOG, cli

    shutil.copytree(CATALOG, tmp_path / "catalog")
    partials = tmp_path / "recipes" / "_partials"
    partials.mkdir(parents=True)
    (partials / "v.yaml").write_text("samples: 4\nseed: 1\n")
    recipe = tmp_path / "recipes" / "r.yaml"
    recipe.write_text(
        "schema_version: 1\nname: r\nmodel: sam3-tiny\n{# a\n   comment\n#}\n"
        "targets: [{device: cpu, precision: fp32}]\nsteps:\n  - export\n  - verify:\n"
        '      {% filter indent(6) %}{% include "v.yaml" %}{% endfilter %}\n'
        "      samplez: 4\n"
    )
    result = cli("validate", recipe)
    assert result.stderr.strip() == (
        f"error: {recipe}:12: $.steps[1].verify: unknown key 'samplez' (did you mean 'samples'?)"
    )
    recipe.write_text(recipe.read_text().replace("      samplez: 4\n", ""))
    (partials / "v.yaml").write_text("samples: 4\nsedd: 1\n")
    result = cli("validate", recipe)
    assert result.stderr.strip() == (
        f"error: {partials / 'v.yaml'}:2: $.steps[1].verify: unknown key 'sedd' "
        "(did you mean 'seed'?)"
    )


# --- hostile templates and defines ----------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("{{ 'a'.ljust(10**9) }}", "str.ljust(1000000000) is too large for a recipe"),
        ("{{ 'a'.center(50000000) }}", "str.center(50000000) is too large for a recipe"),
        ("{{ 'a'|center(50000000) }}", "the 'center' filter(50000000) is too large"),
        ("{{ '%999999999s' % 'a' }}", "format widths of a million or more"),
        ("{{ '{:>999999999}'.format('a') }}", "format widths of a million or more"),
        ("{{ '%*s'|format(10**9, 'a') }}", "'*' widths, are too large"),
        ("{{ lipsum(n=200000) }}", "'lipsum' is undefined"),
    ],
)
def test_template_work_is_bounded(project: Path, expression: str, message: str) -> None:
    path = write(project, HEAD + f'description: "{expression}"\n')
    text = error(path)
    assert text.startswith(f"{path}:7: ") and message in text, text


def test_template_render_has_a_deadline(project: Path, monkeypatch) -> None:
    import winml_recipes.recipe as recipe_module

    monkeypatch.setattr(recipe_module, "MAX_RENDER_SECONDS", 0.5)
    loops = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    path = write(project, HEAD + loops + "\n")
    import time

    started = time.monotonic()
    text = error(path)
    assert time.monotonic() - started < 10
    assert "rendering takes more than 0.5 s; simplify the loops" in text


def test_template_output_is_bounded(project: Path, monkeypatch) -> None:
    import winml_recipes.recipe as recipe_module

    monkeypatch.setattr(recipe_module, "MAX_RENDER_CHARS", 10_000)
    path = write(project, HEAD + "{% for i in range(100000) %}# {{ i }}\n{% endfor %}")
    assert "the rendered recipe exceeds 10000 characters" in error(path)


def test_define_with_a_newline_cannot_inject_keys() -> None:
    with pytest.raises(RecipeError, match="values are one line of printable text"):
        parse_defines(["note=x\nsteps: [export]"])


@pytest.mark.parametrize("value", ["&a [1, 2]", "&a [&b [1, 2], *b, *b, *b]"])
def test_define_aliases_and_bombs_are_refused(value: str) -> None:
    if "*" not in value:
        assert parse_defines([f"x={value}"]) == {"x": [1, 2]}  # an anchor alone is harmless
        return
    with pytest.raises(RecipeError, match="YAML aliases and values of more than 1000 items"):
        parse_defines([f"x={value}"])


def test_define_and_recipe_nesting_are_bounded(project: Path) -> None:
    with pytest.raises(RecipeError, match="nested too deeply"):
        parse_defines(["x=" + "[" * 3000 + "]" * 3000])
    path = write(project, HEAD + "description: " + "[" * 3000 + "]" * 3000 + "\n")
    assert "invalid YAML: nested too deeply" in error(path)


def test_partial_that_is_not_utf8(project: Path) -> None:
    (project / "recipes" / "_partials" / "bad.yaml").write_bytes(b"\xff\xfe\x00bad")
    path = write(project, HEAD + "description: {% include 'bad.yaml' %}\n")
    assert "include 'bad.yaml' is not UTF-8 text (byte 0)" in error(path)


def test_named_sources_pick_and_refuse() -> None:
    sam3 = load_recipe(RECIPES / "sam3.yaml")
    assert sam3.source == "fp32"  # the first listed
    assert load_recipe(RECIPES / "sam3.yaml", source="int8").source == "int8"
    ref = sam3.catalog.components["vision_encoder"].pick_source("int8")[0]["ref"]
    assert ref.endswith("/onnx/vision_encoder_int8.onnx")
    with pytest.raises(RecipeError, match="one source per component"):
        load_recipe(RECIPES / "sam3-tiny.yaml", source="int8")


def test_a_component_has_source_or_sources_not_both(tmp_path: Path) -> None:
    from winml_recipes.catalog import load_entry
    from winml_recipes.sdk.errors import CatalogError

    text = (CATALOG / "sam3.yaml").read_text()
    both = text.replace(
        "    sources:\n      fp32: {ref: onnx-community/sam3-tracker-ONNX/onnx/vision_encoder.onnx",
        "    source: {ref: x.onnx}\n    sources:\n"
        "      fp32: {ref: onnx-community/sam3-tracker-ONNX/onnx/vision_encoder.onnx",
    )
    assert both != text
    (tmp_path / "sam3.yaml").write_text(both)
    with pytest.raises(CatalogError):
        load_entry("sam3", tmp_path)


def test_a_resolved_target_carries_the_execution_provider_its_device_builds_for() -> None:
    from winml_recipes.runtime.providers import provider_for

    npu, cpu = resolve_target("npu", "w8a16"), resolve_target("cpu", "int8")
    assert (npu.execution_provider, cpu.execution_provider) == ("qnn-htp", "cpu")
    assert provider_for(npu).provider == "QNNExecutionProvider"
    assert provider_for(cpu).provider == "CPUExecutionProvider"
    # a device and a precision name a target: the EP follows from them
    assert npu == Target("npu", "w8a16") and str(npu) == "npu-w8a16"
