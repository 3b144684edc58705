"""JSON Schemas: the recipe schema (composed from every registered pass), catalog, manifest.

The Python definitions here are the source of truth; `make schema` writes them to
schemas/*.json (for editors in this repository) and winml_recipes/data/schemas/*.json (the
package's copy, which the built-in catalog entries point at), and a test fails when either
is stale. `init` writes them into a new project.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from winml_recipes.presets import devices, precisions
from winml_recipes.sdk.records import SCHEMA_VERSION

DRAFT = "https://json-schema.org/draft/2020-12/schema"
NAME_PATTERN = "^[A-Za-z0-9][A-Za-z0-9._-]*$"
DTYPES = [
    "float32",
    "float16",
    "bfloat16",
    "float64",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint64",
    "uint32",
    "uint16",
    "uint8",
    "bool",
]


def _target_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["device", "precision"],
        "properties": {
            "device": {"enum": devices()},
            "precision": {"enum": precisions()},
            "ep": {
                "type": "string",
                "minLength": 1,
                "description": "Execution provider (an installed EP plugin's key or entry-point "
                "name, e.g. openvino) when not the device's default (presets.yaml).",
            },
        },
    }


# Sane maxima: a zero dim makes empty tensors that "verify" perfectly; a huge one makes a
# 100-byte catalog allocate gigabytes. A real need above them is a code change, on purpose.
MAX_DIM = 1 << 20
MAX_IMAGE_SIDE = 16384


def _dims_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "description": "Values for named dims (e.g. batch: 1).",
        "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
        "additionalProperties": {"type": "integer", "minimum": 1, "maximum": MAX_DIM},
    }


def recipe_schema() -> dict[str, Any]:
    """The recipe schema with each registered pass's options composed in."""
    from winml_recipes.sdk.passes import all_passes

    passes = all_passes()
    options_defs: dict[str, Any] = {}
    for name, cls in passes.items():
        opts = copy.deepcopy(cls.options_schema)
        opts["type"] = ["object", "null"]
        opts.setdefault("additionalProperties", False)
        opts.setdefault("description", cls.summary)
        options_defs[f"options.{name}"] = opts
    step = {
        "description": "A pass name, or {pass name: options}.",
        "if": {"type": "string"},
        "then": {"enum": list(passes)},
        "else": {
            "type": "object",
            "minProperties": 1,
            "maxProperties": 1,
            "additionalProperties": False,
            "properties": {n: {"$ref": f"#/$defs/options.{n}"} for n in passes},
        },
    }
    component = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "steps": {"$ref": "#/$defs/steps"},
            "dims": _dims_schema(),
        },
    }
    return {
        "$schema": DRAFT,
        "$id": "https://winml-recipes.dev/schemas/recipe.schema.json",
        "title": "winml-recipes recipe",
        "type": "object",
        "additionalProperties": False,
        "required": ["schema_version", "name", "model", "targets"],
        "properties": {
            "schema_version": {"const": SCHEMA_VERSION},
            "name": {"type": "string", "pattern": NAME_PATTERN},
            "description": {"type": "string"},
            "model": {"type": "string", "description": "Catalog entry name (catalog/NAME.yaml)."},
            "seed": {
                "type": "integer",
                "minimum": 0,
                "default": 0,
                "description": "Added to every step's seed (calibration and verification data).",
            },
            "source": {
                "type": "string",
                "pattern": NAME_PATTERN,
                "description": "Which of the catalog's named `sources` to build from "
                "(default: the first listed); `--source NAME` overrides it.",
            },
            "targets": {"type": "array", "minItems": 1, "items": _target_schema()},
            "steps": {
                "$ref": "#/$defs/steps",
                "description": "Steps for every component without its own list.",
            },
            "dims": _dims_schema(),
            "components": {
                "type": "object",
                "description": "Per-component steps and dims, by catalog component name.",
                "additionalProperties": component,
            },
        },
        "$defs": {"steps": {"type": "array", "items": {"$ref": "#/$defs/step"}}, "step": step}
        | options_defs,
    }


def _tensor_schema(output: bool) -> dict[str, Any]:
    props: dict[str, Any] = {
        "dtype": {"enum": DTYPES},
        "shape": {
            "type": "array",
            "items": {
                "anyOf": [
                    {"type": "integer", "minimum": 1, "maximum": MAX_DIM},
                    {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
                ]
            },
        },
        "description": {"type": "string"},
    }
    if output:
        props["shape_advisory"] = {
            "type": "boolean",
            "description": "The shape is what the model file declares (written by build --onnx "
            "and init from an ONNX file): verify checks it against the float model's run and, "
            "where they disagree, verifies at the shape the model runs and says so in one line "
            "instead of failing. Curated entries leave it out: their shapes are checked strictly.",
        }
        props["ctc_blank"] = {
            "type": "integer",
            "minimum": 0,
            "description": "The CTC blank class of a speech recognizer's logits (its "
            "tokenizer's pad token): dropped when the outputs are decoded.",
        }
    if not output:
        props["range"] = {
            "type": "array",
            "items": {"type": "number"},
            "minItems": 2,
            "maxItems": 2,
        }
        props["values"] = {"type": "array", "items": {"type": "number"}, "minItems": 1}
        props["image"] = {
            "type": "object",
            "description": "How image files become this input (calibration from a folder).",
            "additionalProperties": False,
            "required": ["size"],
            "properties": {
                "size": {
                    "description": "Resize to this (one int: square; or [height, width]).",
                    "anyOf": [
                        {"type": "integer", "minimum": 1, "maximum": MAX_IMAGE_SIDE},
                        {
                            "type": "array",
                            "items": {"type": "integer", "minimum": 1, "maximum": MAX_IMAGE_SIDE},
                            "minItems": 2,
                            "maxItems": 2,
                        },
                    ],
                },
                "mean": {"type": "array", "items": {"type": "number"}, "minItems": 1},
                "std": {
                    "type": "array",
                    "items": {"type": "number", "exclusiveMinimum": 0},
                    "minItems": 1,
                },
                "layout": {"enum": ["NCHW", "NHWC"], "default": "NCHW"},
            },
        }
        props["audio"] = _audio_schema()
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["shape"] if output else ["dtype", "shape"],
        "properties": props,
    }


def _audio_schema() -> dict[str, Any]:
    from winml_recipes.speech import FEATURE_EXTRACTORS

    return {
        "type": "object",
        "description": "How speech becomes this input (the bundled speech feeds it when no "
        "data is given).",
        "additionalProperties": False,
        "required": ["feature_extractor"],
        "properties": {
            "feature_extractor": {"enum": list(FEATURE_EXTRACTORS)},
            "sampling_rate": {"type": "integer", "minimum": 1000, "maximum": 192000},
            "options": {
                "type": "object",
                "description": "The feature extractor's preprocessor_config.json fields.",
            },
        },
    }


def _exporter_families() -> list[str]:
    from winml_recipes.exporters import families

    return list(families())


def _component_tasks() -> list[str]:
    """The tasks a component's export can name: the auto exporter's, and the two-tower
    model's (its towers)."""
    from winml_recipes.exporters.auto import TASKS

    return list(TASKS)


def catalog_schema() -> dict[str, Any]:
    source = {
        "type": "object",
        "description": "A model reference (local .onnx, local HF dir, Hub ONNX file "
        "org/repo/path.onnx, HF model id) or an HF config with seeded random weights.",
        "additionalProperties": False,
        "properties": {
            "ref": {"type": "string", "minLength": 1},
            "revision": {"type": "string", "minLength": 1},
            "config": {"type": "object", "required": ["model_type"]},
            "seed": {"type": "integer", "minimum": 0},
        },
        "oneOf": [{"required": ["ref"]}, {"required": ["config"]}],
    }
    component = {
        "type": "object",
        "additionalProperties": False,
        "required": ["inputs", "outputs"],
        "oneOf": [{"required": ["source"]}, {"required": ["sources"]}],
        "properties": {
            "description": {"type": "string"},
            "source": source,
            "sources": {
                "type": "object",
                "description": "Named alternative sources (e.g. fp32, int8); the first is the "
                "default, a recipe's `source:` or `--source NAME` picks another.",
                "minProperties": 1,
                "propertyNames": {"pattern": NAME_PATTERN},
                "additionalProperties": source,
            },
            "task": {
                "enum": _component_tasks(),
                "description": "auto family: the task (and head) to export; two_tower: "
                "each tower's (text-embedding, image-embedding).",
            },
            "dims": _dims_schema(),
            "inputs": {
                "type": "object",
                "minProperties": 1,
                "additionalProperties": _tensor_schema(False),
            },
            "outputs": {
                "type": "object",
                "minProperties": 1,
                "additionalProperties": _tensor_schema(True),
            },
        },
    }
    return {
        "$schema": DRAFT,
        "$id": "https://winml-recipes.dev/schemas/catalog.schema.json",
        "title": "winml-recipes catalog entry",
        "type": "object",
        "additionalProperties": False,
        "required": ["schema_version", "name", "task", "license", "components"],
        "properties": {
            "schema_version": {"const": SCHEMA_VERSION},
            "name": {"type": "string", "pattern": NAME_PATTERN},
            "task": {"type": "string"},
            "license": {"type": "string"},
            "description": {"type": "string"},
            "homepage": {"type": "string"},
            "family": {
                "enum": _exporter_families(),
                "description": "Exporter family for sources that are not ONNX yet.",
            },
            "components": {
                "type": "object",
                "minProperties": 1,
                "additionalProperties": component,
            },
        },
    }


def manifest_schema() -> dict[str, Any]:
    """Generated from the manifest's records (sdk/records.py), with what only the package
    knows filled in: the target's devices and precisions, and the shapes of the metrics
    the records leave open (each pass has its own) that tools read."""
    from winml_recipes.sdk.records import Manifest, record_schema

    schema = record_schema(Manifest)
    schema["properties"]["target"] = _target_schema()
    components = schema["properties"]["components"]
    # a component name is a folder of the build: no separator, no `..` (buildfolder.py)
    components["propertyNames"] = {"pattern": NAME_PATTERN}
    _contract_tensors(components["additionalProperties"]["properties"]["contract"])
    # names the tool prints and joins into labels: as the recipe and catalog schemas say
    schema["properties"]["recipe"]["properties"]["name"]["pattern"] = NAME_PATTERN
    schema["properties"]["model"]["pattern"] = NAME_PATTERN
    # the catalog entry the manifest records is one the catalog schema takes
    catalog = {k: v for k, v in catalog_schema().items() if not k.startswith("$") and k != "title"}
    schema["properties"]["catalog"] = {**catalog, **_described(schema["properties"]["catalog"])}
    step = components["additionalProperties"]["properties"]["steps"]
    step["items"]["properties"]["metrics"]["patternProperties"] = {
        "^mixed_precision_auto$": MIXED_PRECISION_AUTO,
        "^gates$": GATES,
        "^passed$": {"type": "boolean", "description": "verify: every gate held."},
    }
    return {
        "$schema": DRAFT,
        "$id": "https://winml-recipes.dev/schemas/manifest.schema.json",
        "title": "winml-recipes build manifest",
        **schema,
    }


def _described(prop: dict[str, Any]) -> dict[str, Any]:
    return {"description": prop["description"]} if "description" in prop else {}


def _contract_tensors(contract: dict[str, Any]) -> None:
    """A manifest's recorded inputs and outputs take the catalog's tensor schema, with
    image.size always written as [height, width] (engine.run.contract_record)."""
    inputs, outputs = _tensor_schema(False), _tensor_schema(True)
    size = inputs["properties"]["image"]["properties"]["size"]
    inputs["properties"]["image"]["properties"]["size"] = {
        "description": size["description"],
        **size["anyOf"][1],
    }
    contract["properties"]["inputs"]["additionalProperties"] = inputs
    contract["properties"]["outputs"]["additionalProperties"] = outputs


def report_schema() -> dict[str, Any]:
    """The JSON report of `build --report` / `matrix --report` (exec/matrix.py)."""
    number = {"type": "number", "minimum": 0}
    maybe_number = {"type": ["number", "null"]}
    maybe_text = {"type": ["string", "null"]}
    resources = {
        "type": "object",
        "description": "What the scheduler granted (Ray: CPU, memory in bytes).",
        "additionalProperties": {"type": "number"},
    }
    target = {
        "type": "object",
        "additionalProperties": False,
        "required": ["recipe", "device", "precision", "status", "exit_code", "error"],
        "properties": {
            "recipe": {"type": "string", "description": "The recipe file as given."},
            "name": maybe_text,
            "device": maybe_text,
            "precision": maybe_text,
            "ep": {
                **maybe_text,
                "description": "The EP the recipe's target names (null: the device's default).",
            },
            "status": {"enum": ["ok", "failed", "not run"]},
            "exit_code": {"enum": [0, 1, 2, 3]},
            "error": {**maybe_text, "description": "One line: where, what, what to do."},
            "failing_step": {**maybe_text, "description": "component/step"},
            "error_data": {
                "type": "object",
                "description": "The error's structured detail, e.g. bisection {culprit, nodes, "
                "loads} and cpu_op_affinity when the EP could not finalize the graph.",
            },
            "wall_seconds": number,
            "output_dir": maybe_text,
            "manifest_path": maybe_text,
            "evidence_dir": {
                **maybe_text,
                "description": "failed: the .failed folder holding the models made so far "
                "and a manifest with status failed (null: nothing ran, or none was kept).",
            },
            "metrics": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "size_mb": number,
                    "min_sqnr_db": maybe_number,
                    "steps_ran": {"type": "integer", "minimum": 0},
                    "steps_cached": {"type": "integer", "minimum": 0},
                    "build_seconds": number,
                },
            },
            "worker_pid": {"type": ["integer", "null"]},
            "started_at": {**maybe_number, "description": "Epoch seconds."},
            "finished_at": maybe_number,
            "resources": resources,
        },
    }
    task = {
        "type": "object",
        "additionalProperties": False,
        "required": ["id", "kind", "label", "targets", "needs", "status", "attempts"],
        "properties": {
            "id": {"type": "string"},
            "kind": {"enum": ["steps", "assemble"]},
            "label": {"type": "string"},
            "component": maybe_text,
            "steps": {"type": "array", "items": {"type": "integer", "minimum": 0}},
            "targets": {
                "type": "array",
                "items": {"type": "integer", "minimum": 0},
                "description": "Indices into `targets` of the targets that need this task.",
            },
            "needs": {"type": "array", "items": {"type": "string"}},
            "status": {"enum": ["ok", "failed", "not run", "waiting", "running"]},
            "attempts": {"type": "integer", "minimum": 0},
            "memory_mb": {**number, "description": "What the task declared it expects."},
            "worker_pid": {"type": ["integer", "null"]},
            "started_at": maybe_number,
            "finished_at": maybe_number,
            "wall_seconds": number,
            "resources": resources,
        },
    }
    return {
        "$schema": DRAFT,
        "title": "winml-recipes build report",
        "type": "object",
        "additionalProperties": False,
        "required": ["report_version", "status", "exit_code", "executor", "targets", "tasks"],
        "properties": {
            "report_version": {"const": 1},
            "status": {"enum": ["ok", "failed", "interrupted"]},
            "exit_code": {"enum": [0, 1, 2, 3, 130]},
            "executor": {"enum": ["local", "pool", "ray"]},
            "wall_seconds": number,
            "startup_seconds": number,
            "error": maybe_text,
            "targets": {"type": "array", "items": target},
            "tasks": {"type": "array", "items": task},
        },
    }


SCHEMAS = {
    "recipe": recipe_schema,
    "catalog": catalog_schema,
    "manifest": manifest_schema,
    "report": report_schema,
}


def render(name: str) -> str:
    return json.dumps(SCHEMAS[name](), indent=2) + "\n"


def write_all(directory: Path) -> list[Path]:
    """Write every schema as <name>.schema.json; returns the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name in SCHEMAS:
        path = directory / f"{name}.schema.json"
        path.write_text(render(name))
        written.append(path)
    return written


_SQNR_PER_OUTPUT = {
    "type": "object",
    "additionalProperties": {"type": "number"},
    "description": "Worst-sample SQNR (dB) against the float model, per graph output.",
}
GATES: dict[str, Any] = {
    "type": "array",
    "description": "verify: every gate the outputs were held to (sdk/gates.py).",
    "items": {
        "type": "object",
        "additionalProperties": False,
        "required": ["output", "metric", "value", "threshold", "comparison", "margin", "passed"],
        "properties": {
            "output": {"type": "string"},
            "metric": {"type": "string", "description": "sqnr_db, cosine, max_abs, ..."},
            "value": {"type": "number"},
            "threshold": {"type": "number"},
            "comparison": {"enum": [">=", "<="]},
            "margin": {"type": "number", "description": "Inside the threshold when positive."},
            "passed": {"type": "boolean"},
            "kind": {
                "type": "string",
                "description": "What the output is, where that chose the gate (probability map).",
            },
            "advisory": {
                "type": "boolean",
                "description": "Shown, not enforced: the task metric's gates decide "
                "(verify.task_decides).",
            },
        },
    },
}


MIXED_PRECISION_AUTO: dict[str, Any] = {
    "type": "object",
    "description": "What automatic mixed precision promoted, why, and each round's score.",
    "additionalProperties": False,
    "properties": {
        "target_sqnr_db": {"type": "number"},
        "max_promoted": {"type": "integer"},
        "type": {"type": "string", "description": "The 16-bit type activations go to."},
        "scored_on": {"type": "string", "description": "EP the rounds were scored on."},
        "held_out_data": {
            "type": "string",
            "description": "The data the rounds were scored on (never calibration samples).",
        },
        "ranked_on": {"type": "string", "description": "EP the damage ranking ran on."},
        "candidate_kinds": {
            "type": "array",
            "items": {"enum": ["activation-16bit", "float-node"]},
            "description": "Candidate kinds this target allows (float-node: CPU only).",
        },
        "output_sqnr_db_weights_only": {
            "type": "number",
            "description": "Worst output SQNR with only the weights quantized.",
        },
        "promoted": {
            "type": "array",
            "description": "Promotions, most damaging first.",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["tensor", "to"],
                "properties": {
                    "tensor": {"type": "string", "description": "Activation or weight."},
                    "kind": {"enum": ["activation-16bit", "float-node"]},
                    "to": {"type": "string", "description": "A 16-bit type, or float."},
                    "round": {"type": "integer", "description": "The round that applied it."},
                    "nodes": {
                        "type": "array",
                        "items": {"type": "string"},
                        "description": "float-node: the nodes kept in float.",
                    },
                    "output_sqnr_db_if_only_this_is_quantized": {
                        "type": ["number", "null"],
                        "description": "The damage measured for this tensor alone (worst "
                        "output SQNR, dB; null for a shared-encoding partner).",
                    },
                },
            },
        },
        "rounds": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "round": {"type": "integer"},
                    "promoted": {"type": "integer", "description": "Promotions so far."},
                    "added": {"type": "array", "items": {"type": "string"}},
                    "output_sqnr_db": _SQNR_PER_OUTPUT,
                    "rejected": {"type": "array", "items": {"type": "string"}},
                    "error": {"type": "string", "description": "Why the EP rejected it."},
                },
            },
        },
        "met": {"type": "boolean"},
        "reason": {"type": "string"},
        "seconds": {
            "type": "object",
            "additionalProperties": {"type": "number"},
            "description": "Wall seconds per phase: reference, scoring, ranking, requantizing.",
        },
    },
}
