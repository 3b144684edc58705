"""A recipe's npz data at another size than the one the build fixes its shapes to is refused
when the build is planned, naming the file and the size, not at verify after every step."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from tests.conftest import cli

CATALOG = """\
schema_version: 1
name: enc
task: feature-extraction
license: mit
components:
  model:
    source: {ref: ./enc.onnx}
    dims: {batch: 1, height: 8, width: 8}
    inputs:
      pixels: {dtype: float32, shape: [batch, 3, height, width], range: [-1.0, 1.0]}
    outputs:
      features: {shape: [batch, 2, height, width]}
"""


def _project(root: Path, held_out_height: int) -> Path:
    (root / "catalog").mkdir(parents=True)
    (root / "recipes").mkdir()
    (root / "data").mkdir()
    w = helper.make_tensor("w", TensorProto.FLOAT, [2, 3, 1, 1], [0.1, -0.2, 0.3] * 2)
    dims = ["batch", 3, "height", "width"]
    graph = helper.make_graph(
        [helper.make_node("Conv", ["pixels", "w"], ["features"], name="conv")],
        "enc",
        [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, dims)],
        [
            helper.make_tensor_value_info(
                "features", TensorProto.FLOAT, ["batch", 2, "height", "width"]
            )
        ],
        initializer=[w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, root / "catalog" / "enc.onnx")
    (root / "catalog" / "enc.yaml").write_text(CATALOG)
    rng = np.random.default_rng(0)
    pixels = rng.uniform(-1, 1, (4, 1, 3, 8, 8)).astype(np.float32)
    np.savez(root / "data" / "calib.npz", pixels=pixels)
    held = rng.uniform(-1, 1, (2, 1, 3, held_out_height, 8)).astype(np.float32)
    np.savez(root / "data" / "held.npz", pixels=held)
    recipe = root / "recipes" / "enc.yaml"
    recipe.write_text(
        "schema_version: 1\nname: enc\nmodel: enc\ntargets:\n  - {device: npu, precision: w8a16}\n"
        "steps:\n  - fix_shapes\n  - quantize: {calibration: {npz: ../data/calib.npz}}\n"
        "  - verify: {npz: ../data/held.npz}\n"
    )
    return recipe


def test_held_out_data_at_another_height_is_refused_at_plan_time(tmp_path: Path) -> None:
    recipe = _project(tmp_path, held_out_height=16)
    done = cli("plan", recipe, "--device", "npu", "--precision", "w8a16")
    assert done.exit_code == 2, done.output
    said = " ".join((done.stderr or done.output).split())
    assert "verify npz: held.npz: input 'pixels' has shape [2, 1, 3, 16, 8]" in said
    assert "expected float32[1, 3, 8, 8]" in said or "[1, 3, 8, 8]" in said
    assert "fixes the model's shapes" in said


def test_data_at_the_fixed_size_plans(tmp_path: Path) -> None:
    recipe = _project(tmp_path, held_out_height=8)
    done = cli("plan", recipe, "--device", "npu", "--precision", "w8a16")
    assert done.exit_code == 0, done.output + (done.stderr or "")
