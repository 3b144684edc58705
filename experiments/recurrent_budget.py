"""QNN HTP graph preparation of an unrolled GRU: time and peak memory against the steps.

The step budget of `winml_recipes/graph/recurrent.py` (how many steps x directions a model's
recurrent nodes may unroll to for the NPU) comes from this table, not from a guess. Per
(hidden, steps) a one-layer torch `nn.GRU` (input 16, seeded random weights, batch 1) is
exported with the TorchScript exporter, built by this tool for npu/`--precision`
(normalize, fix_shapes, prepare's fold + recurrent stages with the budget lifted,
quantize on 1 seeded sample), then, in a fresh process, a QNN HTP session is created on the
QDQ model with CPU fallback off (what `verify`/`compile` do): its wall time and CPU time,
the process's peak RSS and the QDQ node count are the row.

    nice python experiments/recurrent_budget.py --hidden 32 64 --steps 16 32 64 128 256

One measurement at a time (memory-bound); `--cap-gb` stops a preparation that grows past it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.capped import capped_python as _python  # noqa: E402

# Runs in the measured process: one HTP session, fallback off. Wall seconds and the
# process's CPU seconds (all threads: on a machine shared with other jobs, the CPU time is
# what the preparation costs; the wall time depends on the load), and the peak RSS.
_PREPARE = """
import json, os, sys, time
from winml_recipes.runtime.memory import peak_rss_mb
from winml_recipes.runtime.sessions import open_session
started, cpu = time.perf_counter(), sum(os.times()[:2])
error = None
try:
    open_session(sys.argv[1], "qnn-htp", fallback=False)
except Exception as exc:
    error = " ".join(str(exc).split())[:300]
print(json.dumps({"seconds": round(time.perf_counter() - started, 1),
                  "cpu_seconds": round(sum(os.times()[:2]) - cpu, 1),
                  "peak_rss_mb": peak_rss_mb(), "error": error,
                  "load_average": round(os.getloadavg()[0], 1)}))
"""


def export_gru(path: Path, hidden: int, steps: int, bidirectional: bool = False) -> Path:
    """A seeded nn.GRU (+ Linear) over [1, steps, 16], exported with the TorchScript exporter."""
    import torch

    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = torch.nn.GRU(16, hidden, batch_first=True, bidirectional=bidirectional)
            self.fc = torch.nn.Linear(hidden * (2 if bidirectional else 1), 4)

        def forward(self, x):
            y, _ = self.rnn(x)
            return self.fc(y)

    torch.onnx.export(Net().eval(), (torch.randn(1, steps, 16),), str(path), input_names=["x"],
                      output_names=["y"], opset_version=17, dynamo=False)  # fmt: skip
    return path


def quantize(src: Path, work: Path, precision: str) -> Path:
    """npu/`precision` QDQ of `src` by this tool, the unroll budget lifted (1 sample)."""
    import yaml

    from winml_recipes import api
    from winml_recipes.authoring import write_adhoc_project
    from winml_recipes.graph import recurrent

    recurrent.MAX_MODEL_STEPS = 10**6  # measure past the budget: that is the point
    recipe, _ = write_adhoc_project(src, work / "project", "npu", precision, {})
    body = yaml.safe_load(recipe.read_text())
    body["steps"] = [
        "normalize",
        "fix_shapes",
        {"prepare": {"stages": ["fold", "recurrent"], "check_samples": 0}},
        {"quantize": {"calibration": {"samples": 1}}},
    ]
    recipe.write_text(yaml.safe_dump(body, sort_keys=False))
    result = api.build(recipe, device="npu", precision=precision, output_root=work / "out",
                       catalog_dir=work / "project" / "catalog",
                       cache_dir=work / "cache")  # fmt: skip
    return Path(result.models["model"])


def measure(hidden: int, steps: int, precision: str, work: Path, cap_mb: float) -> dict:
    import onnx

    folder = work / f"h{hidden}-s{steps}-{precision}"
    folder.mkdir(parents=True, exist_ok=True)
    qdq = quantize(export_gru(folder / "gru.onnx", hidden, steps), folder, precision)
    nodes = len(onnx.load(qdq, load_external_data=False).graph.node)
    row = {"hidden": hidden, "steps": steps, "precision": precision, "qdq_nodes": nodes}
    row.update(_python(_PREPARE, str(qdq), cap_mb=cap_mb))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--steps", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    parser.add_argument("--precision", nargs="+", default=["w8a16"])
    parser.add_argument("--cap-gb", type=float, default=8.0)
    parser.add_argument("--work", type=Path, default=Path("/tmp/recurrent-budget"))
    args = parser.parse_args()
    for precision in args.precision:
        for hidden in args.hidden:
            for steps in args.steps:
                row = measure(hidden, steps, precision, args.work, args.cap_gb * 1024)
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
