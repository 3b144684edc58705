"""A step's identity: what decides its output, defined once.

The cache (engine/run.py, the key of an entry), the planner (exec/keys.py, the plan key
that lets targets share a task before anything runs) and the executors (exec/work.py,
exec/graph.py, which compare plan fingerprints) all build a `StepIdentity` with
`identify()` and hash it with `key()`. They differ only in what stands for a model: the
cache gives the sha256 of the actual input (and of the upstream models it reads), the
planner the plan key of the step that will make it.

The key's JSON is the one cache keys were made of before this module existed (same field
names, same canonical JSON, the library versions added), so existing cache entries stay
valid; only passes defined in a script (`__main__`) now hash their file's bytes in both
places (the cache used to hash the module's name, which differs in a pool process).
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from winml_recipes.engine.cache import library_versions
from winml_recipes.engine.code_digest import code_digest
from winml_recipes.engine.resolve import canonical_json
from winml_recipes.sdk.contract import IOContract
from winml_recipes.sdk.passes import Pass
from winml_recipes.sdk.target import Target


@dataclass(frozen=True)
class StepIdentity:
    """Everything a step's output is a function of (field names are the key's JSON)."""

    input: str | None  # the input model: its sha256 (cache) or its plan key (planner)
    reference: str | None  # the float reference, for passes that use it
    pass_name: str
    pass_version: int
    pass_code: str | None  # digest of the pass's code (engine/code_digest.py)
    options: dict[str, Any]
    # target-dependent passes: [device, precision, (ep)] and the digest of the code of the
    # target's EP plugin (found by entry point, so the pass's own imports do not reach it)
    target: list[str] | None
    contract: Any  # the component's I/O contract, for passes that use it
    upstream: dict[str, Any]  # what the step reads of other components (inputs_from)
    extra: Any  # Pass.key_material: data-file digests, the target's EP, ...
    seed: int

    def key(self) -> str:
        """The sha256 of the identity and the versions of the libraries that emit graphs."""
        payload = canonical_json({**asdict(self), "versions": library_versions()})
        return hashlib.sha256(payload.encode()).hexdigest()


def identify(
    name: str,
    impl: Pass,
    options: dict[str, Any],
    *,
    target: Target,
    contract: IOContract,
    seed: int,
    input: str | None,
    reference: str | None,
    upstream: dict[str, Any],
    extra: Any = None,
) -> StepIdentity:
    """The identity of step `name` run by `impl`: the pass's declarations (`uses_reference`,
    `target_dependent`, `uses_contract`) decide which of the given facts it holds."""
    return StepIdentity(
        input=input,
        reference=reference if impl.uses_reference else None,
        pass_name=name,
        pass_version=impl.version,
        pass_code=pass_code(type(impl)),
        options=options,
        target=[*target.key_parts(), ep_code(target)] if impl.target_dependent else None,
        contract=contract_key(contract) if impl.uses_contract else None,
        upstream=upstream,
        extra=extra,
        seed=seed,
    )


def ep_code(target: Target) -> str:
    """The digest of the code of the EP plugin `target` builds for (its module's closure)."""
    from winml_recipes.runtime.providers import provider_for

    ep = provider_for(target)
    return code_digest(type(ep.quant_rules) if ep.quant_rules else type(ep)) + code_digest(type(ep))


def contract_key(contract: IOContract) -> dict[str, Any]:
    """An I/O contract as key material."""
    return {
        "inputs": [_spec_key(s) for s in contract.inputs],
        "outputs": [_spec_key(s) for s in contract.outputs],
        "dims": dict(sorted(contract.dims.items())),
    }


def _spec_key(spec: Any) -> dict[str, Any]:
    """A tensor spec's fields; the audio ones only when set (keys of other specs unchanged)."""
    return {k: v for k, v in vars(spec).items() if v is not None or k not in ("audio", "ctc_blank")}


def pass_code(cls: type) -> str | None:
    """The pass's code digest; for a pass defined in a script, its file's bytes (the
    script's module is `__main__` in the driver and `__mp_main__` in a pool process, and
    code_digest hashes module names)."""
    if cls.__module__ in ("__main__", "__mp_main__"):
        file = getattr(sys.modules.get(cls.__module__), "__file__", None)
        return hashlib.sha256(Path(file).read_bytes()).hexdigest() if file else None
    return code_digest(cls)
