"""What `compare` feeds a candidate when the user gives no data: the inputs its build fed
it, with the shapes the candidate takes.

A candidate from a build folder has its component's input contract in the manifest
(ranges, allowed values such as SAM's labels {-1, 0, 1}, image preprocessing, dims). Any
other candidate is read from its own graph: shapes from its static dims (an npu model has
them after fix_shapes, where the float reference's dynamic dims would default to 1 and be
refused), float inputs within the range their QuantizeLinear was calibrated on (where
[-1, 1) would leave it), safe
values for integer inputs from the float reference (ids below the table they index,
{0, 1} for masks: onnx.inputs.specs_from_model).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

from winml_recipes.buildfolder import BuiltComponent
from winml_recipes.onnx.inputs import DEFAULT_INT_RANGE, specs_from_model
from winml_recipes.onnx.io import load_model
from winml_recipes.sdk.contract import IOContract, TensorSpec, resolve_shape
from winml_recipes.sdk.errors import RecipeError


def compare_contract(
    candidate: Path,
    reference: Path,
    built: BuiltComponent | None,
    ranges: Mapping[str, tuple[float, float]] | None = None,
    values: Mapping[str, tuple[float, ...]] | None = None,
) -> tuple[IOContract, str]:
    """Input specs with concrete shapes for the candidate's inputs, and where they came
    from (said in the output). `ranges`/`values` (per input name) override the rest."""
    model = load_model(candidate, load_external_data=False)
    model_specs, model_dims = specs_from_model(model)
    ref_specs = {
        s.name: s for s in specs_from_model(load_model(reference, load_external_data=False))[0]
    }
    recorded = built.contract if built is not None else None
    known = {s.name for s in model_specs}
    for name in [*(ranges or {}), *(values or {})]:
        if name not in known:
            raise RecipeError(
                f"--range/--values: '{name}' is not an input; inputs: {sorted(known)}"
            )
    specs = []
    for spec in model_specs:
        shape = resolve_shape(spec, model_dims)  # dynamic dims: 1 unless the contract says
        chosen = recorded.input(spec.name) if recorded is not None else None
        if chosen is not None:
            wanted = resolve_shape(chosen, recorded.dims)  # type: ignore[union-attr]
            shape = _merge(spec, shape, wanted)
        else:
            chosen = _with_reference_values(spec, ref_specs.get(spec.name))
            calibrated = _calibrated_range(model, spec) if chosen.image is None else None
            if calibrated is not None and not _inside(chosen.range, calibrated):
                # the default would be clipped (e.g. pixel coordinates calibrated on 0..112)
                chosen = dataclasses.replace(chosen, range=calibrated)
        if spec.name in (ranges or {}) or spec.name in (values or {}):
            chosen = dataclasses.replace(
                chosen,
                range=(ranges or {}).get(spec.name, chosen.range),
                values=(values or {}).get(spec.name, chosen.values),
                image=None,  # the user's range, not photographs or speech
                audio=None,
            )
        specs.append(dataclasses.replace(chosen, shape=shape))
    if recorded is not None and built is not None:
        where = f"the build's input contract ({built.folder / 'manifest.json'})"
    else:
        where = "the candidate's static shapes and calibrated input ranges (no build manifest)"
    return IOContract(inputs=tuple(specs)), where


def _merge(spec: TensorSpec, static: tuple[int, ...], wanted: tuple[int, ...]) -> tuple[int, ...]:
    """The contract's shape where the model's dims are dynamic; a static dim of the model
    that disagrees with the contract is an error naming both."""
    if len(wanted) != len(spec.shape):
        raise RecipeError(
            f"input '{spec.name}': the manifest says {list(wanted)}, the model has rank "
            f"{len(spec.shape)}; was the model replaced after the build?"
        )
    out = []
    for model_dim, got, want in zip(spec.shape, static, wanted, strict=True):
        if isinstance(model_dim, int) and model_dim > 0 and got != want:
            raise RecipeError(
                f"input '{spec.name}': the manifest says {list(wanted)}, the model takes "
                f"{list(static)}; was the model replaced after the build?"
            )
        out.append(want)
    return tuple(out)


def _with_reference_values(spec: TensorSpec, ref: TensorSpec | None) -> TensorSpec:
    """An integer input keeps what the float graph says is safe for it (a quantized
    candidate's tables are behind DequantizeLinear, where the analysis cannot see)."""
    if ref is None or ref.dtype != spec.dtype:
        return spec
    if spec.values is None and spec.range in (None, DEFAULT_INT_RANGE):
        return dataclasses.replace(spec, range=ref.range, values=ref.values)
    return spec


def _inside(inner: tuple[float, float] | None, outer: tuple[float, float]) -> bool:
    """Whether `inner` lies within `outer` (drawing uniformly over a whole calibrated
    range would push later activations past theirs more than real data does)."""
    return inner is not None and outer[0] <= inner[0] and inner[1] <= outer[1]


def _calibrated_range(model, spec: TensorSpec) -> tuple[float, float] | None:
    """[low, high] a float graph input's QuantizeLinear represents (scale, zero point and
    the integer type's limits): the range calibration saw. None: not quantized there."""
    import numpy as np
    from onnx import numpy_helper

    if not spec.dtype.startswith("float"):
        return None
    constants = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type != "QuantizeLinear" or node.input[0] != spec.name or len(node.input) < 3:
            continue
        if node.input[1] not in constants or node.input[2] not in constants:
            continue
        scale = numpy_helper.to_array(constants[node.input[1]]).astype(np.float64)
        zero = numpy_helper.to_array(constants[node.input[2]])
        if scale.size != 1 or not np.issubdtype(zero.dtype, np.integer):
            return None
        limits = np.iinfo(zero.dtype)
        z, s = float(zero.reshape(-1)[0]), float(scale.reshape(-1)[0])
        return (limits.min - z) * s, (limits.max - z) * s
    return None
