"""The memory budget of a build: how much a step may use, and the estimates checked against it.

The budget defaults to the machine's physical memory minus headroom (the larger of 2 GB
and 15 %), and can be set with `--memory-budget` or $WINML_RECIPES_MEMORY_BUDGET (e.g.
"12GB", "9000MB"). Before a step runs, the engine asks its pass for an estimate of the
step's peak (from the step's real input model); a step that would not fit stops the build
with the estimate, what it is made of and what to change, instead of being killed by the
kernel halfway through. Physical memory is read with psutil (portable; no /proc parsing).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from winml_recipes.sdk.contract import IOContract, resolve_shape
from winml_recipes.sdk.errors import MemoryBudgetError, RecipeError
from winml_recipes.sdk.estimates import EstimateInputs, MemoryEstimate

if TYPE_CHECKING:
    import onnx

    from winml_recipes.sdk.ep import ExecutionProvider
    from winml_recipes.sdk.target import Target

BUDGET_ENV = "WINML_RECIPES_MEMORY_BUDGET"
HEADROOM_MB = 2048
HEADROOM_FRACTION = 0.15
# Python, numpy and onnxruntime loaded, before any model (measured: 300-450 MB).
RUNTIME_MB = 450
# A session holds the weights twice while it initializes (the graph's copy and the
# prepacked/optimized one); rewriting passes (onnx protobuf + numpy copies + the written
# file) about four times. Calibrated on sam3-mid and the full-size encoder (bench/mid.py
# prints estimate and measured peak side by side).
SESSION_WEIGHT_FACTOR = 2.0
REWRITE_WEIGHT_FACTOR = 4.0
# onnxruntime's arena rounds allocations up; activations take up to this much more.
ARENA_FACTOR = 1.25


def total_memory_mb() -> float:
    import psutil

    return psutil.virtual_memory().total / (1024 * 1024)


def default_budget_mb() -> float:
    total = total_memory_mb()
    return total - max(HEADROOM_MB, HEADROOM_FRACTION * total)


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(gb|g|gib|mb|m|mib)?\s*$", re.IGNORECASE)


def parse_budget(
    text: str | float | int, where: str = "--memory-budget", minimum_mb: float = 64
) -> float:
    """Megabytes from "12GB", "12g", "9000MB" or a bare number of MB."""
    if isinstance(text, int | float):
        value, unit = float(text), "mb"
    else:
        match = _SIZE.match(str(text))
        if not match:
            raise RecipeError(
                f"'{text}' is not a memory size; write e.g. 12GB or 9000MB", where=where
            )
        value, unit = float(match.group(1)), (match.group(2) or "mb").lower()
    mb = value * 1024 if unit.startswith("g") else value
    if mb < minimum_mb:
        raise RecipeError(f"{mb:.0f} MB is too small (at least {minimum_mb:g} MB)", where=where)
    return mb


def resolve_budget(value: str | float | None) -> float:
    """The budget in MB: the given value, else $WINML_RECIPES_MEMORY_BUDGET, else the default."""
    if value is not None:
        return parse_budget(value)
    env = os.environ.get(BUDGET_ENV)
    if env:
        return parse_budget(env, where=f"${BUDGET_ENV}")
    return default_budget_mb()


def check_fits(estimate: MemoryEstimate, budget_mb: float, where: str) -> None:
    """Refuse a step whose estimate exceeds the budget, saying what to change."""
    if estimate.mb <= budget_mb:
        return
    lower = f"{estimate.lower_by}; " if estimate.lower_by else ""
    raise MemoryBudgetError(
        f"needs about {estimate.mb / 1024:.1f} GB ({estimate.made_of}), over the memory budget "
        f"of {budget_mb / 1024:.1f} GB; {lower}raise the budget with --memory-budget or "
        f"${BUDGET_ENV} if this machine has more to give",
        where=where,
    )


# ---------------------------------------------------------------- estimates for passes


def contract_shapes(contract: IOContract) -> dict[str, tuple[int, ...]]:
    """The inputs' concrete shapes under the contract's dims (unresolved ones left out)."""
    return _shapes(contract)


def _shapes(contract: IOContract) -> dict[str, tuple[int, ...]]:
    out = {}
    for spec in contract.inputs:
        try:
            out[spec.name] = tuple(resolve_shape(spec, contract.dims))
        except Exception:  # an unresolved dim: the graph's own shape is used
            continue
    return out


def forward_estimate(
    model: Path, contract: IOContract, what: str = "forward pass"
) -> MemoryEstimate:
    """One onnxruntime session running `model` on the CPU at the contract's shapes."""
    from winml_recipes.onnx.footprint import footprint

    fp = footprint(model, _shapes(contract))
    mb = RUNTIME_MB + SESSION_WEIGHT_FACTOR * fp.weight_mb + ARENA_FACTOR * fp.activation_mb
    return MemoryEstimate(
        mb,
        f"{what}: weights {fp.weight_mb:.0f} MB x{SESSION_WEIGHT_FACTOR:g} while the session "
        f"loads, activation peak {fp.activation_mb:.0f} MB, runtime {RUNTIME_MB} MB",
    )


def rewrite_estimate(
    model: Path, what: str = "graph rewrite", factor: float = REWRITE_WEIGHT_FACTOR
) -> MemoryEstimate:
    """A pass that loads the model with its weights, rewrites it and writes it out."""
    from winml_recipes.onnx.footprint import weight_bytes
    from winml_recipes.onnx.io import load_model

    weights = weight_bytes(load_model(model, load_external_data=False)) / (1024 * 1024)
    mb = RUNTIME_MB + factor * weights
    made_of = f"{what}: weights {weights:.0f} MB x{factor:g}, runtime {RUNTIME_MB} MB"
    return MemoryEstimate(mb, made_of)


def preparation_estimate(
    model: Path, contract: IOContract, ep: ExecutionProvider, what: str = "graph preparation"
) -> MemoryEstimate | None:
    """Preparing `model` for `ep` (session creation or compile on its backend), from the EP
    plugin's fitted cost and the model's largest activation at the contract's shapes; None
    when the EP gives no cost (the CPU EP: the forward estimate covers it)."""
    from winml_recipes.onnx.io import load_model

    if ep.preparation_cost() is None:
        return None
    proto = load_model(model, load_external_data=False)
    return graph_preparation_estimate(proto, _shapes(contract), ep, what)


def quantized_later(model: Path, target: Target) -> bool:
    """Whether `model` is a float graph the target's precision will quantize: before the
    build runs, its source stands in for the QDQ graph a later step prepares, but not for
    that graph's preparation (weights 4x the bytes, no Q/DQ cut points), so that
    estimate waits for the step's real input."""
    from winml_recipes.onnx.io import load_model
    from winml_recipes.presets import precision_settings

    if precision_settings(target.precision).get("kind") != "integer":
        return False
    proto = load_model(model, load_external_data=False)
    return not any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in proto.graph.node)


def graph_preparation_estimate(
    model: onnx.ModelProto,
    shapes: dict[str, tuple[int, ...]],
    ep: ExecutionProvider,
    what: str = "graph preparation",
) -> MemoryEstimate | None:
    """`preparation_estimate` of a graph in memory (e.g. one part of a split graph)."""
    from winml_recipes.onnx.footprint import largest_activation_of, weight_bytes

    cost = ep.preparation_cost()
    if cost is None:
        return None
    name, elements = largest_activation_of(model, shapes)
    weights = weight_bytes(model) / (1024 * 1024)
    millions = elements / 1e6
    mb = cost.base_mb + cost.mb_per_million * millions + cost.weight_factor * weights
    made_of = (
        f"{what} for {ep.key}: largest tensor {name or '?'} {millions:.0f} M elements x "
        f"{cost.mb_per_million:g} MB, weights {weights:.0f} MB x{cost.weight_factor:g}, base "
        f"{cost.base_mb:.0f} MB (fitted on {cost.fitted_on})"
    )
    return MemoryEstimate(mb, made_of, cost.lower_by)


def larger(*estimates: MemoryEstimate | None) -> MemoryEstimate | None:
    """The phase with the highest peak (phases of one step run one after another)."""
    known = [e for e in estimates if e is not None]
    return max(known, key=lambda e: e.mb) if known else None


class RewritesGraph:
    """Mixin for passes that load a model with its weights, rewrite it and write it out."""

    name: str

    def estimate_memory(
        self, src: Path, options: dict, inputs: EstimateInputs
    ) -> MemoryEstimate | None:
        return rewrite_estimate(src, self.name)
