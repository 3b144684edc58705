"""Automatic mixed precision beyond 16-bit activations: a float-node candidate on CPU."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import cli
from winml_recipes import api, schemas

F = TensorProto.FLOAT


def _weight_damaged_model() -> onnx.ModelProto:
    """h = x * mask (column 0 zeroed), y = h @ w, with w's row 0 = 1000.

    Row 0 never reaches y (h[:, 0] is 0), but it sets w's quantization range: at 8 bits every
    other weight rounds to 0 and y is lost, per tensor or per output channel. No activation
    precision can fix that; keeping the MatMul in float (its weight unquantized) does.
    """
    rng = np.random.default_rng(3)
    w = rng.standard_normal((8, 8)).astype(np.float32)
    w[0, :] = 1000.0
    mask = np.ones((1, 8), np.float32)
    mask[0, 0] = 0.0
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "mask"], ["h"], name="gate"),
            helper.make_node("MatMul", ["h", "w"], ["y"], name="mm"),
        ],
        "g",
        [helper.make_tensor_value_info("x", F, [4, 8])],
        [helper.make_tensor_value_info("y", F, [4, 8])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(mask, "mask")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _build(tmp_path: Path, device: str):
    path = tmp_path / "m.onnx"
    onnx.save(_weight_damaged_model(), str(path))
    (tmp_path / "p").mkdir()
    done = cli("init", str(path), "--name", "m", "--catalog", tmp_path / "p" / "catalog",
               "--recipes", tmp_path / "p" / "recipes")  # fmt: skip
    assert done.exit_code == 0, done.stderr
    recipe = tmp_path / "p" / "recipes" / "m.yaml"
    recipe.write_text(
        f"schema_version: 1\nname: m\nmodel: m\ntargets: [{{device: {device}, precision: uint8}}]\n"
        "steps:\n  - quantize: {mixed_precision: {auto: {target_sqnr_db: 30, max_promoted: 2}}}\n"
    )
    return api.build(recipe, output_root=tmp_path / "o")


def test_a_float_node_fixes_what_no_16bit_activation_can(tmp_path: Path) -> None:
    result = _build(tmp_path, "cpu")
    steps = result.manifest["components"]["model"]["steps"]
    step = next(s for s in steps if s["pass"] == "quantize")
    auto = step["metrics"]["mixed_precision_auto"]
    # with every activation in float the output is still below target: 16 bit cannot help
    assert auto["output_sqnr_db_weights_only"] < 30
    assert auto["rounds"][0]["output_sqnr_db"]["y"] < 30
    assert auto["candidate_kinds"] == ["activation-16bit", "float-node"]
    assert auto["met"] is True and auto["rounds"][-1]["output_sqnr_db"]["y"] >= 30
    first = auto["promoted"][0]
    assert first["kind"] == "float-node" and first["to"] == "float"
    assert first["tensor"] == "w" and first["nodes"] == ["mm"] and first["round"] == 1
    assert first["output_sqnr_db_if_only_this_is_quantized"] < 30
    assert auto["rounds"][1]["added"] == ["w"]
    # the manifest's mixed_precision_auto is described, field by field, by its schema
    jsonschema.Draft202012Validator(schemas.manifest_schema()).validate(result.manifest)
    # the written model computes the MatMul in float: its weight is the float initializer
    model = onnx.load(str(result.models["model"]))
    matmul = next(n for n in model.graph.node if n.op_type == "MatMul")
    assert matmul.input[1] == "w"


def test_no_float_node_on_htp_and_the_manifest_says_why(tmp_path: Path) -> None:
    """On QNN HTP a float node would run on the CPU: only 16-bit activations are tried, and
    they cannot lift a model whose weights alone miss the target."""
    result = _build(tmp_path, "npu")
    steps = result.manifest["components"]["model"]["steps"]
    auto = next(s for s in steps if s["pass"] == "quantize")["metrics"]["mixed_precision_auto"]
    assert auto["scored_on"] == "qnn-htp"
    assert auto["candidate_kinds"] == ["activation-16bit"]
    assert "CPU fallback" in auto["reason"]
    assert all(p["kind"] == "activation-16bit" for p in auto["promoted"])
    assert auto["met"] is False
    assert all(r["output_sqnr_db"]["y"] < 30 for r in auto["rounds"] if "output_sqnr_db" in r)


def test_ranking_stacks_samples_only_where_it_matches_separate_runs(tmp_path: Path) -> None:
    """One run per candidate over the stacked samples scores what one run per sample does;
    a graph whose batch axis is fixed falls back to separate runs."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    from winml_recipes.quant.mixed import _gated_session, _Scorer
    from winml_recipes.runtime.sessions import run_model

    rng = np.random.default_rng(5)
    w1 = rng.standard_normal((8, 16)).astype(np.float32)
    w2 = rng.standard_normal((16, 4)).astype(np.float32)
    float_path = tmp_path / "f.onnx"
    feeds = [{"x": rng.standard_normal((2, 8)).astype(np.float32) * (i + 1)} for i in range(4)]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)

    for batch, stacks in (("n", True), (2, False)):
        graph = helper.make_graph(
            [
                helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"),
                helper.make_node("Relu", ["a"], ["r"], name="relu"),
                helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2"),
            ],
            "g",
            [helper.make_tensor_value_info("x", F, [batch, 8])],
            [helper.make_tensor_value_info("y", F, [batch, 4])],
            [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 10
        onnx.save(model, str(float_path))
        qdq_path = tmp_path / f"q{batch}.onnx"
        quantize_static(str(float_path), str(qdq_path), Reader(), quant_format=QuantFormat.QDQ)
        reference = run_model(float_path, feeds)
        session, gates, _ = _gated_session(qdq_path, float_path, tmp_path, weights=False)
        stacked = _Scorer(session, feeds, reference, list(gates.values()))
        assert (stacked.stacked is not None) is stacks
        separate = _Scorer(session, feeds, reference, list(gates.values()))
        separate.stacked = None
        opened = np.array(1.0, np.float32)
        assert len(gates) >= 3
        for gate in gates.values():
            a, b = stacked({gate: opened}), separate({gate: opened})
            assert abs(a - b) < 0.01, (gate, a, b)
        assert abs(stacked({}) - separate({})) < 0.01


def _nameless_opset12_model() -> onnx.ModelProto:
    """A text recognizer's tail as an opset-12 converter writes it: no node has a name."""
    rng = np.random.default_rng(5)
    w = numpy_helper.from_array(rng.standard_normal((24, 10)).astype(np.float32), "w")
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("Flatten", ["r"], ["f"], axis=1),
            helper.make_node("MatMul", ["f", "w"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", F, [1, 2, 3, 4])],
        [helper.make_tensor_value_info("y", F, [1, 10])],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)], ir_version=7)


def test_auto_on_nameless_nodes_scores_on_the_verify_data(tmp_path: Path) -> None:
    """Two of the issue's crashes: automatic mixed precision on an opset-12 graph with
    nameless nodes ("Node of type Flatten ... does not have a name!"), and a calibration
    file with no samples beyond the calibration ones although the verify step has held-out
    data ("8 samples, all used for calibration"). Nodes get names when normalize reads the
    model; the rounds are scored on the verify step's npz."""
    path = tmp_path / "m.onnx"
    onnx.save(_nameless_opset12_model(), str(path))
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "calib.npz", x=rng.standard_normal((8, 1, 2, 3, 4)).astype(np.float32))
    np.savez(tmp_path / "held.npz", x=rng.standard_normal((6, 1, 2, 3, 4)).astype(np.float32))
    (tmp_path / "p").mkdir()
    done = cli("init", str(path), "--name", "m", "--catalog", tmp_path / "p" / "catalog",
               "--recipes", tmp_path / "p" / "recipes")  # fmt: skip
    assert done.exit_code == 0, done.stderr
    recipe = tmp_path / "p" / "recipes" / "m.yaml"
    recipe.write_text(
        "schema_version: 1\nname: m\nmodel: m\ntargets: [{device: cpu, precision: uint8}]\n"
        "steps:\n  - normalize\n"
        f"  - quantize: {{calibration: {{npz: {tmp_path / 'calib.npz'}, samples: 8}},\n"
        "      mixed_precision: {auto: {target_sqnr_db: 60, max_promoted: 1}}}\n"
        f"  - verify: {{npz: {tmp_path / 'held.npz'}, min_sqnr_db: 0, min_cosine: 0}}\n"
    )
    result = api.build(recipe, output_root=tmp_path / "o")
    steps = {s["pass"]: s for s in result.manifest["components"]["model"]["steps"]}
    assert steps["normalize"]["metrics"]["nodes_named"] >= 3
    auto = steps["quantize"]["metrics"]["mixed_precision_auto"]
    assert auto["held_out_data"] == f"npz: {tmp_path / 'held.npz'}"
    assert auto["rounds"][0]["output_sqnr_db"]["y"] < 60  # scored, not skipped
    names = [n.name for n in onnx.load(str(result.models["model"])).graph.node]
    assert all(names) and len(set(names)) == len(names)
