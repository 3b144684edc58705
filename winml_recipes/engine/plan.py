"""Plan: per component, ordered steps bound to pass implementations, with skip reasons."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, replace
from typing import Any

from winml_recipes.engine.resolve import resolve_source, source_facts
from winml_recipes.recipe import Recipe
from winml_recipes.sdk.contract import IOContract
from winml_recipes.sdk.errors import PlanError, WinmlError
from winml_recipes.sdk.passes import Pass, describe_support, get_pass, pass_making
from winml_recipes.sdk.target import Target
from winml_recipes.sdk.types import ModelFacts, PlanContext, Source

# The standalone command (cli/models.py) that rewrites a quantized file into float; a command, not
# a pass: the passes a hint names come from what they declare (`Pass.makes`).
DEQUANTIZE_COMMAND = "winml-recipes dequantize"


@dataclass
class PlannedStep:
    index: int
    name: str
    impl: Pass
    options: dict[str, Any]  # as the recipe gives them, with the defaults filled in
    config: Any  # the pass's typed config built from them (what the pass receives)
    skip: str | None
    facts_in: ModelFacts
    line: int = 0


@dataclass
class ComponentPlan:
    name: str
    source: Source
    contract: IOContract
    facts: ModelFacts
    steps: list[PlannedStep] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # advice for the person building it

    @property
    def depends_on(self) -> tuple[str, ...]:
        out: list[str] = []
        for s in self.steps:
            out += [d for d in s.impl.depends_on(s.config) if d not in out]
        return tuple(out)

    @property
    def checked_first(self) -> int:
        """How many of the first steps run before any component's later steps: up to and
        including the last fail-fast step that runs (`Pass.fail_fast`), unless one of them
        reads another component (then 0: the chain runs in dependency order)."""
        last = max(
            (i for i, s in enumerate(self.steps) if s.skip is None and s.impl.fail_fast),
            default=-1,
        )
        early = self.steps[: last + 1]
        if any(s.skip is None and s.impl.depends_on(s.config) for s in early):
            return 0
        return len(early)


@dataclass
class Plan:
    recipe: Recipe
    target: Target
    components: list[ComponentPlan]  # in build order (dependencies first)

    @property
    def notes(self) -> tuple[str, ...]:
        """Advice from planning (nothing wrong enough to refuse the build)."""
        return tuple(n for c in self.components for n in c.notes)

    @property
    def feeding(self) -> set[str]:
        """Components whose outputs another component's steps read (inputs_from)."""
        return {
            dep
            for c in self.components
            for s in c.steps
            if not s.skip
            for dep in s.impl.depends_on(s.config)
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "recipe": self.recipe.name,
            "target": self.target.to_dict(),
            "components": {
                c.name: {
                    "source": c.source.to_manifest(),
                    "facts": {
                        "quantized": c.facts.quantized,
                        "quantization": c.facts.quant_summary,
                        "normalized": c.facts.normalized,
                    },
                    "steps": [
                        {"pass": s.name, "options": s.options}
                        | ({"skip": s.skip} if s.skip else {})
                        for s in c.steps
                    ],
                    # its first steps, run before any component's later ones (fail fast)
                    "checked_first": c.checked_first,
                }
                | ({"notes": list(c.notes)} if c.notes else {})
                for c in self.components
            },
        }


def with_defaults(impl: Pass, options: dict[str, Any]) -> dict[str, Any]:
    """Fill top-level defaults from the options schema, so equal configs share a cache key."""
    out = {
        k: v["default"]
        for k, v in impl.options_schema.get("properties", {}).items()
        if isinstance(v, dict) and "default" in v
    }
    out.update(options)
    return out


def make_plan(recipe: Recipe, *, fetch: bool = True) -> Plan:
    """Plan every component; fetch=False checks the recipe without downloading sources."""
    target = recipe.target
    names = tuple(recipe.components)
    components = [
        _plan_component(recipe, cname, steps, names, fetch)
        for cname, steps in recipe.components.items()
    ]
    return Plan(recipe, target, _build_order(components, recipe))


def _plan_component(
    recipe: Recipe, cname: str, steps: tuple, names: tuple[str, ...], fetch: bool
) -> ComponentPlan:
    target = recipe.target
    comp = recipe.catalog.components[cname]
    source = resolve_source(recipe.catalog, comp, fetch=fetch, name=recipe.source)
    contract = replace(comp.contract, dims={**comp.contract.dims, **recipe.dims[cname]})
    facts = source_facts(source)
    plan = ComponentPlan(cname, source, contract, facts)
    pctx = PlanContext(cname, target, contract, recipe.path.parent, names)
    seen: set[str] = set()
    for i, step in enumerate(steps):
        where = f"{recipe.path}:{step.line}" if step.line else f"{recipe.path}"
        try:
            impl = get_pass(step.name)
            if not impl.supports(target):
                devs, precs = describe_support(type(impl))
                raise PlanError(
                    f"{cname}: pass '{step.name}' does not support {target.device}/"
                    f"{target.precision} (devices: {devs}; precisions: {precs})"
                )
            options = with_defaults(impl, step.options)
            config = impl.make_config(options)
            impl.check(config, pctx)
            # Declared constraints, the same for every pass (the planner names none).
            if impl.once_per_component and step.name in seen:
                raise PlanError(f"{cname}: two {step.name} steps; keep one (once per component)")
            seen.add(step.name)
            if impl.needs_float_input and facts.quantized and not step.from_presets:
                raise PlanError(
                    f"{cname}: {step.name} on an already-quantized model "
                    f"({facts.quant_summary}); add a {pass_making('float')} step before it"
                )
        except WinmlError as exc:
            raise PlanError(exc.message, where=exc.where or where) from None
        skip = impl.skip_reason(facts, config, target)
        plan.steps.append(PlannedStep(i, step.name, impl, options, config, skip, facts, step.line))
        if skip is None:
            facts = impl.facts_after(facts, config)
    _complete_from_later_steps(plan, recipe)
    plan.notes += _missing_ep_rewrites(plan, target)
    reads = [r for s in plan.steps if s.skip is None for r in s.impl.data_reads(s.config)]
    if reads:
        from winml_recipes.feeds import check_disjoint

        check_disjoint(reads, contract, recipe.path.parent, cname, str(recipe.path))
        if any(s.impl.pins_shapes and s.skip is None for s in plan.steps):
            _check_fixed_sizes(plan, contract, recipe, cname)
    mismatch = _precision_mismatch(facts, target)
    if mismatch:
        raise PlanError(f"{cname}: {mismatch}", where=str(recipe.path))
    if not facts.is_onnx:
        raise PlanError(
            f"{cname}: source {source.ref} is not ONNX and no step exports it; "
            f"add '{pass_making('onnx')}' as the first step",
            where=str(recipe.path),
        )
    return plan


def _check_fixed_sizes(
    plan: ComponentPlan, contract: IOContract, recipe: Recipe, cname: str
) -> None:
    """npz data of a component whose shapes a step pins (`Pass.pins_shapes`): every array
    at the size the model is built at (the catalog's and recipe's dims), checked before the
    first step. Without this a wrong height passed the plan (a dim left free) and failed at
    verify, after every step had run."""
    from winml_recipes.feeds import check_npz, npz_files

    for step in plan.steps:
        if step.skip is not None:
            continue
        for read in step.impl.data_reads(step.config):
            if "npz" not in read.source:
                continue
            what = f"{step.name} npz"
            files = npz_files(read.source["npz"], recipe.path.parent, what)
            try:
                check_npz(files, contract, what, exact_dims=True)
            except WinmlError as exc:
                raise PlanError(
                    f"{cname}: {exc.message} (the build fixes the model's shapes to these dims)",
                    where=str(recipe.path),
                ) from None


def _complete_from_later_steps(plan: ComponentPlan, recipe: Recipe) -> None:
    """Each step's options completed from the steps after it (`Pass.with_later_steps`),
    its config rebuilt from them, and its skip reason when they leave it nothing to do."""
    from winml_recipes.sdk.types import LaterStep

    for i, step in enumerate(plan.steps):
        if step.skip is not None:
            continue
        later = [LaterStep(s.impl, s.options, s.config, s.skip) for s in plan.steps[i + 1 :]]
        options, skip = step.impl.with_later_steps(dict(step.options), later)
        if options != step.options:
            where = f"{recipe.path}:{step.line}" if step.line else f"{recipe.path}"
            try:
                step.config = step.impl.make_config(options)
            except WinmlError as exc:
                raise PlanError(exc.message, where=exc.where or where) from None
            step.options = options
        step.skip = skip


def _missing_ep_rewrites(plan: ComponentPlan, target: Target) -> list[str]:
    """A note when a step quantizes for an EP that has exact float rewrites (its plugin's
    `GraphRules`) and no earlier step applies them (`Pass.makes` "ep_prepared"): a recipe
    with its own step list would otherwise lose them without a word."""
    from winml_recipes.sdk.ep import get_ep

    if not target.execution_provider:
        return []
    rules = get_ep(target.execution_provider).graph_rules()
    if rules is None:
        return []
    for step in plan.steps:
        if "ep_prepared" in step.impl.makes:
            return []  # listed, even with no stages: the recipe said what it wants
        if step.skip is None and "integer" in step.impl.makes:
            maker = pass_making("ep_prepared")
            return [
                f"{plan.name}: no '{maker}' step before '{step.name}': the "
                f"{target.execution_provider} plugin's float rewrites ({rules.name}) are not "
                f"applied; list '{maker}' before '{step.name}' (or `{maker}: {{stages: []}}` "
                f"to say it is meant)"
            ]
    return []


def _precision_mismatch(facts: ModelFacts, target) -> str | None:
    """Why the planned output is not the target's precision (None: it is).

    An already-quantized source that no step dequantizes keeps its own types; an output
    folder named npu-w8a16 holding an int8/int8 QDQ model would say what it is not.
    """
    from winml_recipes.presets import precision_settings, precisions

    if not facts.quantized:
        return None
    want = precision_settings(target.precision)
    have = f"{facts.quant_summary}"
    matching = [p for p in precisions() if _has_precision(facts, precision_settings(p))]
    if want.get("kind") == "integer" and target.precision in matching:
        return None
    if want.get("kind") == "integer":
        asks = f"{want['activation_type']} activations and {want['weight_type']} weights"
    else:
        asks = f"a {target.precision} model"
    other = f", or build the precision it has (--precision {matching[0]})" if matching else ""
    return (
        f"the output would stay as quantized as the source ({have}), but target "
        f"{target.device}/{target.precision} asks for {asks}; add a {pass_making('float')} step "
        f"before {pass_making('integer')} to requantize it (or run `{DEQUANTIZE_COMMAND}` on "
        f"the file first){other}"
    )


def _has_precision(facts: ModelFacts, settings: dict) -> bool:
    """Whether a quantized source is already of an integer precision's types. Constants
    quantized at the activation type are allowed beside the weight type: EP rules quantize
    elementwise constants (a LayerNorm's scale, an added bias) like activations (this tool's
    own npu/w8a16 output holds uint16 constants beside its uint8 weights)."""
    if settings.get("kind") != "integer":
        return False
    weight, activation = settings["weight_type"], settings["activation_type"]
    weights = set(facts.weight_dtypes)
    return (
        set(facts.activation_dtypes) <= {activation}
        and weights <= {weight, activation}
        and (not weights or weight in weights)
    )


def _build_order(components: list[ComponentPlan], recipe: Recipe) -> list[ComponentPlan]:
    """Dependencies first, otherwise catalog order; unknown names and cycles are errors."""
    by_name = {c.name: c for c in components}
    for c in components:
        for dep in c.depends_on:
            if dep not in by_name:
                close = difflib.get_close_matches(dep, list(by_name), n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                raise PlanError(
                    f"{c.name}: inputs_from '{dep}' is not a component{hint}; "
                    f"components: {', '.join(by_name)}",
                    where=str(recipe.path),
                )
            if dep == c.name:
                raise PlanError(
                    f"{c.name}: inputs_from names the component itself", where=str(recipe.path)
                )
    ordered: list[ComponentPlan] = []
    visiting: list[str] = []

    def visit(c: ComponentPlan) -> None:
        if c in ordered:
            return
        if c.name in visiting:
            cycle = " -> ".join([*visiting[visiting.index(c.name) :], c.name])
            raise PlanError(f"inputs_from cycle: {cycle}", where=str(recipe.path))
        visiting.append(c.name)
        for dep in c.depends_on:
            visit(by_name[dep])
        visiting.pop()
        ordered.append(c)

    for c in components:
        visit(c)
    return ordered
