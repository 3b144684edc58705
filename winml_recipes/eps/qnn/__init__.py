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
from winml_recipes.sdk.ep import ExecutionProvider, GraphRules

_X86_64 = {"x86_64", "amd64", "x64"}
EMULATED_HTP = "emulated HTP (x86_64), not device latency"
OP_AFFINITY = "op_affinity"  # provider option (onnxruntime-qnn 2.7): a JSON file path


@dataclass(frozen=True)
class QnnHtp(ExecutionProvider):
    def versions(self) -> dict[str, str]:
        out = super().versions()
        with contextlib.suppress(ImportError):
            info = importlib.import_module(f"{self.library_module}.build_and_package_info")
            if hasattr(info, "qnn_version"):
                out["qnn_sdk"] = str(info.qnn_version)
        return out

    def emulation_note(self) -> str | None:
        return EMULATED_HTP if platform.machine().lower() in _X86_64 else None

    def cpu_pinning(self, op_types: Sequence[str], work_dir: Path) -> dict[str, str] | None:
        """op_affinity (onnxruntime-qnn 2.7): a JSON file {"op_type": {T: "cpu"}}, by op
        type only."""
        config = Path(work_dir) / "op_affinity.json"
        config.write_text(json.dumps({"op_type": {t: "cpu" for t in op_types}}))
        return {OP_AFFINITY: str(config)}

    def cpu_pinning_hint(self, op_types: Sequence[str]) -> str:
        pinned = json.dumps({"op_type": {t: "cpu" for t in op_types}})
        return f"QNN's provider option op_affinity (a JSON file {pinned})"

    def estimate_note(self) -> str | None:
        return (
            "QNN HTP graph preparation is not estimated: the 1008 px SAM 3 encoder needed "
            "more than 24 GB"
        )

    def graph_rules(self) -> GraphRules:
        from winml_recipes.eps.qnn.rules import RULES, float_rewrites, rewrite

        return GraphRules(
            name="qnn-htp",
            rules=RULES,
            rewrite=lambda model, log: rewrite(model, float_rewrites(), log),
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
    quant_rules=QnnQuantRules(name="qnn"),
    compiles="epcontext",
    compile_options={"htp_arch": "htp_arch", "soc_model": "soc_model"},
    unreproducible_artifacts=r".*_qnn\.bin",
    may_fail_to_finalize=True,
)
