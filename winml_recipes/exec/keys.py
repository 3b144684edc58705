"""Plan keys: what identifies a step before it runs (see exec/graph.py).

A plan key hashes what the step's cache key will hold, with the digest of the step's input
model replaced by the plan key of the step that makes it. Two steps with one plan key
compute the same thing in one run; the cache key (which hashes the actual input's bytes)
still decides what is reused across runs.
"""

from __future__ import annotations

import hashlib
from typing import Any

from winml_recipes.engine.plan import Plan


def _digest(value: Any) -> str:
    from winml_recipes.engine.resolve import canonical_json

    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def plan_keys(plan: Plan) -> dict[str, list[str]]:
    """Per component, the plan key of each step (see the module docstring)."""
    from winml_recipes.engine.run import contract_key

    keys: dict[str, list[str]] = {}
    feeding = plan.feeding
    for comp in plan.components:  # build order: what a step reads is keyed before it
        key = _digest(
            {
                "source": [comp.source.kind, comp.source.digest, comp.source.revision],
                "recipe_dir": str(plan.recipe.path.parent.resolve()),
                "contract": contract_key(comp),
                "feeds_downstream": comp.name in feeding,
                "seed": plan.recipe.seed,
            }
        )
        chain = []
        for step in comp.steps:
            impl = step.impl
            deps = () if step.skip else impl.depends_on(step.config)
            key = _digest(
                {
                    "after": key,
                    # not the module: a pass defined in a script is `__main__` in the driver
                    # and `__mp_main__` in a pool process
                    "pass": [step.name, type(impl).__qualname__],
                    "version": impl.version,
                    "options": step.options,
                    "skip": step.skip,
                    "target": [plan.target.device, plan.target.precision]
                    if impl.target_dependent
                    else None,
                    "upstream": {d: keys[d][-1] if keys.get(d) else None for d in deps},
                }
            )
            chain.append(key)
        keys[comp.name] = chain
    return keys
