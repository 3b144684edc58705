"""Pass plugins: a decorator for built-ins and the `winml_recipes.passes` entry-point group."""

from __future__ import annotations

import dataclasses
import difflib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar, get_args, get_origin

from winml_recipes.sdk.config import build_config, config_schema
from winml_recipes.sdk.errors import PlanError, check_known
from winml_recipes.sdk.estimates import EstimateInputs, MemoryEstimate
from winml_recipes.sdk.plugins import check_available, load_entry_points
from winml_recipes.sdk.target import Target
from winml_recipes.sdk.types import (
    DataRead,
    LaterStep,
    ModelFacts,
    PlanContext,
    StepContext,
    StepResult,
)

ENTRY_POINT_GROUP = "winml_recipes.passes"
ANY = frozenset({"*"})

ConfigT = TypeVar("ConfigT")


class Pass(ABC, Generic[ConfigT]):
    """A build step: one typed config plus one run method.

    `class MyPass(Pass[MyConfig])` with a frozen dataclass `MyConfig` (see sdk.config):
    the options schema is generated from it, and every method receives a `MyConfig`. A pass
    that declares no config class states `options_schema` by hand and receives the options
    as a dict.
    """

    name: ClassVar[str]
    version: ClassVar[int] = 1
    summary: ClassVar[str] = ""
    config_type: ClassVar[type | None] = None  # set from Pass[Config]
    options_schema: ClassVar[dict[str, Any]] = {"type": "object", "properties": {}}
    devices: ClassVar[frozenset[str]] = ANY
    precisions: ClassVar[frozenset[str]] = ANY
    # Passes that measure against the float reference put its digest into their cache key.
    uses_reference: ClassVar[bool] = False
    # Passes that read the catalog I/O contract put it into their cache key.
    uses_contract: ClassVar[bool] = False
    # Passes whose output is the float reference later steps are verified against.
    produces_reference: ClassVar[bool] = False
    # Passes that judge the model they get (verify): a downstream step that reads this
    # component (depends_on) sees that model as its `UpstreamComponent.candidate`.
    judges_candidate: ClassVar[bool] = False
    # False for passes whose output does not depend on the device/precision: their cache
    # entries are shared by every target (an export is reused by cpu and npu builds).
    target_dependent: ClassVar[bool] = True
    # Declared constraints the planner enforces for any pass: at most one such step per
    # component; a recipe step on a quantized input is an error (preset steps skip instead).
    once_per_component: ClassVar[bool] = False
    needs_float_input: ClassVar[bool] = False
    # What the pass makes of a model, for the planner's hints ("add an X step"): "onnx" (the
    # model, from a source that is not ONNX yet), "float" (a float model from a quantized
    # one), "integer" (a quantized model from a float one).
    makes: ClassVar[frozenset[str]] = frozenset()
    # The config field holding the data options (npz, images, inputs_from, ...) on which
    # the step runs the component's model, e.g. to calibrate. A component whose steps read
    # this one (depends_on) draws its inputs the same way, from the model this step ran.
    sample_inputs: ClassVar[str | None] = None
    # A check that fails fast: in a target's build, every component's steps up to and
    # including such a step (when it runs) come before any component's later steps, so
    # what it checks fails the build before any expensive step (calibration) starts.
    fail_fast: ClassVar[bool] = False
    # The pass makes the model's shapes static at the contract's dims: the planner then
    # checks the steps' npz data at exactly that size before anything runs.
    pins_shapes: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Only the class's own bases: a subclass of a configured pass keeps what it inherits.
        for base in cls.__dict__.get("__orig_bases__", ()):
            origin, args = get_origin(base), get_args(base)
            if not (isinstance(origin, type) and issubclass(origin, Pass) and args):
                continue
            if dataclasses.is_dataclass(args[0]) and isinstance(args[0], type):
                cls.config_type = args[0]
                cls.options_schema = config_schema(args[0])

    def make_config(self, options: dict[str, Any]) -> ConfigT:
        """The config object for options the schema accepted (a dict without a config class)."""
        if self.config_type is None:
            return dict(options)  # type: ignore[return-value]
        return build_config(self.config_type, options, self.name)

    def supports(self, target: Target) -> bool:
        return (self.devices == ANY or target.device in self.devices) and (
            self.precisions == ANY or target.precision in self.precisions
        )

    def skip_reason(self, facts: ModelFacts, config: ConfigT, target: Target) -> str | None:
        """Why this step does nothing for a model with these facts (None: it runs)."""
        return None

    def check(self, config: ConfigT, ctx: PlanContext) -> None:
        """Refuse contradictory options at plan time (raise PlanError saying what to change)."""
        return None

    def depends_on(self, config: ConfigT) -> tuple[str, ...]:
        """Components whose float model this step reads (they are built first)."""
        return ()

    def data_reads(self, config: ConfigT) -> list[DataRead]:
        """The data files this step reads, and what for (the planner refuses held-out
        samples that are also calibration samples)."""
        return []

    def key_material(self, config: ConfigT, ctx: StepContext) -> Any:
        """Extra cache-key material (e.g. digests of data files the options point to)."""
        return None

    def estimate_memory(
        self, src: Path, config: ConfigT, inputs: EstimateInputs
    ) -> MemoryEstimate | None:
        """Expected peak memory of this step on input `src` (None: no estimate).

        Checked against the build's memory budget before the step runs. Build it with
        `engine.budget.forward_estimate` / `rewrite_estimate`.
        """
        return None

    def facts_after(self, facts: ModelFacts, config: ConfigT) -> ModelFacts:
        """The facts of this step's output, predicted at plan time."""
        return facts

    def opens_on_target(self, config: ConfigT) -> bool:
        """Whether the step opens the component's model on the target's execution
        provider (verify on the target, compile): what a fail-fast check can check first."""
        return False

    def allows_cpu_fallback(self, config: ConfigT) -> bool:
        """Whether, opening the model on the target's EP, the step lets refused nodes run
        on the CPU EP."""
        return False

    def held_to(self, config: ConfigT) -> dict[str, Any] | None:
        """The gates this step holds the model it gets to, as `sdk.held_to.HeldTo` options,
        for a step before it that chooses between candidates (None: it judges nothing)."""
        return None

    def with_later_steps(
        self, options: dict[str, Any], later: Sequence[LaterStep]
    ) -> tuple[dict[str, Any], str | None]:
        """The step's options completed from the steps after it in its component (planned,
        with their skip reasons), and why it does nothing because of them (None: it runs).
        Options it fills are part of its cache key and manifest record like the recipe's."""
        return options, None

    @abstractmethod
    def run(self, src: Path | None, out_dir: Path, config: ConfigT, ctx: StepContext) -> StepResult:
        """Read `src` (None only for steps that create the model), write into `out_dir`."""


_REGISTRY: dict[str, type[Pass]] = {}
_loaded = False


def register(cls: type[Pass]) -> type[Pass]:
    """Class decorator registering a built-in pass."""
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise PlanError(f"pass '{cls.name}' registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def _load() -> None:
    """Every pass, built-in or third-party, comes from the same entry-point group (the
    built-ins are declared in pyproject.toml), so the engine imports no pass by name."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    found = load_entry_points(
        ENTRY_POINT_GROUP,
        lambda cls: isinstance(cls, type) and issubclass(cls, Pass),
        "a Pass",
        claims=lambda cls: (cls.name,),
    )
    for cls in found.values():
        register(cls)
    if not _REGISTRY:
        raise PlanError(
            f"no passes registered: the {ENTRY_POINT_GROUP} entry points are missing; "
            "install winml-recipes (pip install -e . in a checkout, or make install)"
        )


def all_passes() -> dict[str, type[Pass]]:
    _load()
    return dict(sorted(_REGISTRY.items()))


def get_pass(name: str) -> Pass:
    passes = all_passes()
    if name not in passes:
        check_available(ENTRY_POINT_GROUP, name, "pass")
    check_known(name, list(passes), "pass")
    return passes[name]()


def sample_inputs_of(impl: Pass, config: Any) -> dict[str, Any] | None:
    """The data options a step runs its component's model on (None: it runs it on none).

    Read from the config field the pass names in `sample_inputs`; the options it leaves
    unset are left out ({} when none is set: seeded inputs from the I/O contract).
    """
    if impl.sample_inputs is None:
        return None
    value = (
        config.get(impl.sample_inputs)
        if isinstance(config, dict)
        else getattr(config, impl.sample_inputs)
    )
    if value is None:
        return {}
    if dataclasses.is_dataclass(value):
        value = vars(value)
    return {k: v for k, v in dict(value).items() if v is not None}


def pass_making(what: str) -> str:
    """The name of a registered pass that makes `what` (see `Pass.makes`), for hints."""
    names = [name for name, cls in all_passes().items() if what in cls.makes]
    return names[0] if names else f"<a pass making {what}>"


def check_component(name: str, ctx: PlanContext, option: str) -> None:
    """An option naming another component must name one of the catalog entry's."""
    if name in ctx.components:
        if name == ctx.component:
            raise PlanError(f"{option}: '{name}' is this component itself")
        return
    close = difflib.get_close_matches(name, list(ctx.components), n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    raise PlanError(
        f"{option}: unknown component '{name}'{hint}; components: {', '.join(ctx.components)}"
    )


def describe_support(cls: type[Pass]) -> tuple[str, str]:
    devs = "any" if cls.devices == ANY else ", ".join(sorted(cls.devices))
    precs = "any" if cls.precisions == ANY else ", ".join(sorted(cls.precisions))
    return devs, precs


def model_file(out_dir: Path) -> Path:
    """The conventional model path inside a step's output directory."""
    return out_dir / "model.onnx"
