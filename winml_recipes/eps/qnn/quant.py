"""The quantization rules QNN HTP needs: onnxruntime's `get_qnn_qdq_config`, the float
range and shared-encoding rules of eps/qnn/rules/encodings.py, sentinel constants, NaN
guards. (HTP's float rewrites run before quantization, in the `htp` stage of `prepare`.)

Moved here from passes/quantize.py and quant/ort.py (`if cfg.qnn:` branches); what each
rule does and why is documented beside the rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from winml_recipes.sdk.ep import QuantRules

if TYPE_CHECKING:
    import onnx


# The smallest activation range quantized as calibrated (onnxruntime's QNN default: 1e-4).
MINIMUM_REAL_RANGE = 1e-12


@dataclass
class QnnQuantRules(QuantRules):
    def after_calibration(self, model: onnx.ModelProto) -> dict[str, Any]:
        from winml_recipes.quant.calibrate import replace_unseen_sentinels

        return {"unseen_sentinel_constants": replace_unseen_sentinels(model)}

    def float_nodes(self, model: onnx.ModelProto) -> dict[str, str]:
        # HTP's quantized Reciprocal is wrong where the CPU EP's simulation is right: in
        # magika's LayerNorm (Keras, tf2onnx: x * Reciprocal(Sqrt(var + eps)), input range
        # [0, 0.19], output up to 285) the w8a16 model's top-1 agreement was 0.125 on HTP
        # and 1.0 on the CPU EP; with the Reciprocals in float, 1.0 on HTP (measured,
        # onnxruntime-qnn 2.7). In float HTP runs them itself (no CPU fallback needed).
        return {
            n.name: "QNN HTP computes a quantized Reciprocal wrong (magika: top-1 0.125 vs 1.0)"
            for n in model.graph.node
            if n.op_type == "Reciprocal" and n.domain in ("", "ai.onnx") and n.name
        }

    def adjust_ranges(
        self, model: onnx.ModelProto, ranges: dict[str, Any], tensors: Sequence[str]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        from winml_recipes.eps.qnn.rules.encodings import (
            shared_encoding_groups,
            unify_ranges,
            widen_add_outputs,
            widen_softmax_inputs,
        )

        widened: dict[str, list[str]] = {}
        ranges, widened["softmax_inputs"] = widen_softmax_inputs(model, ranges)
        ranges, widened["add_outputs"] = widen_add_outputs(model, ranges)
        shared = shared_encoding_groups(model, list(tensors))
        ranges = unify_ranges(ranges, shared)
        return ranges, {"shared_encodings": shared, "htp_widened_ranges": widened}

    def rewrite_with_ranges(
        self, model: onnx.ModelProto, ranges: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        from winml_recipes.eps.qnn.rules.products import rescale_tiny_products

        # HTP's activation x activation MatMul loses operands far below 1e-3 (rules/products.py)
        ranges, rescaled = rescale_tiny_products(model, ranges)
        return ranges, ({"htp_rescaled_products": rescaled} if rescaled else {})

    def quantizer_args(
        self,
        src: Path,
        cfg: Any,
        overrides: dict[str, list[dict[str, Any]]],
        exclude: list[str],
    ) -> dict[str, Any] | None:
        from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

        from winml_recipes.quant.ort import quant_type, quiet_ort_logging, typed_overrides

        with quiet_ort_logging():
            qcfg = get_qnn_qdq_config(
                str(src),
                None,
                activation_type=quant_type(cfg.activation_type),
                weight_type=quant_type(cfg.weight_type),
                per_channel=cfg.per_channel,
                init_overrides=typed_overrides(overrides) or None,
                activation_symmetric=cfg.activation_symmetric,
                weight_symmetric=cfg.weight_symmetric,
                op_types_to_quantize=list(cfg.op_types) or None,
                nodes_to_exclude=exclude or None,
            )
        return {
            "quant_format": qcfg.quant_format,
            "op_types_to_quantize": qcfg.op_types_to_quantize,
            "per_channel": qcfg.per_channel,
            "reduce_range": cfg.reduce_range,
            "activation_type": qcfg.activation_type,
            "weight_type": qcfg.weight_type,
            "nodes_to_quantize": qcfg.nodes_to_quantize,
            "nodes_to_exclude": qcfg.nodes_to_exclude,
            # onnxruntime's quantizer leaves a Where (and Reshape, Gather, ...) in float when
            # one of its inputs is not already quantized, e.g. a float constant: SAM 3's
            # `where(label == -1, not_a_point_embed, x)`. A float node between quantized ones
            # fails HTP's graph finalize with QNN_COMMON_ERROR_MEM_ALLOC (measured in a
            # four-node graph, onnxruntime-qnn 2.7); forced, the constant is quantized too.
            # onnxruntime's QNN config floors every activation range at 1e-4; a tensor
            # whose values are far smaller keeps a few steps of it (the tiny MobileViT's
            # encoder runs at 1e-8: 11 dB after a 1x1 conv, on the CPU EP as on HTP).
            # HTP computes such ranges right (a Conv pair through 1e-6: 43.3 dB on HTP,
            # 43.7 simulated, vs 0 dB with the floor), so only a float32-safe floor is kept.
            "extra_options": {
                **qcfg.extra_options,
                "ForceQuantizeNoInputCheck": True,
                "MinimumRealRange": MINIMUM_REAL_RANGE,
            },
        }

    def after_quantize(self, path: Path) -> None:
        from winml_recipes.eps.qnn.rules import fold_nan_guards
        from winml_recipes.onnx.io import load_model, save_model

        # the graph alone first: weights are loaded (and the model rewritten) only when needed
        if not fold_nan_guards(load_model(path, load_external_data=False)):
            return
        model = load_model(path)
        fold_nan_guards(model)
        save_model(model, path)
