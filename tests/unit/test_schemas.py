"""The committed schemas are what `make schema` generates, and every schema is strict."""

from __future__ import annotations

import json

import jsonschema

from tests.conftest import CATALOG, DATA, RECIPES, REPO
from winml_recipes import schemas
from winml_recipes.sdk.passes import all_passes


def test_committed_schemas_are_fresh() -> None:
    """Both copies: the package's (shipped in the wheel) and the repo's (for its editors)."""
    for folder in (REPO / "schemas", DATA / "schemas"):
        for name in schemas.SCHEMAS:
            committed = (folder / f"{name}.schema.json").read_text()
            stale = f"{folder}/{name}.schema.json is stale: run make schema"
            assert committed == schemas.render(name), stale


def test_schemas_are_valid_2020_12() -> None:
    for name in schemas.SCHEMAS:
        jsonschema.Draft202012Validator.check_schema(schemas.SCHEMAS[name]())


def _objects_without_closed_properties(node, path="$"):
    if isinstance(node, dict):
        kind = node.get("type")
        is_object = kind == "object" or (isinstance(kind, list) and "object" in kind)
        if is_object and "properties" in node and node.get("additionalProperties") is not False:
            yield path
        for key, value in node.items():
            yield from _objects_without_closed_properties(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _objects_without_closed_properties(value, f"{path}[{i}]")


def test_every_object_with_properties_is_closed() -> None:
    for name in schemas.SCHEMAS:
        open_objects = list(_objects_without_closed_properties(schemas.SCHEMAS[name]()))
        assert open_objects == [], f"{name}: {open_objects}"


def test_recipe_schema_composes_every_pass() -> None:
    schema = schemas.recipe_schema()
    for name in all_passes():
        assert f"options.{name}" in schema["$defs"]
    assert set(schema["$defs"]["step"]["then"]["enum"]) == set(all_passes())


def test_recipes_and_catalog_point_editors_at_the_schemas() -> None:
    """The repo's recipes at schemas/, the built-in catalog at the package's copy."""
    pairs = [(p, "recipe") for p in RECIPES.glob("*.yaml")]
    pairs += [(p, "catalog") for p in CATALOG.glob("*.yaml")]
    assert len(pairs) >= 6
    for path, kind in pairs:
        first = path.read_text().splitlines()[0]
        assert f"$schema=../schemas/{kind}.schema.json" in first, path
        assert (path.parent / f"../schemas/{kind}.schema.json").resolve().is_file(), path


def test_schema_cli_prints_json() -> None:
    from tests.conftest import cli

    result = cli("schema", "manifest")
    assert result.exit_code == 0
    assert json.loads(result.stdout)["title"] == "winml-recipes build manifest"
