"""`build --onnx` reads the dims nothing set from the calibration npz."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import cli


def _sequence_model(path: Path) -> Path:
    """ids [batch, sequence] -> embedding -> mean over the sequence."""
    table = np.random.default_rng(0).standard_normal((50, 4)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["table", "ids"], ["e"]),
            helper.make_node("ReduceMean", ["e"], ["y"], axes=[1], keepdims=0),
        ],
        "seq",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(table, "table")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.save(model, str(path))
    return path


def test_sequence_length_comes_from_the_calibration_data(tmp_path: Path) -> None:
    model = _sequence_model(tmp_path / "seq.onnx")
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "calib.npz", ids=rng.integers(0, 50, (8, 1, 12)))
    base = ("build", "--onnx", model, "--device", "npu", "--precision", "w8a16",
            "-o", tmp_path / "o")  # fmt: skip
    without = cli(*base)
    assert without.exit_code == 2 and "dims with no value (ids: sequence)" in without.stderr
    done = cli(*base, "--calibration-data", tmp_path / "calib.npz", "--json")
    assert done.exit_code == 0, done.stderr
    steps = {s["pass"]: s for s in json.loads(done.stdout)["components"]["model"]["steps"]}
    assert steps["fix_shapes"]["metrics"]["fixed"] == {"batch": 1, "sequence": 12}


def test_a_batch_shaped_array_is_still_ambiguous(tmp_path: Path) -> None:
    """(8, 12) for [batch, sequence]: the sequence is read (12), the batch is not (8 samples
    or one batch of 8?), so the npz check still refuses it."""
    model = _sequence_model(tmp_path / "seq.onnx")
    np.savez(tmp_path / "calib.npz", ids=np.zeros((8, 12), np.int64))
    done = cli("build", "--onnx", model, "--device", "npu", "--precision", "w8a16",
               "--calibration-data", tmp_path / "calib.npz", "-o", tmp_path / "o")  # fmt: skip
    assert done.exit_code == 2
    assert "one sample of batch 8, or 8 samples?" in done.stderr
    assert not (tmp_path / "o").exists()
