"""fp16: float32 -> float16 weights and compute, with float32 I/O kept by default.

onnxruntime's converter (onnxruntime.transformers.float16) does the work; the block list
keeps numerically fragile ops in float32 with Casts around them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from winml_recipes.sdk.config import option
from winml_recipes.sdk.passes import Pass, model_file, register
from winml_recipes.sdk.target import Target
from winml_recipes.sdk.types import ModelFacts, StepContext, StepResult
from winml_recipes.services.memory import RewritesGraph
from winml_recipes.services.presets import precisions_of_kind


@dataclass(frozen=True)
class Fp16Config:
    keep_io_types: bool = True
    op_block_list: tuple[str, ...] | None = option(
        None, "Op types kept in float32 (added to onnxruntime's default list)."
    )
    node_block_list: tuple[str, ...] | None = option(None, "Node names kept in float32.")


@register
class Fp16Pass(RewritesGraph, Pass[Fp16Config]):
    name = "fp16"
    version = 1
    summary = "Convert to float16 (float32 inputs/outputs kept; op and node block lists)."
    precisions = precisions_of_kind("float16")
    target_dependent = False

    def skip_reason(self, facts: ModelFacts, config: Fp16Config, target: Target) -> str | None:
        if facts.quantized:
            return f"source already quantized ({facts.quant_summary})"
        return None

    def run(
        self, src: Path | None, out_dir: Path, config: Fp16Config, ctx: StepContext
    ) -> StepResult:
        from collections import Counter

        from onnxruntime.transformers.float16 import (
            DEFAULT_OP_BLOCK_LIST,
            convert_float_to_float16,
        )

        from winml_recipes.services.models import load_model, save_model

        assert src is not None
        model = load_model(src)
        blocked = sorted({*DEFAULT_OP_BLOCK_LIST, *(config.op_block_list or ())})
        converted = convert_float_to_float16(
            model,
            keep_io_types=config.keep_io_types,
            op_block_list=blocked,
            node_block_list=list(config.node_block_list or ()) or None,
        )
        out = save_model(converted, model_file(out_dir))
        casts = Counter(n.op_type for n in converted.graph.node)["Cast"]
        return StepResult(out, {"casts": casts, "op_block_list": list(config.op_block_list or ())})
