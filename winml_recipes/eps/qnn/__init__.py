"""Qualcomm QNN, HTP backend (Hexagon NPU): the `onnxruntime-qnn` plugin EP.

Everything the tool knows about QNN lives in this package: how the plugin library loads,
its provider options, what its log says about refused nodes, the quantization rules HTP
needs (quant.py), EPContext compilation, the op_affinity option that keeps op types on the
CPU, and what is emulated on an x86_64 host.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import platform
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from winml_recipes.eps.qnn.quant import QnnQuantRules
from winml_recipes.sdk.ep import ExecutionProvider, GraphRules, PreparationCost

_X86_64 = {"x86_64", "amd64", "x64"}
EMULATED_HTP = "emulated HTP (x86_64), not device latency"
OP_AFFINITY = "op_affinity"  # provider option (onnxruntime-qnn 2.7): a JSON file path


# The largest tensor (elements) HTP is known to prepare in bounded memory: the 1008 px SAM 3
# global-attention block's scores, 16 x 5184 x 5184, prepared in 0.9 GB (docs/sam3-htp-memory.md).
# Attention scores above it are computed in query chunks (rules/attention.py).
MAX_TENSOR_ELEMENTS = 16 * 5184 * 5184
# HTP preparation's peak RSS (MB) ~ base + per million elements of the largest activation:
# the upper envelope of the measurements (through sam3-mid's encoder, 1622 MB at 430 M, and
# the 504 px block, 1234 MB at 27 M; docs/sam3-htp-memory.md).
PREPARE_BASE_MB = 1210.0
PREPARE_MB_PER_MILLION = 0.97
# MB per MB of weights: at least (19,168 - 1,210 - 0.97 x 430) / 453 = 38.7 for the full-size
# SAM 3 encoder, whose preparation passed 19.2 GB without finishing (bench/sam3_full.py).
PREPARE_WEIGHT_FACTOR = 40.0
# The largest estimate compile prepares at once: the 32-layer encoder (estimate 19 GB)
# held 16 GB for 45 minutes unfinished, while parts of a few ViT layers prepare in minutes
# well under it (docs/sam3-htp-memory.md, "32 layers"); above it, compile splits the graph
# at transformer-block boundaries into parts estimated under it, whatever the budget.
PREPARE_LARGEST_MB = 6000.0


@dataclass(frozen=True)
class QnnHtp(ExecutionProvider):
    max_tensor_elements: int | None = MAX_TENSOR_ELEMENTS

    def versions(self) -> dict[str, str]:
        out = super().versions()
        with contextlib.suppress(ImportError):
            info = importlib.import_module(f"{self.library_module}.build_and_package_info")
            if hasattr(info, "qnn_version"):
                out["qnn_sdk"] = str(info.qnn_version)
        return out

    def emulated_on(self) -> str | None:
        """x86_64 hosts run the Hexagon arithmetic in emulation; a Snapdragon (arm64) runs
        the real HTP. The one place that decides it."""
        return "x86_64" if platform.machine().lower() in _X86_64 else None

    def emulation_note(self) -> str | None:
        host = self.emulated_on()
        return EMULATED_HTP if host else None

    def cpu_pinning(self, op_types: Sequence[str], work_dir: Path) -> dict[str, str] | None:
        """op_affinity (onnxruntime-qnn 2.7): a JSON file {"op_type": {T: "cpu"}}, by op
        type only."""
        config = Path(work_dir) / "op_affinity.json"
        config.write_text(json.dumps({"op_type": {t: "cpu" for t in op_types}}))
        return {OP_AFFINITY: str(config)}

    def cpu_pinning_hint(self, op_types: Sequence[str]) -> str:
        pinned = json.dumps({"op_type": {t: "cpu" for t in op_types}})
        return f"QNN's provider option op_affinity (a JSON file {pinned})"

    def preparation_cost(self) -> PreparationCost:
        """HTP graph preparation (session creation, compile) on this host's emulated
        backend: an upper envelope of docs/sam3-htp-memory.md's measurements that prepared
        (SAM 3 ViT blocks at 336-1008 px and a static export of sam3-mid's encoder, w8a16;
        largest tensors 5-430 M elements; peaks 0.36-1.6 GB; this tool's sam3-mid export
        with the rotary rewrite, 1.4 GB, is under it). The largest tensor explains little of
        the peak there; a graph that blows up (that export before `rotate_pairwise_to_gather`:
        > 16 GB) is not modelled. The weights' factor is a lower bound from the full-size
        32-layer encoder (about 453 MB of quantized weights): its preparation held 16 GB for
        45 minutes, then passed 19.2 GB unfinished (stopped there), so the peak grows with
        the graph's size far beyond a session's 2x weights; with 40x, sam3-mid's encoder
        (36 MB, 1.4 GB measured) is estimated at 3.1 GB."""
        return PreparationCost(
            base_mb=PREPARE_BASE_MB,
            mb_per_million=PREPARE_MB_PER_MILLION,
            weight_factor=PREPARE_WEIGHT_FACTOR,
            fitted_on="SAM 3 ViT blocks and sam3-mid's encoder, w8a16, tensors up to 430 M; "
            "the weights' factor a lower bound from the 32-layer encoder (> 19.2 GB)",
            largest_mb=PREPARE_LARGEST_MB,
            lower_by=(
                "prepare's ep stage computes attention in query chunks above the qnn-htp "
                "plugin's max_tensor_elements; compile prepares in parts that fit (compile: "
                "{parts: N}); or verify off the target with verify: {on_target: false} and "
                "leave compile out"
            ),
        )

    def graph_rules(self) -> GraphRules:
        from winml_recipes.eps.qnn.rules import RULES, float_rewrites, rewrite

        return GraphRules(
            name="qnn-htp",
            rules=RULES,
            rewrite=lambda model, log: rewrite(
                model, float_rewrites(self.max_tensor_elements, self.max_rank or 5), log
            ),
        )


PLUGIN = QnnHtp(
    key="qnn-htp",
    provider="QNNExecutionProvider",
    devices=frozenset({"npu"}),
    description="Qualcomm QNN, HTP (Hexagon NPU) backend; emulated on x86_64 hosts",
    library_module="onnxruntime_qnn",
    package="onnxruntime-qnn",
    library_env="WINML_RECIPES_QNN_LIBRARY",
    options={"backend_type": "htp"},
    backend="htp",
    display_name="QNN HTP",
    quant_rules=QnnQuantRules(name="qnn", revision=2),  # 1: Reciprocal float, 2: rescale
    compiles="epcontext",
    compile_options={"htp_arch": "htp_arch", "soc_model": "soc_model"},
    unreproducible_artifacts=r".*_qnn\.bin",
    may_fail_to_finalize=True,
    # Measured on the emulated HTP (w8a16): Unsqueeze/Add/Q/DQ at rank 6 are refused, the
    # same graph at rank 5 places (RT-DETR's deformable attention works at rank 6).
    max_rank=5,
)
