"""Catalog entries: loading, validation errors as FILE:LINE: path: message, and the CLI."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.conftest import CATALOG, cli
from winml_recipes.catalog import (
    CATALOG_ENV,
    builtin_catalog_dir,
    default_catalog_dir,
    entry_names,
    load_entry,
    load_file,
    override_note,
)
from winml_recipes.sdk.contract import TensorSpec
from winml_recipes.sdk.errors import CatalogError

GOOD = """\
schema_version: 1
name: tiny
task: feature-extraction
license: mit
components:
  encoder:
    source: {ref: ./model.onnx}
    dims: {batch: 2}
    inputs:
      x: {dtype: float32, shape: [batch, 4], range: [-1.0, 1.0]}
      ids: {dtype: int64, shape: [batch], values: [0, 1, 2]}
    outputs:
      y: {dtype: float32, shape: [batch, 3]}
"""


# every built-in entry, as the messages list them (other tests check which ones exist)
BUILTIN = "; built-in: " + ", ".join(entry_names(CATALOG))


def write(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def error_of(directory: Path, name: str) -> str:
    with pytest.raises(CatalogError) as exc:
        load_entry(name, directory)
    assert exc.value.exit_code == 2
    assert "\n" not in str(exc.value)
    return str(exc.value)


def test_repo_catalog_entries_load() -> None:
    names = entry_names(CATALOG)
    assert names == sorted(names)
    assert {"sam3", "sam3-mid", "sam3-tiny"} <= set(names)
    tiny = load_entry("sam3-tiny", CATALOG)
    assert list(tiny.components) == ["vision_encoder", "prompt_encoder_mask_decoder"]
    assert tiny.family == "sam3_tracker"
    enc = tiny.components["vision_encoder"]
    assert enc.contract.dims == {"batch": 1}
    pixels = enc.contract.inputs[0]
    assert (pixels.name, pixels.dtype, pixels.shape, pixels.range) == (
        "pixel_values",
        "float32",
        ("batch", 3, 112, 112),
        (-1.0, 1.0),
    )
    # the YAML anchor *tiny_config is shared by both components
    dec = tiny.components["prompt_encoder_mask_decoder"]
    assert dec.source["config"] == enc.source["config"]
    sam3 = load_entry("sam3", CATALOG)
    # The float32 graphs are the default source; the int8 ones are a named alternative.
    assert sam3.components["vision_encoder"].source["ref"] == (
        "onnx-community/sam3-tracker-ONNX/onnx/vision_encoder.onnx"
    )
    assert sam3.components["vision_encoder"].sources["int8"]["ref"] == (
        "onnx-community/sam3-tracker-ONNX/onnx/vision_encoder_int8.onnx"
    )
    assert sam3.source_names == ["fp32", "int8"]


def test_good_entry(tmp_path: Path) -> None:
    path = write(tmp_path, "tiny", GOOD)
    entry = load_entry("tiny", tmp_path)
    assert entry.name == "tiny"
    assert entry.path == path
    assert entry.family is None
    comp = entry.components["encoder"]
    assert comp.source == {"ref": "./model.onnx"}
    assert comp.source_line == 7
    assert comp.contract.inputs == (
        TensorSpec("x", "float32", ("batch", 4), (-1.0, 1.0), None),
        TensorSpec("ids", "int64", ("batch",), None, (0, 1, 2)),
    )
    assert comp.contract.outputs == (TensorSpec("y", "float32", ("batch", 3), None, None),)
    assert comp.contract.dims == {"batch": 2}


def test_utf8_bom_and_crlf(tmp_path: Path) -> None:
    (tmp_path / "tiny.yaml").write_bytes(b"\xef\xbb\xbf" + GOOD.replace("\n", "\r\n").encode())
    assert list(load_entry("tiny", tmp_path).components) == ["encoder"]


def test_unknown_entry_did_you_mean(tmp_path: Path) -> None:
    write(tmp_path, "tiny", GOOD)
    assert error_of(tmp_path, "tinny") == (
        f"unknown catalog entry 'tinny' (did you mean 'tiny'?); entries in {tmp_path}: tiny"
        f"{BUILTIN}"
    )


def test_unknown_entry_without_close_match(tmp_path: Path) -> None:
    write(tmp_path, "tiny", GOOD)
    assert error_of(tmp_path, "bert") == (
        f"unknown catalog entry 'bert'; entries in {tmp_path}: tiny{BUILTIN}"
    )


@pytest.mark.parametrize("name", ["../secret", "sub/tiny", "/etc/passwd", ".hidden", ""])
def test_entry_name_must_not_be_a_path(tmp_path: Path, name: str) -> None:
    write(tmp_path / "catalog", "tiny", GOOD)
    write(tmp_path, "secret", GOOD.replace("name: tiny", "name: secret"))
    assert error_of(tmp_path / "catalog", name) == (
        f"invalid catalog entry name '{name}': a bare name like 'sam3' (catalog/NAME.yaml), "
        "not a path"
    )


def test_missing_catalog_dir(tmp_path: Path) -> None:
    assert error_of(tmp_path / "nope", "tiny") == (
        f"catalog directory not found: {tmp_path / 'nope'}; pass --catalog DIR"
    )


@pytest.mark.parametrize(
    ("old", "new", "line", "message"),
    [
        (
            "    outputs:\n",
            "    ouputs:\n",
            12,
            "$.components.encoder: unknown key 'ouputs' (did you mean 'outputs'?)",
        ),
        (
            "license: mit\n",
            "license: mit\nlicence: mit\n",
            5,
            "$: unknown key 'licence' (did you mean 'license'?)",
        ),
        (
            "x: {dtype: float32,",
            "x: {dtype: float23,",
            10,
            "$.components.encoder.inputs.x.dtype: unknown value 'float23' "
            "(did you mean 'float32'?); expected one of: float32, float16, bfloat16, float64, "
            "int64, int32, int16, int8, uint64, uint32, uint16, uint8, bool",
        ),
        (
            "dims: {batch: 2}",
            "dims: {batch: two}",
            8,
            "$.components.encoder.dims.batch: 'two' is not of type 'integer'",
        ),
        (
            "range: [-1.0, 1.0]",
            "range: [-1.0]",
            10,
            "$.components.encoder.inputs.x.range: [-1.0] is too short",
        ),
        (
            "license: mit\n",
            "",
            1,
            "$: 'license' is required",
        ),
        (
            "schema_version: 1",
            "schema_version: 2",
            1,
            "$.schema_version: 1 was expected",
        ),
        (
            "source: {ref: ./model.onnx}",
            "source: {ref: ./model.onnx, revison: main}",
            7,
            "$.components.encoder.source: unknown key 'revison' (did you mean 'revision'?)",
        ),
    ],
)
def test_schema_errors(tmp_path: Path, old: str, new: str, line: int, message: str) -> None:
    assert old in GOOD
    path = write(tmp_path, "tiny", GOOD.replace(old, new, 1))
    assert error_of(tmp_path, "tiny") == f"{path}:{line}: {message}"


def test_source_needs_ref_or_config(tmp_path: Path) -> None:
    path = write(tmp_path, "tiny", GOOD.replace("source: {ref: ./model.onnx}", "source: {}"))
    err = error_of(tmp_path, "tiny")
    assert err.startswith(f"{path}:7: $.components.encoder.source: ")
    assert "is not valid under any of the given schemas" in err or "required" in err


def test_name_must_match_file(tmp_path: Path) -> None:
    path = write(tmp_path, "tiny", GOOD.replace("name: tiny", "name: small"))
    assert error_of(tmp_path, "tiny") == (
        f"{path}:2: $.name: 'small' must match the file name 'tiny'"
    )


def test_dim_without_default(tmp_path: Path) -> None:
    path = write(tmp_path, "tiny", GOOD.replace("shape: [batch, 4]", "shape: [batch, seq]"))
    assert error_of(tmp_path, "tiny") == (
        f"{path}:10: $.components.encoder.inputs.x.shape: dim 'seq' has no default; "
        "add it under components.encoder.dims"
    )


def test_range_low_above_high(tmp_path: Path) -> None:
    path = write(tmp_path, "tiny", GOOD.replace("range: [-1.0, 1.0]", "range: [1.0, -1.0]"))
    assert error_of(tmp_path, "tiny") == (
        f"{path}:10: $.components.encoder.inputs.x.range: low is above high"
    )


def test_malformed_yaml(tmp_path: Path) -> None:
    path = write(tmp_path, "tiny", GOOD.replace("dims: {batch: 2}", "dims: {batch: 2"))
    err = error_of(tmp_path, "tiny")
    assert err.startswith(f"{path}:9: invalid YAML: ")


def test_duplicate_key(tmp_path: Path) -> None:
    path = write(tmp_path, "tiny", GOOD.replace("license: mit\n", "license: mit\nlicense: x\n"))
    assert error_of(tmp_path, "tiny") == (f"{path}:5: $: duplicate key 'license' (first at line 4)")


def test_numeric_tensor_name_must_be_quoted(tmp_path: Path) -> None:
    path = write(tmp_path, "tiny", GOOD.replace("      y: {dtype", "      123: {dtype"))
    assert error_of(tmp_path, "tiny") == (
        f"{path}:13: $.components.encoder.outputs: key 123 is not a string; quote it ('123')"
    )


def test_not_a_mapping(tmp_path: Path) -> None:
    path = write(tmp_path, "tiny", "- a\n- b\n")
    assert error_of(tmp_path, "tiny") == f"{path}:1: a catalog entry must be a mapping"


def test_binary_file(tmp_path: Path) -> None:
    (tmp_path / "tiny.yaml").write_bytes(b"\x08\xff\xfe\x00garbage")
    assert error_of(tmp_path, "tiny") == (
        f"{tmp_path / 'tiny.yaml'}: not a UTF-8 text file (byte 1)"
    )


def test_python_tag_is_not_constructed(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "tiny",
        GOOD.replace("license: mit", "license: !!python/object/apply:os.getcwd []"),
    )
    err = error_of(tmp_path, "tiny")
    assert err.startswith(f"{path}:4: invalid YAML: could not determine a constructor")


def test_load_file_directly(tmp_path: Path) -> None:
    path = write(tmp_path, "tiny", GOOD)
    assert load_file(path).name == "tiny"


def test_default_catalog_dir(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "catalog").mkdir()
    (tmp_path / "recipes").mkdir()
    (tmp_path / "elsewhere").mkdir()
    recipe = tmp_path / "recipes" / "r.yaml"
    monkeypatch.delenv(CATALOG_ENV, raising=False)
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert default_catalog_dir(recipe) == tmp_path / "catalog"
    # no catalog beside the recipe nor in the working folder: the built-ins alone
    assert default_catalog_dir(tmp_path / "a" / "b" / "r.yaml") is None
    monkeypatch.chdir(tmp_path)
    assert default_catalog_dir(tmp_path / "a" / "b" / "r.yaml") == Path("catalog")
    monkeypatch.setenv(CATALOG_ENV, str(tmp_path / "env"))
    assert default_catalog_dir(recipe) == tmp_path / "env"


def test_builtin_entries_need_no_catalog_dir(tmp_path: Path, monkeypatch) -> None:
    """The built-in catalog ships inside the package: found from any folder."""
    monkeypatch.chdir(tmp_path)
    assert entry_names() == entry_names(CATALOG)
    tiny = load_entry("sam3-tiny")
    assert tiny.builtin and tiny.overrides is None
    assert tiny.path == builtin_catalog_dir() / "sam3-tiny.yaml"
    assert "winml_recipes" in tiny.path.parts  # not this repository's top level
    with pytest.raises(CatalogError) as exc:
        load_entry("sam3-tinny")
    assert str(exc.value) == (
        "unknown catalog entry 'sam3-tinny' (did you mean 'sam3-tiny'?); entries in "
        + BUILTIN.removeprefix("; ")
    )


def test_project_entry_adds_to_and_overrides_the_builtins(tmp_path: Path) -> None:
    write(tmp_path, "tiny", GOOD)
    write(tmp_path, "sam3-tiny", GOOD.replace("name: tiny", "name: sam3-tiny"))
    assert entry_names(tmp_path) == sorted([*entry_names(CATALOG), "tiny"])
    mine = load_entry("sam3-tiny", tmp_path)
    assert list(mine.components) == ["encoder"]  # the project's, not the built-in tracker
    assert mine.overrides == builtin_catalog_dir() / "sam3-tiny.yaml"
    assert override_note(mine) == (
        f"catalog entry 'sam3-tiny' from {tmp_path / 'sam3-tiny.yaml'} overrides the built-in one"
    )
    assert override_note(load_entry("tiny", tmp_path)) is None  # added, hides nothing
    assert load_entry("sam3", tmp_path).builtin  # the other built-ins stay available
    # the built-in folder given as --catalog is not a project overriding itself
    assert load_entry("sam3-tiny", builtin_catalog_dir()).overrides is None


def test_cli_catalog_list_and_show(tmp_path: Path) -> None:
    write(tmp_path, "tiny", GOOD)
    write(tmp_path, "sam3", GOOD.replace("name: tiny", "name: sam3"))
    result = cli("catalog", "list", "--catalog", tmp_path, "--json")
    assert result.exit_code == 0, result.stderr
    rows = {r["name"]: r for r in json.loads(result.stdout)}
    assert list(rows) == sorted([*entry_names(CATALOG), "tiny"])
    assert rows["tiny"] == {
        "name": "tiny",
        "task": "feature-extraction",
        "components": ["encoder"],
        "path": str(tmp_path / "tiny.yaml"),
        "builtin": False,
        "overrides": None,
    }
    assert rows["sam3"]["overrides"] == str(builtin_catalog_dir() / "sam3.yaml")
    assert rows["sam3-tiny"]["builtin"] and rows["sam3-tiny"]["overrides"] is None
    lines = {
        line.split()[0]: line
        for line in cli("catalog", "list", "--catalog", tmp_path).stdout.splitlines()
    }
    assert lines["sam3"].endswith(f"{tmp_path / 'sam3.yaml'} (overrides the built-in)")
    assert lines["sam3-tiny"].endswith(" built-in")
    shown = cli("catalog", "show", "tiny", "--catalog", tmp_path, "--json")
    assert shown.exit_code == 0
    assert json.loads(shown.stdout)["components"]["encoder"]["dims"] == {"batch": 2}
    shown = cli("catalog", "show", "sam3", "--catalog", tmp_path)
    assert shown.stderr == f"note: catalog entry 'sam3' from {tmp_path / 'sam3.yaml'} " + (
        "overrides the built-in one\n"
    )


def test_cli_catalog_show_unknown(tmp_path: Path) -> None:
    write(tmp_path, "tiny", GOOD)
    result = cli("catalog", "show", "tiy", "--catalog", tmp_path)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr == (
        f"error: unknown catalog entry 'tiy' (did you mean 'tiny'?); entries in {tmp_path}: tiny"
        f"{BUILTIN}\n"
    )


def test_cli_catalog_list_reports_invalid_entry(tmp_path: Path) -> None:
    path = write(tmp_path, "tiny", GOOD.replace("task: feature-extraction", "tasks: x"))
    result = cli("catalog", "list", "--catalog", tmp_path)
    assert result.exit_code == 2
    assert result.stderr == f"error: {path}:3: $: unknown key 'tasks' (did you mean 'task'?)\n"
