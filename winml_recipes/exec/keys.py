"""Plan keys: what identifies a step before it runs (see exec/graph.py).

A plan key is the step's `StepIdentity` (engine/identity.py, the same one its cache key
hashes) with the input model's digest replaced by the plan key of the step that makes it
and each component it reads by that component's last plan key; the chain starts at a root
key of the component's source. The skip reason is added (a skipped step passes its input
on). Extra material a pass adds to its cache key (`Pass.key_material`: digests of the data
files its options name, the execution provider of its target) is a function of those
within one run, as the SDK asks, and the reference of the chain is one of its plan keys.
Two steps with one plan key compute the same thing in one run; the cache key (which hashes
the actual input's bytes) still decides what is reused across runs.
"""

from __future__ import annotations

import hashlib
from typing import Any

from winml_recipes.engine.identity import contract_key, identify
from winml_recipes.engine.plan import Plan
from winml_recipes.engine.resolve import canonical_json


def _digest(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def plan_keys(plan: Plan) -> dict[str, list[str]]:
    """Per component, the plan key of each step (see the module docstring)."""
    keys: dict[str, list[str]] = {}
    roots: dict[str, str] = {}
    feeding = plan.feeding
    for comp in plan.components:  # build order: what a step reads is keyed before it
        key = _digest(
            {
                "source": [comp.source.kind, comp.source.digest, comp.source.revision],
                "recipe_dir": str(plan.recipe.path.parent.resolve()),
                "contract": contract_key(comp.contract),
                "feeds_downstream": comp.name in feeding,
                "seed": plan.recipe.seed,
            }
        )
        roots[comp.name] = key
        chain = []
        for step in comp.steps:
            impl = step.impl
            deps = () if step.skip else impl.depends_on(step.config)
            identity = identify(
                step.name,
                impl,
                step.options,
                target=plan.target,
                contract=comp.contract,
                seed=plan.recipe.seed,
                input=key,
                reference=None,  # a function of the chain before it: `input` holds it
                # a component without steps is its source
                upstream={d: (keys[d] or [roots[d]])[-1] for d in deps},
            )
            # not the module: a pass defined in a script is `__main__` in the driver
            # and `__mp_main__` in a pool process
            key = _digest(
                {"step": identity.key(), "class": type(impl).__qualname__, "skip": step.skip}
            )
            chain.append(key)
        keys[comp.name] = chain
    return keys


def plan_fingerprint(plan: Plan) -> str:
    """The rendered recipe's digest and every plan key: a worker whose own plan of the
    target has another fingerprint planned something else (the recipe changed)."""
    return _digest({"recipe": plan.recipe.sha256, "keys": plan_keys(plan)})
