"""A MatMul with a constant batch of matrices ([heads, K, N], as SAM v1's relative position
tables are) built for the CPU EP at int8.

Before: onnxruntime's quantizer gave the constant one scale per index of axis 1 and the CPU
EP's QLinearMatMul (which its default optimization level fuses the QDQ MatMul into) failed
at run time: "weight zero point must be a scalar, 1D tensor of size 1, or last to second
dimension is 1"; verify stopped with exit 2 (the tiny SAM v1 folder at cpu/int8 too). Now
such constants are quantized per tensor (quant/ort.py batched_weights)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.conftest import cli

torch = pytest.importorskip("torch")


class RelativeTable(torch.nn.Module):
    """x [1, 4, 8, 16] @ table [4, 16, 4]: one matrix per head, like rel-pos attention."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)
        self.table = torch.nn.Parameter(torch.randn(4, 16, 4))

    def forward(self, x):
        return torch.matmul(self.proj(x), self.table)


def test_a_constant_batch_of_matrices_runs_at_the_cpu_eps_default_level(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    model = RelativeTable().eval()
    torch.onnx.export(model, (torch.randn(1, 4, 8, 16),), "m.onnx", input_names=["x"],
                      output_names=["y"], dynamo=False)  # fmt: skip
    rng = np.random.default_rng(0)
    np.savez("calib.npz", x=rng.normal(0, 1, (16, 1, 4, 8, 16)).astype(np.float32))
    np.savez("heldout.npz", x=rng.normal(0, 1, (6, 1, 4, 8, 16)).astype(np.float32))
    data = ("--calibration-data", "calib.npz", "--eval-data", "heldout.npz")
    done = cli("build", "--onnx", "m.onnx", "--device", "cpu", "--precision", "int8", *data,
               "-o", "out")  # fmt: skip
    assert done.exit_code == 0, done.stderr[-1500:]
    folder = next((tmp_path / "out").glob("*/cpu-int8"))
    shipped = onnx.load(folder / "model" / "model.onnx")
    rank3 = {i.name for i in shipped.graph.initializer if len(i.dims) == 3}
    tables = [n for n in shipped.graph.node
              if n.op_type == "DequantizeLinear" and n.input[0] in rank3]  # fmt: skip
    assert len(tables) == 1  # the table is quantized, with one scale
    scale = next(i for i in shipped.graph.initializer if i.name == tables[0].input[1])
    assert list(scale.dims) == []
    # and the shipped model runs at onnxruntime's default level (a plain session), near float
    import onnxruntime as ort

    x = rng.normal(0, 1, (1, 4, 8, 16)).astype(np.float32)
    got = ort.InferenceSession(str(folder / "model" / "model.onnx")).run(None, {"x": x})[0]
    want = model(torch.from_numpy(x)).detach().numpy()
    assert 10 * np.log10((want**2).sum() / ((want - got) ** 2).sum()) > 20
    manifest = json.loads((folder / "manifest.json").read_text())
    verify = next(s for s in manifest["components"]["model"]["steps"] if s["pass"] == "verify")
    assert verify["metrics"]["passed"]
