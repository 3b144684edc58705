"""Plan: per component, ordered steps bound to pass implementations, with skip reasons."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from winml_recipes.engine.registry import Pass, describe_support, get_pass
from winml_recipes.engine.resolve import resolve_source, source_facts
from winml_recipes.engine.types import ModelFacts, Source
from winml_recipes.errors import PlanError, WinmlError
from winml_recipes.presets import Target
from winml_recipes.recipe import Recipe
from winml_recipes.specs import IOContract


@dataclass
class PlannedStep:
    index: int
    name: str
    impl: Pass
    options: dict[str, Any]
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


@dataclass
class Plan:
    recipe: Recipe
    target: Target
    components: list[ComponentPlan]

    def to_dict(self) -> dict[str, Any]:
        return {
            "recipe": self.recipe.name,
            "target": {"device": self.target.device, "precision": self.target.precision},
            "components": {
                c.name: {
                    "source": c.source.to_manifest(),
                    "steps": [
                        {"pass": s.name, "options": s.options}
                        | ({"skip": s.skip} if s.skip else {})
                        for s in c.steps
                    ],
                }
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


def make_plan(recipe: Recipe) -> Plan:
    target = recipe.target
    components = []
    for cname, steps in recipe.components.items():
        comp = recipe.catalog.components[cname]
        source = resolve_source(recipe.catalog, comp)
        contract = replace(comp.contract, dims={**comp.contract.dims, **recipe.dims[cname]})
        facts = source_facts(source)
        plan = ComponentPlan(cname, source, contract, facts)
        for i, step in enumerate(steps):
            where = f"{recipe.path}:{step.line}" if step.line else f"{recipe.path}"
            try:
                impl = get_pass(step.name)
            except WinmlError as exc:
                raise PlanError(exc.message, where=where) from None
            if not impl.supports(target):
                devs, precs = describe_support(type(impl))
                raise PlanError(
                    f"{cname}: pass '{step.name}' does not support {target.device}/"
                    f"{target.precision} (devices: {devs}; precisions: {precs})",
                    where=where,
                )
            options = with_defaults(impl, step.options)
            skip = impl.skip_reason(facts, options, target)
            plan.steps.append(PlannedStep(i, step.name, impl, options, skip, facts, step.line))
            if skip is None:
                facts = impl.facts_after(facts, options)
        if not facts.is_onnx:
            raise PlanError(
                f"{cname}: source {source.ref} is not ONNX and no step exports it; "
                "add 'export' as the first step",
                where=str(recipe.path),
            )
        components.append(plan)
    return Plan(recipe, target, components)
