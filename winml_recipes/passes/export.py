"""export: HF model id, local HF directory or seeded random config -> ONNX (torch dynamo)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from winml_recipes.sdk.config import option
from winml_recipes.sdk.errors import PassError
from winml_recipes.sdk.passes import Pass, model_file, register
from winml_recipes.sdk.target import Target
from winml_recipes.sdk.types import ModelFacts, StepContext, StepResult
from winml_recipes.services.models import TOOL_VERSION as __version__

# onnxruntime must reproduce torch on the (batch-2) trace inputs at least this closely.
MIN_PARITY_SQNR_DB = 60.0


@dataclass(frozen=True)
class ExportConfig:
    opset: int | None = option(
        None, "ONNX opset (default: the exporter's).", minimum=17, maximum=23
    )


@register
class ExportPass(Pass[ExportConfig]):
    name = "export"
    version = 2
    summary = "Export a Hugging Face model (id, local dir or random-weight config) to ONNX."
    target_dependent = False
    produces_reference = True
    makes = frozenset({"onnx"})

    def skip_reason(self, facts: ModelFacts, config: ExportConfig, target: Target) -> str | None:
        return "source is already ONNX" if facts.is_onnx else None

    def facts_after(self, facts: ModelFacts, config: ExportConfig) -> ModelFacts:
        # The exporter's output is a clean float graph: it counts as normalized.
        return ModelFacts(
            is_onnx=True,
            normalized=True,
            normalized_why="the exporter's output counts as normalized",
            has_reference=True,
        )

    def run(
        self, src: Path | None, out_dir: Path, config: ExportConfig, ctx: StepContext
    ) -> StepResult:
        # The built-in families by name, so that their code is in this pass's cache key
        # (families load through entry points, which code_digest cannot follow).
        import winml_recipes.exporters.auto
        import winml_recipes.exporters.sam  # noqa: F401
        from winml_recipes.exporters import ExportRequest, export_with_parity
        from winml_recipes.services.models import save_model, write_stamp

        spec = ctx.source.export
        if spec is None:
            raise PassError("nothing to export: the source is not a model to export")
        request = ExportRequest(**spec, opset=config.opset)
        started = time.perf_counter()
        exported = export_with_parity(request)
        model = exported.model
        export_seconds = time.perf_counter() - started
        poor = {n: m for n, m in exported.parity.items() if m["sqnr_db"] < MIN_PARITY_SQNR_DB}
        if poor:
            worst = ", ".join(f"{n} {m['sqnr_db']:.1f} dB" for n, m in poor.items())
            raise PassError(
                f"the exported graph does not reproduce torch on the trace inputs ({worst}); "
                "this is an exporter problem, please report it with the model config"
            )
        write_stamp(model, tool=f"winml-recipes {__version__} export")
        out = save_model(model, model_file(out_dir))
        return StepResult(
            out,
            {
                "export_seconds": round(export_seconds, 3),
                "opset": next(o.version for o in model.opset_import if o.domain == ""),
                "nodes": len(model.graph.node),
                "torch_parity": {
                    n: {"sqnr_db": round(m["sqnr_db"], 1), "max_abs": float(f"{m['max_abs']:.3g}")}
                    for n, m in exported.parity.items()
                },
            },
        )
