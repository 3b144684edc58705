"""Plan keys: what identifies a step before it runs (see exec/graph.py).

A plan key hashes what decides a step's cache key, with the digest of the step's input
model replaced by the plan key of the step that makes it: the source, the pass (name,
version, a digest of its code), its options and skip reason, the target when the pass
depends on it, and the plan keys of the components it reads. Extra material a pass adds
to its cache key (`Pass.key_material`: digests of the data files its options name, the
execution provider of its target) is a function of those within one run, as the SDK asks.
Two steps with one plan key compute the same thing in one run; the cache key (which hashes
the actual input's bytes) still decides what is reused across runs.
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
    roots: dict[str, str] = {}
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
        roots[comp.name] = key
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
                    "code": _code(type(impl)),
                    "options": step.options,
                    "skip": step.skip,
                    "target": plan.target.key_parts() if impl.target_dependent else None,
                    # a component without steps is its source
                    "upstream": {d: (keys[d] or [roots[d]])[-1] for d in deps},
                }
            )
            chain.append(key)
        keys[comp.name] = chain
    return keys


def _code(cls: type) -> str | None:
    """The pass's code digest; for a pass defined in a script, its file's bytes (the
    script's module is `__main__` in the driver and `__mp_main__` in a pool process, and
    code_digest hashes module names)."""
    import sys
    from pathlib import Path

    from winml_recipes.engine.code_digest import code_digest

    if cls.__module__ in ("__main__", "__mp_main__"):
        file = getattr(sys.modules.get(cls.__module__), "__file__", None)
        return hashlib.sha256(Path(file).read_bytes()).hexdigest() if file else None
    return code_digest(cls)


def plan_fingerprint(plan: Plan) -> str:
    """The rendered recipe's digest and every plan key: a worker whose own plan of the
    target has another fingerprint planned something else (the recipe changed)."""
    return _digest({"recipe": plan.recipe.sha256, "keys": plan_keys(plan)})
