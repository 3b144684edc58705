"""fix_shapes: make named (dynamic) dims static from the catalog's shape hints."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from winml_recipes.sdk.config import Schema, option
from winml_recipes.sdk.errors import PassError
from winml_recipes.sdk.passes import Pass, model_file, register
from winml_recipes.sdk.target import Target
from winml_recipes.sdk.types import ModelFacts, StepContext, StepResult
from winml_recipes.services.memory import RewritesGraph


@dataclass(frozen=True)
class FixShapesConfig:
    dims: Mapping[str, Annotated[int, Schema(minimum=1)]] | None = option(
        None, "Dim values overriding the catalog's (e.g. batch: 1)."
    )


@register
class FixShapesPass(RewritesGraph, Pass[FixShapesConfig]):
    name = "fix_shapes"
    version = 2
    summary = "Make dynamic dims static (values from the catalog dims, overridable here)."
    target_dependent = False
    uses_contract = True
    pins_shapes = True

    def skip_reason(self, facts: ModelFacts, config: FixShapesConfig, target: Target) -> str | None:
        if facts.dynamic_dims == ():
            return "all input dims are already static"
        return None

    def facts_after(self, facts: ModelFacts, config: FixShapesConfig) -> ModelFacts:
        return facts.evolve(dynamic_dims=())

    def run(
        self, src: Path | None, out_dir: Path, config: FixShapesConfig, ctx: StepContext
    ) -> StepResult:
        import onnx
        from onnxruntime.tools.onnx_model_utils import make_dim_param_fixed

        from winml_recipes.services.models import load_model, save_model

        assert src is not None
        model = load_model(src)
        values = {**ctx.contract.dims, **(config.dims or {})}
        fixed = _dims_by_position(model, ctx, values)
        params = sorted(
            {
                d.dim_param
                for vi in model.graph.input
                for d in vi.type.tensor_type.shape.dim
                if d.dim_param and d.dim_param not in fixed
            }
        )
        missing = [p for p in params if p not in values]
        if missing:
            raise PassError(
                f"no value for dynamic dim(s) {', '.join(missing)}; add them to the catalog "
                "component's dims or to fix_shapes.dims"
            )
        fixed |= {p: int(values[p]) for p in params}
        for p, value in fixed.items():
            make_dim_param_fixed(model.graph, p, value)
        model.graph.ClearField("value_info")
        # Outputs are re-derived from the now static inputs.
        for out in model.graph.output:
            out.type.tensor_type.ClearField("shape")
        model = onnx.shape_inference.infer_shapes(model, data_prop=True)
        model.graph.ClearField("value_info")
        out = save_model(model, model_file(out_dir))
        return StepResult(out, {"fixed": dict(sorted(fixed.items()))})


def _dims_by_position(model, ctx: StepContext, values: dict[str, int]) -> dict[str, int]:
    """Dynamic dims of the model's inputs, valued by the catalog shape at the same position.

    Exporters name dims their own way (`s99`, `p2o.DynamicDimension.0`, `batch_size`); the
    catalog says what each position of each input is (an int, or a named dim with a value),
    so names need not agree. Two positions giving one model dim different values is an error.
    """
    from winml_recipes.sdk.contract import resolve_shape
    from winml_recipes.services.models import names_one_dim

    out: dict[str, int] = {}
    for vi in model.graph.input:
        spec = ctx.contract.input(vi.name)
        dims = vi.type.tensor_type.shape.dim
        if spec is None or len(spec.shape) != len(dims):
            continue
        try:
            want = resolve_shape(spec, values)
        except Exception:
            continue  # a named dim without a value: left to the name rule below
        params = [d.dim_param for d in dims]
        for i, d in enumerate(dims):
            if d.HasField("dim_value") and d.dim_value > 0:
                continue
            if not names_one_dim(d.dim_param, params):  # unnamed, `?`, -1, a repeated `?`
                d.dim_value = int(want[i])  # an anonymous dynamic dim: fixed in place
                continue
            if out.get(d.dim_param, want[i]) != want[i]:
                raise PassError(
                    f"dim '{d.dim_param}' of input '{vi.name}' is {want[i]} at position {i} by "
                    f"the catalog but {out[d.dim_param]} elsewhere; fix the catalog shapes"
                )
            out[d.dim_param] = int(want[i])
    return out
