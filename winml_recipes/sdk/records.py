"""The build manifest as typed records: the one definition of manifest.json.

The engine makes these records (engine/run.py), writes them with `to_json()` and reads a
manifest back with `Manifest.from_json()`; the console (presenter.py) and the matrix
summary read the typed records, and schemas.py generates manifest.schema.json from them
(`record_schema`), the way the recipe schema is made from the pass configs.

Conventions (JSON keys are the field names, or `field(metadata={"key": ...})`):
- a field without a default is required and always written;
- a field whose default is None is optional: absent from the JSON when None, unless it is
  `nullable` (`describe(..., nullable=True)`: then written as null);
- a record's `_absent()` names fields its state leaves out (a skipped step's measurements);
- `description` (and any other JSON Schema keyword) goes in the field's metadata.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints

from winml_recipes.sdk.config import Schema
from winml_recipes.sdk.gates import Gate

SCHEMA_VERSION = 1
SHA256 = Schema(pattern="^[0-9a-f]{64}$")
Sha256 = Annotated[str, SHA256]
Count = Annotated[int, Schema(minimum=0)]
Seconds = Annotated[float, Schema(minimum=0)]
StepStatus = Literal["ran", "cached", "skipped", "failed"]


def describe(
    text: str, default: Any = dataclasses.MISSING, *, nullable: bool = False, **schema: Any
) -> Any:
    """A record field with its description (and JSON Schema keywords)."""
    metadata = {"description": text, **schema} if text else dict(schema)
    if nullable:
        metadata["nullable"] = True
    if default is dataclasses.MISSING:
        return field(metadata=metadata)
    return field(default=default, metadata=metadata)


# ---------------------------------------------------------------- the records


@dataclass(frozen=True, kw_only=True)
class ArtifactRecord:
    """A file a step ships beside the model (e.g. compile's EPContext model)."""

    name: str
    size_bytes: Count
    sha256: Sha256


@dataclass(frozen=True, kw_only=True)
class CompiledPartRecord:
    """One part of a graph compiled in parts (compile's metrics.split.parts[]): its core
    nodes, the tensors it takes and gives, its estimated preparation peak and its context
    binaries. model_ctx.onnx holds one EPContext node per part, in order."""

    index: int
    nodes: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    estimate_mb: float | None = None
    binaries: tuple[str, ...] = ()
    prepare_seconds: float | None = None  # the part's own compile process: wall time
    prepare_peak_rss_mb: float | None = None  # and peak RSS

    @classmethod
    def from_manifest(cls, data: dict[str, Any]) -> CompiledPartRecord:
        return cls(
            index=int(data["index"]),
            nodes=int(data["nodes"]),
            inputs=tuple(data.get("inputs") or ()),
            outputs=tuple(data.get("outputs") or ()),
            estimate_mb=data.get("estimate_mb"),
            binaries=tuple(data.get("binaries") or ()),
            prepare_seconds=data.get("prepare_seconds"),
            prepare_peak_rss_mb=data.get("prepare_peak_rss_mb"),
        )


@dataclass(frozen=True, kw_only=True)
class StepRecord:
    """What one step did: ran, came from the cache, was skipped (with why) or failed."""

    pass_name: str = field(metadata={"key": "pass"})
    implementation: str
    version: int
    options: dict[str, Any]
    cache_key: str | None = None
    memory_estimate_mb: float | None = describe(
        "The step's estimated peak, checked against the memory budget before it ran "
        "(absent: the pass gives no estimate, e.g. export).",
        None,
    )
    status: StepStatus = describe(
        "failed: the step that stopped a failed build (its manifest is in the target's "
        ".failed folder)."
    )
    reason: str | None = None
    error: str | None = describe("A failed step's one-line error.", None)
    # Measured when the step ran (absent for a step the plan skipped: see `_absent`).
    wall_seconds: Seconds | None = None
    peak_rss_mb: float | None = describe(
        "Peak resident memory of the build process when the step ended.", None, nullable=True
    )
    input_sha256: Sha256 | None = describe("", None, nullable=True)
    output_sha256: Sha256 | None = describe("", None, nullable=True)
    metrics: dict[str, Any] | None = describe(
        "Pass metrics. verify adds verified_on (an EP key such as cpu, or "
        "cpu-simulation where the device's EP cannot load here), execution_provider "
        "{key, provider, backend, available, versions | reason}, placement {nodes, "
        "partitions per EP} and cpu_simulation {outputs, task_metric}; quantize with "
        "mixed_precision auto adds mixed_precision_auto (promoted[] with kind, round and the "
        "damage measured for each, rounds[] with each round's output SQNR; README, Quantization); "
        "compile in parts adds split {parts[] (CompiledPartRecord: index, nodes, inputs, "
        "outputs, estimate_mb, binaries, prepare_seconds, prepare_peak_rss_mb), boundary, "
        "why, whole_estimate_mb}.",
        None,
    )
    artifacts: tuple[ArtifactRecord, ...] | None = describe(
        "Files this step ships beside the model (e.g. compile's EPContext model and "
        "context binary).",
        None,
    )

    def _absent(self) -> set[str]:
        # a step the plan skipped never ran: it has no measurements
        if self.wall_seconds is None:
            return {"peak_rss_mb", "input_sha256", "output_sha256"}
        return set()

    @property
    def ran(self) -> bool:
        """The step's output is in the build (ran now or earlier, from the cache)."""
        return self.status in ("ran", "cached")

    @property
    def measured(self) -> dict[str, Any]:
        """The pass's metrics ({} when none)."""
        return self.metrics or {}

    @property
    def verified(self) -> bool:
        """The step measured the model's outputs against the float model on a target
        (verify does: `verified_on` says where, `outputs` holds the metrics, `gates` the
        thresholds they were held to)."""
        return bool(self.measured.get("verified_on"))

    @property
    def split_parts(self) -> list[CompiledPartRecord]:
        """compile's parts when it compiled the graph in parts ([] when whole)."""
        split = self.measured.get("split") or {}
        return [CompiledPartRecord.from_manifest(p) for p in split.get("parts") or []]

    @property
    def gates(self) -> list[Gate]:
        """The quality gates the step held its outputs to (verify's)."""
        return [Gate.from_manifest(g) for g in self.measured.get("gates") or []]


@dataclass(frozen=True, kw_only=True)
class SourceRecord:
    kind: str
    ref: str
    revision: str | None = None
    sha256: Sha256


@dataclass(frozen=True, kw_only=True)
class ContractRecord:
    """The inputs as the build used them (dtype, shape with named dims, range, values,
    image), the outputs and the dims' values: compare and run feed the built model from
    them."""

    inputs: dict[str, dict[str, Any]]
    outputs: dict[str, dict[str, Any]]
    dims: dict[str, int]


@dataclass(frozen=True, kw_only=True)
class ReferenceRecord:
    """The float model the component was verified against, shipped in
    float-reference/<component>/ (absent: the shipped model is the float one)."""

    path: str
    sha256: Sha256


@dataclass(frozen=True, kw_only=True)
class FileRecord:
    path: str
    size_bytes: int
    sha256: Sha256


@dataclass(frozen=True, kw_only=True)
class ShippedRecord:
    """The shipped model (absent only in a failed build's evidence, for a component that
    had no model yet)."""

    path: str
    size_bytes: Count
    sha256: Sha256
    files: tuple[FileRecord, ...]


@dataclass(frozen=True, kw_only=True)
class ComponentRecord:
    source: SourceRecord
    contract: ContractRecord | None = None
    steps: tuple[StepRecord, ...]
    artifact: ShippedRecord | None = None
    reference: ReferenceRecord | None = None


@dataclass(frozen=True, kw_only=True)
class ToolRecord:
    name: str
    version: str


@dataclass(frozen=True, kw_only=True)
class RecipeRecord:
    name: str
    path: str
    sha256: Sha256
    rendered: str
    variables: dict[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class TargetRecord:
    device: str
    precision: str
    ep: str | None = describe(
        "Execution provider (an EP plugin's key) when not the device's default.", None
    )


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """manifest.json: what was built, from what, with which versions, and every step."""

    schema_version: Annotated[int, Schema(const=SCHEMA_VERSION)]
    tool: ToolRecord
    versions: dict[str, str | None]
    recipe: RecipeRecord
    model: str | None = None
    catalog: dict[str, Any] | None = describe(
        "The catalog entry built from (task, components, I/O contracts).", None
    )
    source: str | None = describe(
        "The catalog's named source built from (absent: its only one).", None
    )
    target: TargetRecord
    wall_seconds: Seconds | None = None
    components: dict[str, ComponentRecord]
    status: Literal["ok", "failed"] | None = describe(
        "failed: the evidence a failed build keeps in "
        "build/<recipe>/<device>-<precision>.failed/ (the models made so far, each "
        "component's last; the steps that ran and the failed one).",
        None,
    )
    error: str | None = describe("failed: the build's one-line error.", None)
    failing_step: str | None = describe("failed: component/step.", None, nullable=True)

    def _absent(self) -> set[str]:
        return set() if self.status == "failed" else {"failing_step"}

    def to_json(self) -> dict[str, Any]:
        return to_json(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Manifest:
        """A manifest read from JSON (keys this version does not know are left out)."""
        return from_json(cls, data)

    def steps(self) -> list[tuple[str, StepRecord]]:
        """Every step record with its component's name, in build order."""
        return [(name, s) for name, c in self.components.items() for s in c.steps]


# ---------------------------------------------------------------- JSON


def to_json(record: Any) -> Any:
    """A record as the manifest's JSON (see the module's conventions)."""
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        absent = record._absent() if hasattr(record, "_absent") else set()
        out: dict[str, Any] = {}
        for f in dataclasses.fields(record):
            value = getattr(record, f.name)
            if f.name in absent or (value is None and not f.metadata.get("nullable")):
                continue
            out[f.metadata.get("key", f.name)] = to_json(value)
        return out
    if isinstance(record, tuple | list):
        return [to_json(v) for v in record]
    if isinstance(record, dict):
        return {k: to_json(v) for k, v in record.items()}
    return record


def from_json(cls: type, data: Mapping[str, Any]) -> Any:
    """The record `cls` of JSON `data` (as `to_json` writes it)."""
    hints = _hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        key = f.metadata.get("key", f.name)
        if key in data:
            values[f.name] = _value(hints[f.name], data[key])
    return cls(**values)


def _value(hint: Any, value: Any) -> Any:
    origin, args = get_origin(hint), get_args(hint)
    if origin is Annotated:
        return _value(args[0], value)
    if value is None:
        return None
    if origin in (Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        return _value(rest[0], value) if len(rest) == 1 else value
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return from_json(hint, value)
    if origin is tuple:
        return tuple(_value(args[0], v) for v in value)
    if origin is dict:
        return {k: _value(args[1], v) for k, v in value.items()}
    return value


@cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls, include_extras=True)


# ---------------------------------------------------------------- JSON Schema


def record_schema(cls: type) -> dict[str, Any]:
    """The JSON Schema of record `cls`: closed objects, required fields, descriptions."""
    hints = _hints(cls)
    props: dict[str, Any] = {}
    required: list[str] = []
    for f in dataclasses.fields(cls):
        key = f.metadata.get("key", f.name)
        hint = hints[f.name]
        if _nullable(hint):
            hint = _without_none(hint)
            if f.metadata.get("nullable"):
                hint = hint | None
        schema = _schema(hint)
        schema.update({k: v for k, v in f.metadata.items() if k not in ("key", "nullable")})
        props[key] = schema
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required.append(key)
    out: dict[str, Any] = {"type": "object", "additionalProperties": False}
    if required:
        out["required"] = required
    if cls.__doc__ and not cls.__doc__.startswith(f"{cls.__name__}("):
        out["description"] = " ".join(cls.__doc__.split())
    out["properties"] = props
    return out


def _nullable(hint: Any) -> bool:
    return get_origin(hint) in (Union, types.UnionType) and type(None) in get_args(hint)


def _without_none(hint: Any) -> Any:
    rest = tuple(a for a in get_args(hint) if a is not type(None))
    return rest[0] if len(rest) == 1 else Union[rest]  # noqa: UP007 (a runtime union)


_SCALARS: dict[Any, str] = {bool: "boolean", int: "integer", float: "number", str: "string"}


def _schema(hint: Any) -> dict[str, Any]:
    origin, args = get_origin(hint), get_args(hint)
    if origin is Annotated:
        schema = _schema(args[0])
        for extra in args[1:]:
            if isinstance(extra, Schema):
                schema.update(extra.keywords)
        return schema
    if hint is Any:
        return {}
    if hint in _SCALARS:
        return {"type": _SCALARS[hint]}
    if origin is Literal:
        return {"enum": list(args)}
    if origin in (Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and rest[0] in _SCALARS:
            return {"type": [_SCALARS[rest[0]], "null"]}
        return {"anyOf": [_schema(a) for a in rest] + [{"type": "null"}] * _nullable(hint)}
    if origin is tuple:
        return {"type": "array", "items": _schema(args[0])}
    if origin is dict:
        return {"type": "object", "additionalProperties": _schema(args[1])}
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return record_schema(hint)
    raise TypeError(f"no JSON Schema for {hint!r}")


__all__ = [
    "SCHEMA_VERSION",
    "ArtifactRecord",
    "ComponentRecord",
    "ContractRecord",
    "FileRecord",
    "Manifest",
    "RecipeRecord",
    "ReferenceRecord",
    "ShippedRecord",
    "SourceRecord",
    "StepRecord",
    "TargetRecord",
    "ToolRecord",
    "from_json",
    "record_schema",
    "to_json",
]
