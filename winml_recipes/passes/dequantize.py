"""dequantize: a post-training-quantized graph back to a plain float graph.

The rewrite itself lives in winml_recipes.quant.dequantize (also behind the
`winml-recipes dequantize` command); this pass plugs it into recipes, so that
`[dequantize, normalize, quantize]` requantizes a published int8 model for a target.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from winml_recipes.sdk.passes import Pass, model_file, register
from winml_recipes.sdk.target import Target
from winml_recipes.sdk.types import ModelFacts, StepContext, StepResult
from winml_recipes.services.memory import RewritesGraph


@dataclass(frozen=True)
class DequantizeConfig:
    """No options."""


@register
class DequantizePass(RewritesGraph, Pass[DequantizeConfig]):
    name = "dequantize"
    version = 1
    summary = "Rewrite a quantized graph (QDQ, QOperator, dynamic, MatMulNBits) into float."
    target_dependent = False
    # The dequantized model is the best float reference a quantized source has.
    produces_reference = True
    makes = frozenset({"float"})

    def skip_reason(
        self, facts: ModelFacts, config: DequantizeConfig, target: Target
    ) -> str | None:
        if facts.is_onnx and not facts.quantized:
            return "already float: nothing to dequantize"
        return None

    def facts_after(self, facts: ModelFacts, config: DequantizeConfig) -> ModelFacts:
        return facts.evolve(
            quantized=False,
            quant_summary="",
            activation_dtypes=(),
            weight_dtypes=(),
            normalized=False,
            has_reference=True,
        )

    def run(
        self, src: Path | None, out_dir: Path, config: DequantizeConfig, ctx: StepContext
    ) -> StepResult:
        from winml_recipes.quant.dequantize import dequantize_model
        from winml_recipes.services.models import load_model, save_model

        assert src is not None
        model, report = dequantize_model(load_model(src))
        if not report.changed:
            return StepResult(skipped=report.describe())
        out = save_model(model, model_file(out_dir))
        return StepResult(out, {"summary": report.describe(), **report.to_dict()})
