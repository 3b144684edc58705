"""Typed data that flows between the engine and passes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from winml_recipes.sdk.contract import IOContract
from winml_recipes.sdk.target import Target


@dataclass(frozen=True)
class Source:
    """Where a component's model comes from, after classification."""

    kind: str  # "onnx" (local file) | "export" (HF id, HF dir or random config) | "hub_onnx"
    ref: str  # human-readable reference for messages and the manifest
    path: Path | None = None  # local .onnx for kind == "onnx"
    revision: str | None = None
    export: Mapping[str, Any] | None = None  # ExportRequest fields for kind == "export"
    digest: str = ""  # content digest: file sha256, or hash of the canonical export spec

    def to_manifest(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "ref": self.ref, "sha256": self.digest}
        if self.revision:
            out["revision"] = self.revision
        return out


@dataclass(frozen=True)
class ModelFacts:
    """Facts about a model, computed once before planning and carried along the plan.

    Each pass declares how it changes them (`Pass.facts_after`), so the plan can decide
    every skip up front without loading a model twice.
    """

    is_onnx: bool
    quantized: bool = False
    quant_summary: str = ""  # e.g. "QOperator: ConvInteger x9"
    activation_dtypes: tuple[str, ...] = ()  # of a quantized model's activations
    weight_dtypes: tuple[str, ...] = ()
    normalized: bool = False
    normalized_why: str = ""  # e.g. "stamp matches the graph fingerprint"
    opset: int | None = None
    external_data: bool = False
    size_bytes: int = 0
    dynamic_dims: tuple[str, ...] | None = None  # None: unknown until the model exists
    inputs: tuple[str, ...] = ()  # graph input names (empty until the model exists)
    outputs: tuple[str, ...] = ()
    has_reference: bool = False  # a float reference exists to verify against

    def evolve(self, **changes: Any) -> ModelFacts:
        return replace(self, **changes)


@dataclass(frozen=True)
class UpstreamComponent:
    """A component built earlier in the same build, seen by the steps that depend on it."""

    name: str
    model: Path  # its float reference model
    digest: str
    contract: IOContract
    # The data options its own sample-input step ran its model on (`Pass.sample_inputs`,
    # e.g. quantize's calibration), when it has one: a downstream component draws the same way.
    calibration: Mapping[str, Any] | None
    # The float model that step ran (after normalize, fix_shapes, ...): feeding a
    # downstream calibration from it reuses the outputs that step stored.
    calibrated_model: Path | None = None
    calibrated_digest: str | None = None
    # The model its judging step (verify) ran as the candidate, and its digest: what a
    # cross-component metric (verify.zero_shot_with) runs beside this step's own candidate.
    candidate: Path | None = None
    candidate_digest: str | None = None

    def for_calibration(self) -> tuple[Path, str]:
        """(model, digest) that produces a downstream component's calibration inputs."""
        if self.calibrated_model is not None and self.calibrated_digest is not None:
            return self.calibrated_model, self.calibrated_digest
        return self.model, self.digest


@dataclass(frozen=True)
class LaterStep:
    """A step planned after another in the same component (`Pass.with_later_steps`)."""

    impl: Any  # its Pass
    options: Mapping[str, Any]  # as the recipe gives them, with the defaults filled in
    config: Any  # the pass's typed config
    skip: str | None  # why it does nothing (None: it runs)


@dataclass(frozen=True)
class PlanContext:
    """What a pass may know when its options are checked at plan time."""

    component: str
    target: Target
    contract: IOContract
    recipe_dir: Path
    components: tuple[str, ...]  # every component of the catalog entry


@dataclass(frozen=True)
class StepContext:
    """What a pass may know about the step it runs in."""

    component: str
    step_index: int
    target: Target
    contract: IOContract
    source: Source
    reference: Path | None  # the component's float reference model, when one exists
    work_dir: Path  # scratch space, removed after the step
    input_digest: str = ""  # content digest of the step's input model
    reference_digest: str | None = None
    # Another component feeds on this one's outputs (inputs_from): worth storing them.
    feeds_downstream: bool = False
    recipe_dir: Path = Path(".")
    seed: int = 0
    upstream: Mapping[str, UpstreamComponent] = field(default_factory=dict)
    # Where content-addressed intermediate data may be kept (None: the cache is off).
    store: Path | None = None
    task: str | None = None  # the catalog entry's task (mask-generation, ...)
    # progress(what, done, total): counts for the person watching (samples, rounds, ...).
    progress: Callable[[str, int, int | None], None] = field(default=lambda *_: None)
    budget_mb: float | None = None  # the build's memory budget (None: not known)
    input_model: Path | None = None  # the step's input model file (for key material)


@dataclass(frozen=True)
class DataRead:
    """Data files a step reads: `source` holds one of npz / images / dataset (as in the
    options); `role` is "calibration" or "held_out"; the first `skip` samples are left
    out and at most `samples` read (None: all)."""

    role: str
    source: Mapping[str, str]
    skip: int = 0
    samples: int | None = None
    allow_overlap: bool = False  # held-out data the user insists on (a warning, not an error)


@dataclass
class StepResult:
    """What a pass returns: a new model (or None when it only measures) and metrics."""

    model: Path | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None  # set when the pass found nothing to do (the reason)
    # Files (names inside the step's output directory) shipped beside the component's model,
    # e.g. a compiled EPContext model and its context binary. Kept until a later step
    # produces a new model.
    artifacts: tuple[str, ...] = ()
    # False: the output ships the artifacts only, not the model the chain carries.
    ship_model: bool = True
