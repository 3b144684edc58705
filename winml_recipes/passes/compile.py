"""compile: an EPContext model for the target's execution provider (QNN HTP).

Creating a QNN session with `ep.context_enable=1` makes the EP compile the graph and write
`model_ctx.onnx` (an `EPContext` node holding, or pointing at, the QNN context binary):
what a device loads without compiling again. The compiled model is then loaded back on the
same EP and its outputs compared with the uncompiled model's on that EP.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from winml_recipes.sdk.errors import PassError
from winml_recipes.sdk.passes import Pass, register
from winml_recipes.sdk.target import Target
from winml_recipes.sdk.types import ModelFacts, StepContext, StepResult

COMPILED = "model_ctx.onnx"
HTP_ARCHS = [68, 69, 73, 75, 79, 81]


@register
class CompilePass(Pass):
    name = "compile"
    version = 1
    summary = "EPContext model for the target's EP (QNN HTP): compiled once, loaded as is."
    devices = frozenset({"npu"})
    uses_contract = True
    options_schema = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "htp_arch": {
                "enum": HTP_ARCHS,
                "description": "Hexagon architecture to compile for (e.g. 73 for Snapdragon X "
                "Elite). Default: the EP's.",
            },
            "soc_model": {
                "type": "integer",
                "minimum": 0,
                "description": "QNN SoC model id (e.g. 60 for Snapdragon X Elite). "
                "Default: the EP's.",
            },
            "embed": {
                "type": "boolean",
                "default": False,
                "description": "Embed the context binary in model_ctx.onnx (default: a "
                "model_ctx_qnn.bin file beside it).",
            },
            "keep_uncompiled": {
                "type": "boolean",
                "default": True,
                "description": "Ship model.onnx beside the compiled model.",
            },
            "require_ep": {
                "type": "boolean",
                "default": False,
                "description": "Fail where the EP cannot load on this host (default: the step "
                "is skipped with the reason).",
            },
            "samples": {"type": "integer", "minimum": 1, "maximum": 16, "default": 1},
            "seed": {"type": "integer", "minimum": 0, "default": 0},
        },
    }

    def skip_reason(self, facts: ModelFacts, options: dict[str, Any], target: Target) -> str | None:
        from winml_recipes.runtime.providers import provider_for_device

        if provider_for_device(target.device).is_cpu:
            return "the target's execution provider is the CPU EP: nothing to compile"
        return None

    def key_material(self, options: dict[str, Any], ctx: StepContext) -> Any:
        from winml_recipes.runtime.providers import identity, provider_for_device

        return {"execution_provider": identity(provider_for_device(ctx.target.device).key)}

    def run(
        self, src: Path | None, out_dir: Path, options: dict[str, Any], ctx: StepContext
    ) -> StepResult:
        from winml_recipes.feeds import synthetic, take
        from winml_recipes.onnx.metrics import compare_runs
        from winml_recipes.runtime.providers import availability, identity, provider_for_device
        from winml_recipes.runtime.sessions import open_session

        assert src is not None
        ep = provider_for_device(ctx.target.device)
        avail = availability(ep.key)
        if not avail.available:
            if options["require_ep"]:
                raise PassError(f"{ep.provider} cannot be used here: {avail.reason}")
            return StepResult(skipped=f"{ep.provider} not available here: {avail.reason}")
        compiled = out_dir / COMPILED

        def configure(so) -> None:
            so.add_session_config_entry("ep.context_enable", "1")
            so.add_session_config_entry("ep.context_file_path", str(compiled))
            so.add_session_config_entry("ep.context_embed_mode", "1" if options["embed"] else "0")

        provider_options = {
            k: str(options[k]) for k in ("htp_arch", "soc_model") if options.get(k) is not None
        }
        uncompiled = open_session(
            src, ep.key, fallback=False, configure=configure, provider_options=provider_options
        )
        if not compiled.is_file():
            raise PassError(f"{ep.provider} wrote no EPContext model")
        loaded = open_session(compiled, ep.key, fallback=False)
        feeds = take(
            synthetic(ctx.contract, options["samples"], options["seed"] + ctx.seed),
            options["samples"],
        )
        before = [uncompiled.run(f, i) for i, f in enumerate(feeds)]
        after = [loaded.run(f, i) for i, f in enumerate(feeds)]
        agreement = compare_runs(before, after)
        max_abs = max(m["max_abs"] for m in agreement.values())
        artifacts = sorted(p.name for p in out_dir.iterdir() if p.is_file())
        artifacts.remove(COMPILED)
        return StepResult(
            None,
            {
                "execution_provider": identity(ep.key),
                "provider_options": provider_options,
                "embed": options["embed"],
                "compiled_vs_uncompiled": {
                    "max_abs": max_abs,
                    "bit_exact": max_abs == 0.0,
                    "samples": options["samples"],
                },
            },
            artifacts=(COMPILED, *artifacts),
            ship_model=options["keep_uncompiled"],
        )
