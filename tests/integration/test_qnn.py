"""npu builds on the QNN HTP backend itself (onnxruntime-qnn; emulated Hexagon on x86_64).

Every session here is a real QNN HTP session: placement, fallback, verification on the
NPU's arithmetic, the HTP quantization rules, EPContext compile, and a host where the EP
library cannot load (simulated by pointing WINML_RECIPES_QNN_LIBRARY at a missing file).
"""

from __future__ import annotations

import json
import logging
import platform
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import cli_subprocess
from winml_recipes import api
from winml_recipes.onnx.metrics import compare_runs
from winml_recipes.runtime.providers import availability
from winml_recipes.runtime.sessions import open_session, run_model
from winml_recipes.sdk.errors import ExecutionProviderError, PassError

# onnxruntime-qnn ships wheels for Windows and Linux x86_64 only (pyproject's `qnn` extra);
# on those platforms `make install` installs it and every test here must run.
QNN_WHEELS = platform.system() == "Windows" or (
    platform.system() == "Linux" and platform.machine() == "x86_64"
)
pytestmark = pytest.mark.skipif(not QNN_WHEELS, reason="no onnxruntime-qnn wheel here")


def test_qnn_htp_loads_on_this_host() -> None:
    """`make install` installs onnxruntime-qnn: every test below needs the real backend."""
    assert availability("qnn-htp").available, availability("qnn-htp").reason


def _save(path: Path, nodes, inputs, outputs, inits=()) -> Path:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.save(model, str(path))
    return path


def _vi(name: str, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _const(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def erf_graph(path: Path) -> Path:
    """Relu -> Erf -> Relu: QNN takes the Relus and refuses Erf."""
    return _save(
        path,
        [
            helper.make_node("Relu", ["x"], ["a"], name="first"),
            helper.make_node("Erf", ["a"], ["b"], name="odd"),
            helper.make_node("Relu", ["b"], ["y"], name="last"),
        ],
        [_vi("x", [1, 4, 8])],
        [_vi("y", [1, 4, 8])],
    )


def scatter_graph(path: Path) -> Path:
    """Pixel coordinates normalized in place, as SAM 3's prompt encoder does.

    `p[..., 0] = p[..., 0] / 112` (ScatterElements along the last axis) then a scale.
    onnxruntime's quantizer gives data, updates and output their own encodings; HTP reads
    the updates' integers with the data's scale.
    """
    return _save(
        path,
        [
            helper.make_node("Add", ["x", "one"], ["p"], name="add"),
            helper.make_node("Slice", ["p", "s0", "s1", "ax"], ["first"], name="slice"),
            helper.make_node("Div", ["first", "size"], ["scaled"], name="div"),
            helper.make_node(
                "ScatterElements", ["p", "idx", "scaled"], ["sc"], axis=3, name="scatter"
            ),
            helper.make_node("Mul", ["sc", "two"], ["y"], name="mul"),
        ],
        [_vi("x", [1, 1, 4, 2])],
        [_vi("y", [1, 1, 4, 2])],
        [
            _const("one", np.float32(1.0)),
            _const("s0", np.array([0], np.int64)),
            _const("s1", np.array([1], np.int64)),
            _const("ax", np.array([3], np.int64)),
            _const("size", np.float32(112.0)),
            _const("idx", np.zeros((1, 1, 4, 1), np.int64)),
            _const("two", np.float32(2.0)),
        ],
    )


def reshaped_heads_graph(path: Path) -> Path:
    """Three detection heads joined as YOLOX does: each head concatenates a raw map and a
    sigmoid map, is reshaped to [1, 12, 16], and the three are concatenated (ranges 1:8:64).
    At 8 bits HTP reads each reshaped head in the outer Concat's output encoding."""
    rng = np.random.default_rng(5)
    nodes, inits, heads = [], [], []
    for i, gain in enumerate((0.25, 2.0, 16.0)):
        gains = (rng.normal(0, 1, (1, 6, 1, 1)) * gain).astype(np.float32)
        inits += [_const(f"k{i}", gains), _const(f"shape{i}", np.array([1, 12, -1], np.int64))]
        nodes += [
            helper.make_node("Mul", ["x", f"k{i}"], [f"box{i}"], name=f"box{i}"),
            helper.make_node("Sigmoid", ["x"], [f"obj{i}"], name=f"obj{i}"),
            helper.make_node(
                "Concat", [f"box{i}", f"obj{i}"], [f"head{i}"], axis=1, name=f"head{i}"
            ),
            helper.make_node("Reshape", [f"head{i}", f"shape{i}"], [f"flat{i}"], name=f"flat{i}"),
        ]
        heads.append(f"flat{i}")
    nodes.append(helper.make_node("Concat", heads, ["y"], axis=2, name="join"))
    return _save(path, nodes, [_vi("x", [1, 6, 4, 4])], [_vi("y", [1, 12, 48])], inits)


def zero_bias_relu_graph(path: Path) -> Path:
    """MatMul -> Add(all-zero bias) -> Relu -> MatMul (a zero-initialized Linear bias)."""
    rng = np.random.default_rng(3)
    return _save(
        path,
        [
            helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
            helper.make_node("Add", ["h", "b1"], ["hb"], name="bias"),
            helper.make_node("Relu", ["hb"], ["r"], name="relu"),
            helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2"),
        ],
        [_vi("x", [1, 8, 32])],
        [_vi("y", [1, 8, 16])],
        [
            _const("w1", rng.normal(0, 0.2, (32, 64)).astype(np.float32)),
            _const("b1", np.zeros(64, np.float32)),
            _const("w2", rng.normal(0, 0.2, (64, 16)).astype(np.float32)),
        ],
    )


def project(root: Path, model: Path, x_range: str, steps: str) -> Path:
    """catalog/<model>.yaml + recipes/r.yaml around one local model (static shapes)."""
    (root / "catalog").mkdir(parents=True, exist_ok=True)
    (root / "recipes").mkdir(exist_ok=True)
    name = model.stem
    shape = [d.dim_value for d in onnx.load(str(model)).graph.input[0].type.tensor_type.shape.dim]
    out_shape = [
        d.dim_value for d in onnx.load(str(model)).graph.output[0].type.tensor_type.shape.dim
    ]
    (root / "catalog" / f"{name}.yaml").write_text(
        f"schema_version: 1\nname: {name}\ntask: feature-extraction\nlicense: mit\n"
        f"components:\n  model:\n    source: {{ref: {model}}}\n"
        f"    inputs:\n      x: {{dtype: float32, shape: {shape}, range: {x_range}}}\n"
        f"    outputs:\n      y: {{shape: {out_shape}}}\n"
    )
    recipe = root / "recipes" / "r.yaml"
    recipe.write_text(
        f"schema_version: 1\nname: r\nmodel: {name}\n"
        "targets:\n  - {device: npu, precision: w8a16}\n"
        f"steps: {steps}\n"
    )
    return recipe


def steps_of(result, component: str = "model") -> dict[str, dict]:
    return {s["pass"]: s for s in result.manifest["components"][component]["steps"]}


def feeds(low: float, high: float, shape, count: int = 4) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(11)
    return [{"x": rng.uniform(low, high, shape).astype(np.float32)} for _ in range(count)]


# --------------------------------------------------------------------------- placement


def test_fallback_off_names_the_refused_node(tmp_path: Path) -> None:
    model = erf_graph(tmp_path / "erf.onnx")
    with pytest.raises(ExecutionProviderError) as err:
        open_session(model, "qnn-htp", fallback=False)
    message = str(err.value)
    assert "QNNExecutionProvider (htp) refused 1 node(s): odd (Erf)" in message
    assert "allow_cpu_fallback" in message
    session = open_session(model, "qnn-htp", fallback=True)
    assert session.placement is not None
    assert session.placement.nodes == {"QNNExecutionProvider": 2, "CPUExecutionProvider": 1}
    assert session.placement.fallback_nodes == (("odd", "Erf"),)
    # Relu | Erf | Relu: the CPU node splits the QNN nodes into two partitions
    assert session.placement.partitions["QNNExecutionProvider"] == 2


def test_verify_fails_on_a_refused_op_unless_fallback_is_allowed(tmp_path: Path) -> None:
    model = erf_graph(tmp_path / "erf.onnx")
    recipe = project(tmp_path, model, "[-1.0, 1.0]", "[verify]")
    with pytest.raises(ExecutionProviderError, match=r"refused 1 node\(s\): odd \(Erf\)"):
        api.build(recipe, device="npu", precision="w8a16", output_root=tmp_path / "out")
    assert [p.name for p in (tmp_path / "out" / "r").iterdir()] == ["npu-w8a16.failed"]
    recipe.write_text(
        recipe.read_text().replace("[verify]", "[{verify: {allow_cpu_fallback: true}}]")
    )
    result = api.build(recipe, device="npu", precision="w8a16", output_root=tmp_path / "out")
    verify = steps_of(result)["verify"]["metrics"]
    assert verify["verified_on"] == "qnn-htp" and verify["cpu_fallback_allowed"] is True
    assert verify["placement"]["nodes"] == {"QNNExecutionProvider": 2, "CPUExecutionProvider": 1}
    assert verify["placement"]["fallback_nodes"] == [{"name": "odd", "op_type": "Erf"}]
    ep = verify["execution_provider"]
    assert ep["backend"] == "htp" and ep["versions"]["onnxruntime-qnn"] == "2.7.0"
    assert ep["versions"]["qnn_sdk"]


def test_dynamic_shapes_are_named_when_htp_refuses(tmp_path: Path) -> None:
    model = _save(
        tmp_path / "dyn.onnx",
        [helper.make_node("Relu", ["x"], ["y"], name="r")],
        [_vi("x", ["batch", 8])],
        [_vi("y", ["batch", 8])],
    )
    with pytest.raises(ExecutionProviderError, match=r"dynamic dims \(batch\).*add fix_shapes"):
        open_session(model, "qnn-htp", fallback=False)


# --------------------------------------------------------------------------- HTP rules


def _ort_qnn_quantize(src: Path, out: Path, data: list[dict], act=None) -> Path:
    """onnxruntime's own QNN quantization, without this project's HTP rules."""
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(data)

        def get_next(self):
            return next(self.it, None)

    logging.getLogger().setLevel(logging.ERROR)
    config = get_qnn_qdq_config(
        str(src), Reader(), activation_type=act or QuantType.QUInt16, weight_type=QuantType.QUInt8
    )
    quantize(str(src), str(out), config)
    return out


def _sqnr(reference: list[dict], candidate: list[dict], name: str = "y") -> float:
    return compare_runs(reference, candidate)[name]["sqnr_db"]


def test_ort_scatter_quantization_is_wrong_on_htp_and_right_in_simulation(tmp_path) -> None:
    """The divergence this project fixes, measured with onnxruntime's quantizer alone."""
    model = scatter_graph(tmp_path / "scatter.onnx")
    data = feeds(0.0, 100.0, (1, 1, 4, 2), 8)
    quantized = _ort_qnn_quantize(model, tmp_path / "q.onnx", data)
    reference = run_model(model, data)
    assert _sqnr(reference, run_model(quantized, data)) > 40  # CPU EP: Q/DQ simulated in float
    assert _sqnr(reference, run_model(quantized, data, "qnn-htp")) < 10  # the NPU


def test_build_quantizes_scatter_right_on_htp_and_compare_finds_the_ort_one(tmp_path) -> None:
    model = scatter_graph(tmp_path / "scatter.onnx")
    recipe = project(
        tmp_path, model, "[0.0, 100.0]", "[quantize, {verify: {min_sqnr_db: 40}}, compile]"
    )
    result = api.build(recipe, device="npu", precision="w8a16", output_root=tmp_path / "out")
    steps = steps_of(result)
    groups = steps["quantize"]["metrics"]["shared_encodings"]
    assert groups == [["first", "p", "sc", "scaled"]]  # Slice propagates p's encoding
    verify = steps["verify"]["metrics"]
    assert verify["verified_on"] == "qnn-htp"
    assert verify["placement"] == {
        "nodes": {"QNNExecutionProvider": verify["placement"]["nodes"]["QNNExecutionProvider"]},
        "partitions": {"QNNExecutionProvider": 1},
    }
    assert verify["outputs"]["y"]["sqnr_db"] >= 40
    # onnxruntime's quantization of the same graph: `compare` points at the scatter
    bad = _ort_qnn_quantize(model, tmp_path / "ort.onnx", feeds(0.0, 100.0, (1, 1, 4, 2), 8))
    done = cli_subprocess("compare", bad, model, "--range", "x=0:100", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["verified_on"] == "qnn-htp"
    assert report["tapped_vs_untapped_db"] > 40  # the taps did not change what HTP computes
    first = report["first_divergence"]
    assert (first["tensor"], first["op_type"]) == ("sc", "ScatterElements")
    assert first["simulation_vs_float_db"] > 40 > 10 > first["target_vs_float_db"]
    text = cli_subprocess("compare", bad, model, "--range", "x=0:100")
    assert "first divergence: sc (ScatterElements scatter)" in text.stdout


def test_verify_threshold_fails_on_htp_where_the_simulation_passes(tmp_path: Path) -> None:
    """Without the HTP rules (plain QDQ, ep_rules: false), only the NPU shows the damage."""
    model = scatter_graph(tmp_path / "scatter.onnx")
    # (repair_divergence: false: the build's own repair would fix the scatter)
    quantize = (
        "{quantize: {ep_rules: false, repair_divergence: false, "
        "op_types: [Add, Slice, Div, ScatterElements, Mul]}}"
    )
    recipe = project(
        tmp_path, model, "[0.0, 100.0]", f"[{quantize}, {{verify: {{min_sqnr_db: 30}}}}]"
    )
    # (the MLP's catalog task is feature-extraction: its cosine gate fails first)
    with pytest.raises(PassError, match=r"verification on qnn-htp failed: .*y: SQNR"):
        api.build(recipe, device="npu", precision="w8a16", output_root=tmp_path / "out")
    lax = "{verify: {min_sqnr_db: -200, min_cosine: -1, task: {}}}"
    recipe.write_text(recipe.read_text().replace("{verify: {min_sqnr_db: 30}}", lax))
    result = api.build(recipe, device="npu", precision="w8a16", output_root=tmp_path / "out")
    verify = steps_of(result)["verify"]["metrics"]
    assert verify["outputs"]["y"]["sqnr_db"] < 30
    assert verify["cpu_simulation"]["outputs"]["y"]["sqnr_db"] > 30


def test_ort_reshaped_concat_inputs_are_wrong_on_htp_at_8_bits(tmp_path: Path) -> None:
    """The divergence the Concat rule fixes, with onnxruntime's quantizer alone."""
    from onnxruntime.quantization import QuantType

    model = reshaped_heads_graph(tmp_path / "heads.onnx")
    data = feeds(-1.0, 1.0, (1, 6, 4, 4), 8)
    quantized = _ort_qnn_quantize(model, tmp_path / "q.onnx", data, QuantType.QUInt8)
    reference = run_model(model, data)
    assert _sqnr(reference, run_model(quantized, data)) > 30  # CPU EP: Q/DQ simulated in float
    assert _sqnr(reference, run_model(quantized, data, "qnn-htp")) < 0  # the NPU


def test_build_gives_reshaped_concat_inputs_the_output_encoding(tmp_path: Path) -> None:
    model = reshaped_heads_graph(tmp_path / "heads.onnx")
    recipe = project(tmp_path, model, "[-1.0, 1.0]", "[quantize, {verify: {min_sqnr_db: 30}}]")
    recipe.write_text(recipe.read_text().replace("w8a16", "uint8"))
    result = api.build(recipe, device="npu", precision="uint8", output_root=tmp_path / "out")
    steps = steps_of(result)
    # the inner Concats' outputs, their Reshapes and the outer Concat: one encoding
    groups = steps["quantize"]["metrics"]["shared_encodings"]
    assert groups == [["flat0", "flat1", "flat2", "head0", "head1", "head2", "y"]]
    verify = steps["verify"]["metrics"]
    assert verify["verified_on"] == "qnn-htp"
    assert verify["outputs"]["y"]["sqnr_db"] >= 30


def test_zero_bias_before_relu_is_bypassed(tmp_path: Path) -> None:
    model = zero_bias_relu_graph(tmp_path / "zb.onnx")
    data = feeds(-2.0, 2.0, (1, 8, 32), 4)
    reference = run_model(model, data)
    bad = _ort_qnn_quantize(model, tmp_path / "ort.onnx", data)
    assert _sqnr(reference, run_model(bad, data)) > 30
    assert _sqnr(reference, run_model(bad, data, "qnn-htp")) < 10
    recipe = project(
        tmp_path, model, "[-2.0, 2.0]",
        "[{prepare: {stages: [ep]}}, quantize, {verify: {min_sqnr_db: 30}}]",
    )  # fmt: skip
    result = api.build(recipe, device="npu", precision="w8a16", output_root=tmp_path / "out")
    steps = steps_of(result)
    rewrites = steps["prepare"]["metrics"]["rewrites"]
    assert {"rule": "zero_constant_add", "nodes": ["bias"], "count": 1} in rewrites
    assert steps["verify"]["metrics"]["outputs"]["y"]["sqnr_db"] >= 30
    built = onnx.load(str(result.models["model"]))
    assert "Add" not in {n.op_type for n in built.graph.node}


# --------------------------------------------------------------------------- compile


def _mlp_project(tmp_path: Path, compile_step: str) -> Path:
    model = zero_bias_relu_graph(tmp_path / "mlp.onnx")
    # (the zero bias before ReLU needs prepare's ep stage on HTP: see the test above)
    return project(tmp_path, model, "[-2.0, 2.0]", f"[prepare, quantize, verify, {compile_step}]")


def test_compile_writes_an_epcontext_model_that_matches_on_htp(tmp_path: Path) -> None:
    """Run in a fresh process: onnxruntime-qnn keeps the first `htp_arch`/`soc_model` a
    process gave it for every later QNN session there (measured: after this build in the
    suite's process, a graph HTP fails to finalize with MEM_ALLOC was refused node by node
    instead, and an LSTM that cannot finalize did), so later tests would run on arch 73."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=spawn) as pool:
        pool.submit(_compile_for_arch_73, tmp_path).result()


def _compile_for_arch_73(tmp_path: Path) -> None:
    recipe = _mlp_project(tmp_path, "{compile: {htp_arch: 73, soc_model: 60}}")
    result = api.build(recipe, device="npu", precision="w8a16", output_root=tmp_path / "out")
    out = result.output_dir / "model"
    assert sorted(p.name for p in out.iterdir()) == [
        "graph.yaml", "model.onnx", "model_ctx.onnx", "model_ctx_qnn.bin"
    ]  # fmt: skip
    step = steps_of(result)["compile"]
    metrics = step["metrics"]
    assert metrics["provider_options"] == {"htp_arch": "73", "soc_model": "60"}
    assert metrics["compiled_vs_uncompiled"]["bit_exact"] is True
    assert metrics["execution_provider"]["versions"]["qnn_sdk"]
    from winml_recipes.onnx.io import file_sha256

    listed = {a["name"]: a["sha256"] for a in step["artifacts"]}
    assert listed == {n: file_sha256(out / n) for n in ("model_ctx.onnx", "model_ctx_qnn.bin")}
    files = {f["path"] for f in result.manifest["components"]["model"]["artifact"]["files"]}
    assert files == {"model/model.onnx", "model/model_ctx.onnx", "model/model_ctx_qnn.bin"}
    compiled = onnx.load(str(out / "model_ctx.onnx"))
    assert "EPContext" in {n.op_type for n in compiled.graph.node}
    # the compiled model runs on HTP without fallback, and agrees with the float model
    data = feeds(-2.0, 2.0, (1, 8, 32), 2)
    reference = run_model(tmp_path / "mlp.onnx", data)
    session = open_session(out / "model_ctx.onnx", "qnn-htp", fallback=False)
    assert _sqnr(reference, [session.run(f) for f in data]) >= 30
    # a second build is served from the cache with the same files
    again = api.build(recipe, device="npu", precision="w8a16", output_root=tmp_path / "again")
    assert steps_of(again)["compile"]["status"] == "cached"
    assert (
        file_sha256(again.output_dir / "model" / "model_ctx_qnn.bin") == listed["model_ctx_qnn.bin"]
    )


def test_compile_embedded_without_the_uncompiled_model(tmp_path: Path) -> None:
    """Also `samples: 0` (a graph the emulated backend runs too slowly): the compiled model
    is loaded back with fallback off, not run; the record and the summary say so."""
    recipe = _mlp_project(tmp_path, "{compile: {embed: true, keep_uncompiled: false, samples: 0}}")
    result = api.build(recipe, device="npu", precision="w8a16", output_root=tmp_path / "out")
    metrics = steps_of(result)["compile"]["metrics"]
    assert metrics["compiled_vs_uncompiled"] is None and metrics["loaded_back_seconds"] >= 0
    from winml_recipes.presenter import summary_lines

    assert any("(loaded back on the EP with every node there; not run)" in line
               for line in summary_lines(result.record, result.output_dir))  # fmt: skip
    out = result.output_dir / "model"
    assert sorted(p.name for p in out.iterdir()) == ["graph.yaml", "model_ctx.onnx"]
    assert result.manifest["components"]["model"]["artifact"]["path"] == "model/model_ctx.onnx"
    session = open_session(out / "model_ctx.onnx", "qnn-htp", fallback=False)
    assert session.placement is not None and set(session.placement.nodes) == {
        "QNNExecutionProvider"
    }


# --------------------------------------------------------------------------- no EP here


def test_a_host_without_the_ep_verifies_on_the_simulation_and_says_so(tmp_path: Path) -> None:
    recipe = _mlp_project(tmp_path, "compile")
    env = {"WINML_RECIPES_QNN_LIBRARY": str(tmp_path / "missing" / "libQnn.so")}
    done = cli_subprocess(
        "build", recipe, "--device", "npu", "--precision", "w8a16", "-o", tmp_path / "o", env=env
    )
    assert done.returncode == 0, done.stderr
    assert "verified on cpu-simulation: QNNExecutionProvider is not available here" in done.stdout
    assert "compile skipped: QNNExecutionProvider not available here" in done.stdout
    manifest = json.loads((tmp_path / "o" / "r" / "npu-w8a16" / "manifest.json").read_text())
    steps = {s["pass"]: s for s in manifest["components"]["model"]["steps"]}
    verify = steps["verify"]["metrics"]
    assert verify["verified_on"] == "cpu-simulation"
    assert verify["execution_provider"]["available"] is False
    assert "EP library not found" in verify["execution_provider"]["reason"]
    assert "placement" not in verify and "cpu_simulation" not in verify
    assert steps["compile"]["status"] == "skipped"
    # a recipe that requires the EP fails there, in one line
    recipe.write_text(recipe.read_text().replace("verify,", "{verify: {require_ep: true}},"))
    failed = cli_subprocess(
        "build", recipe, "--device", "npu", "--precision", "w8a16", "-o", tmp_path / "p", env=env
    )
    assert failed.returncode == 2
    line = next(i for i, t in enumerate(recipe.read_text().splitlines(), 1) if "verify" in t)
    assert failed.stderr.strip().splitlines() == [
        f"error: {recipe}:{line}: model/verify [npu/w8a16]: the npu target requires "
        "QNNExecutionProvider (qnn-htp), which cannot be used here: EP library not found: "
        f"{env['WINML_RECIPES_QNN_LIBRARY']}; evidence kept in "
        f"{tmp_path / 'p' / 'r' / 'npu-w8a16.failed'}/"
    ]
    listed = cli_subprocess("passes", env=env)
    assert "qnn-htp  QNNExecutionProvider   devices: npu   not available: EP library" in (
        listed.stdout
    )


def test_on_target_false_verifies_on_the_simulation_and_says_why(tmp_path: Path) -> None:
    recipe = _mlp_project(tmp_path, "{verify: {on_target: false}}").read_text()
    path = tmp_path / "recipes" / "r.yaml"
    steps = "[prepare, quantize, {verify: {on_target: false}}]"
    path.write_text(
        recipe.replace("[prepare, quantize, verify, {verify: {on_target: false}}]", steps)
    )
    done = cli_subprocess(
        "build", path, "--device", "npu", "--precision", "w8a16", "-o", tmp_path / "o"
    )
    assert done.returncode == 0, done.stderr
    assert "verified on cpu-simulation: the recipe verifies on the CPU EP (on_target)" in (
        done.stdout
    )
    manifest = json.loads((tmp_path / "o" / "r" / "npu-w8a16" / "manifest.json").read_text())
    verify = manifest["components"]["model"]["steps"][2]["metrics"]
    assert verify["verified_on"] == "cpu-simulation" and "placement" not in verify
