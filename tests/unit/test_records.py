"""The manifest's typed records: their JSON is the schema's, and reads back as written."""

from __future__ import annotations

import jsonschema

from winml_recipes import schemas
from winml_recipes.sdk.records import (
    SCHEMA_VERSION,
    ArtifactRecord,
    ComponentRecord,
    Manifest,
    RecipeRecord,
    SourceRecord,
    StepRecord,
    TargetRecord,
    ToolRecord,
)

SHA = "ab" * 32


def _step(**fields) -> StepRecord:
    return StepRecord(
        pass_name="verify", implementation="m.Verify", version=3, options={}, **fields
    )


def _manifest(*steps: StepRecord, **fields) -> Manifest:
    return Manifest(
        schema_version=SCHEMA_VERSION,
        tool=ToolRecord(name="winml-recipes", version="0"),
        versions={"onnx": "1.17", "torch": None},
        recipe=RecipeRecord(name="r", path="r.yaml", sha256=SHA, rendered="x: 1"),
        target=TargetRecord(device="npu", precision="w8a16"),
        wall_seconds=1.5,
        components={
            "enc": ComponentRecord(
                source=SourceRecord(kind="onnx", ref="m.onnx", sha256=SHA), steps=steps
            )
        },
        **fields,
    )


def test_a_manifest_is_its_schema_and_reads_back() -> None:
    gate = {"output": "y", "metric": "sqnr_db", "value": 31.0, "threshold": 20.0,
            "comparison": ">=", "margin": 11.0, "passed": True}  # fmt: skip
    ran = _step(status="ran", cache_key="k", wall_seconds=2.0, peak_rss_mb=None,
                input_sha256=SHA, output_sha256=None, metrics={"gates": [gate], "passed": True},
                artifacts=(ArtifactRecord(name="a.bin", size_bytes=3, sha256=SHA),))  # fmt: skip
    skipped = _step(status="skipped", reason="nothing to compare")
    manifest = _manifest(ran, skipped, status="ok")
    data = manifest.to_json()
    jsonschema.validate(data, schemas.manifest_schema())
    assert Manifest.from_json(data) == manifest
    step, plan_skip = data["components"]["enc"]["steps"]
    assert step["pass"] == "verify" and step["peak_rss_mb"] is None  # nullable: written
    # a step the plan skipped never ran: no measurements; optional fields left out
    assert set(plan_skip) == {"pass", "implementation", "version", "options", "status", "reason"}
    assert "failing_step" not in data  # only a failed build names one
    assert [g.margin for g in manifest.components["enc"].steps[0].gates] == [11.0]


def test_the_schema_refuses_what_the_records_cannot_hold() -> None:
    data = _manifest(_step(status="done"), status="ok").to_json()  # not a status
    errors = list(jsonschema.Draft202012Validator(schemas.manifest_schema()).iter_errors(data))
    assert errors and "done" in errors[0].message


def test_a_failed_manifest_names_its_step_or_null() -> None:
    data = _manifest(_step(status="failed", error="x"), status="failed", error="x").to_json()
    assert data["failing_step"] is None
    jsonschema.validate(data, schemas.manifest_schema())
