"""onnxruntime's QDQ quantizer loops for ever when a tensor shares the parameters of one that
is never quantized; the tool stops that with a one-line error instead of hanging."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import REPO

SCRIPT = """
import sys
from pathlib import Path
from winml_recipes.quant.calibrate import write_ort_cache
from winml_recipes.quant.config import QuantizeOptions, resolve
from winml_recipes.quant.ort import quantize_static_qdq
from winml_recipes.sdk.errors import PassError
from winml_recipes.sdk.target import Target

folder = Path(sys.argv[1])
ranges = folder / "ranges.json"
write_ort_cache({"x": (-1.0, 1.0), "m": (-1.0, 1.0), "r": (-1.0, 1.0)}, ranges)
from winml_recipes.eps.qnn import PLUGIN as QNN

# QNN's rules force quantization of data-movement ops whatever their input
cfg = resolve(QuantizeOptions(), Target("npu", "w8a16"))
try:
    quantize_static_qdq(folder / "m.onnx", folder / "q.onnx", cfg, ranges, {}, [], QNN.quant_rules)
except PassError as exc:
    print(exc)
    sys.exit(7)
"""


def test_a_tensor_sharing_an_unquantized_tensors_parameters_fails_instead_of_hanging(tmp_path):
    # `m` comes from an op of another domain: shape inference cannot type it, so onnxruntime
    # does not quantize it, and the Reshape's output shares its parameters
    shape = numpy_helper.from_array(np.array([2, 8], np.int64), "shape")
    graph = helper.make_graph(
        [helper.make_node("Gelu", ["x"], ["m"], domain="com.microsoft"),
         helper.make_node("Reshape", ["m", "shape"], ["r"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
        [helper.make_tensor_value_info("r", TensorProto.FLOAT, [2, 8])],
        [shape],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 7, done.stderr[-2000:]
    assert "would never finish" in done.stdout and "r (shares m)" in done.stdout
