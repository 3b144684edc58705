"""The quantize and fp16 passes on real (tiny) models, end to end through the engine and CLI.

Models are built here with onnx.helper (fixed seeds); sam3-tiny is exported once per session
(the session cache keeps the export) and quantized for npu/uint8, npu/w8a16 and cpu/int8.
"""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import MLP_CATALOG, RECIPES, cli, make_mlp_onnx
from winml_recipes import api
from winml_recipes.engine.cache import RESULT_FILE

F = TensorProto.FLOAT
QDQ = ("QuantizeLinear", "DequantizeLinear")
ALL_TARGETS = """\
targets:
  - {device: cpu, precision: uint8}
  - {device: cpu, precision: int8}
  - {device: npu, precision: uint8}
  - {device: npu, precision: w8a16}
  - {device: cpu, precision: fp16}
"""


# --------------------------------------------------------------------------- helpers


def _save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, str(path))
    return path


def _model(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def conv_model(seed: int = 0) -> onnx.ModelProto:
    """x[batch,3,8,8] -> Conv(4, 3x3, pad 1) -> Relu -> Conv(2, 3x3, pad 1) -> y[batch,2,8,8]."""
    rng = np.random.default_rng(seed)
    inits = {
        "w1": rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3,
        "b1": rng.standard_normal(4).astype(np.float32) * 0.1,
        "w2": rng.standard_normal((2, 4, 3, 3)).astype(np.float32) * 0.3,
        "b2": rng.standard_normal(2).astype(np.float32) * 0.1,
    }
    pads = [1, 1, 1, 1]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=pads),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["y"], name="conv2", pads=pads),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", F, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("y", F, ["batch", 2, 8, 8])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )


def heavy_model(seed: int = 0) -> onnx.ModelProto:
    """x[batch,64] -> Tan -> t -> MatMul -> y: with x near +-pi/2, `t` is heavy-tailed."""
    w = np.random.default_rng(seed).standard_normal((64, 8)).astype(np.float32)
    nodes = [
        helper.make_node("Tan", ["x"], ["t"], name="tan"),
        helper.make_node("MatMul", ["t", "w"], ["y"], name="mm"),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", F, ["batch", 64])],
        [helper.make_tensor_value_info("y", F, ["batch", 8])],
        [numpy_helper.from_array(w, "w")],
    )


def flat_model() -> onnx.ModelProto:
    """Identity, Exp, Tanh, Neg: nothing onnxruntime quantizes."""
    nodes = [
        helper.make_node("Identity", ["x"], ["a"], name="id"),
        helper.make_node("Exp", ["a"], ["b"], name="exp"),
        helper.make_node("Tanh", ["b"], ["c"], name="tanh"),
        helper.make_node("Neg", ["c"], ["y"], name="neg"),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", F, ["batch", 4])],
        [helper.make_tensor_value_info("y", F, ["batch", 4])],
    )


def scale_model(factor: float, out: str = "h") -> onnx.ModelProto:
    """x[batch,4] -> Mul factor -> `out` (an encoder whose outputs are far from [-1, 1])."""
    return _model(
        [helper.make_node("Mul", ["x", "k"], [out], name="scale")],
        [helper.make_tensor_value_info("x", F, ["batch", 4])],
        [helper.make_tensor_value_info(out, F, ["batch", 4])],
        [numpy_helper.from_array(np.array(factor, np.float32), "k")],
    )


def head_model(inp: str = "h", seed: int = 1) -> onnx.ModelProto:
    """`inp`[batch,4] -> MatMul -> y[batch,3]."""
    w = np.random.default_rng(seed).standard_normal((4, 3)).astype(np.float32)
    return _model(
        [helper.make_node("MatMul", [inp, "w"], ["y"], name="head_mm")],
        [helper.make_tensor_value_info(inp, F, ["batch", 4])],
        [helper.make_tensor_value_info("y", F, ["batch", 3])],
        [numpy_helper.from_array(w, "w")],
    )


CONV_CATALOG = """\
schema_version: 1
name: conv
task: image-feature-extraction
license: mit
components:
  model:
    source: {ref: ./conv.onnx}
    dims: {batch: 1}
    inputs:
      x:
        dtype: float32
        shape: [batch, 3, 8, 8]
        range: [-1.0, 1.0]
        image: {size: 8, mean: [0.5, 0.5, 0.5], std: [0.5, 0.5, 0.5]}
    outputs:
      y: {shape: [batch, 2, 8, 8]}
"""

SIMPLE_CATALOG = """\
schema_version: 1
name: {name}
task: feature-extraction
license: mit
components:
  model:
    source: {{ref: ./{name}.onnx}}
    dims: {{batch: {batch}}}
    inputs:
      x: {{dtype: float32, shape: [batch, {width}], range: [{low}, {high}]}}
    outputs:
      y: {{shape: [batch, {out}]}}
"""

CHAIN_CATALOG = """\
schema_version: 1
name: chain
task: feature-extraction
license: mit
components:
  enc:
    source: {ref: ./enc.onnx}
    dims: {batch: 2}
    inputs:
      x: {dtype: float32, shape: [batch, 4], range: [-1.0, 1.0]}
    outputs:
      h: {shape: [batch, 4]}
  dec:
    source: {ref: ./dec.onnx}
    dims: {batch: 2}
    inputs:
      h: {dtype: float32, shape: [batch, 4], range: [-1.0, 1.0]}
    outputs:
      y: {shape: [batch, 3]}
"""


class Project:
    """tmp/catalog with the test models, tmp/recipes, an output root and (optionally) a cache."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.catalog = root / "catalog"
        self.recipes = root / "recipes"
        self.out = root / "out"
        self.cache = root / "cache"
        self.catalog.mkdir(parents=True, exist_ok=True)
        self.recipes.mkdir(exist_ok=True)
        make_mlp_onnx(self.catalog / "mlp.onnx")
        (self.catalog / "mlp.yaml").write_text(MLP_CATALOG.format(ref="./mlp.onnx"))
        _save(conv_model(), self.catalog / "conv.onnx")
        (self.catalog / "conv.yaml").write_text(CONV_CATALOG)
        _save(heavy_model(), self.catalog / "heavy.onnx")
        (self.catalog / "heavy.yaml").write_text(
            SIMPLE_CATALOG.format(name="heavy", batch=16, width=64, low=-1.565, high=1.565, out=8)
        )
        _save(flat_model(), self.catalog / "flat.onnx")
        (self.catalog / "flat.yaml").write_text(
            SIMPLE_CATALOG.format(name="flat", batch=2, width=4, low=-1.0, high=1.0, out=4)
        )
        _save(scale_model(20.0), self.catalog / "enc.onnx")
        _save(head_model(), self.catalog / "dec.onnx")
        (self.catalog / "chain.yaml").write_text(CHAIN_CATALOG)

    def recipe(self, model: str, body: str, name: str = "r", targets: str = ALL_TARGETS) -> Path:
        path = self.recipes / f"{name}.yaml"
        text = f"schema_version: 1\nname: {name}\nmodel: {model}\n{targets}"
        path.write_text(text + textwrap.dedent(body))
        return path

    def build(self, recipe: Path, device: str, precision: str, **kwargs):
        return api.build(recipe, device=device, precision=precision, output_root=self.out, **kwargs)


@pytest.fixture
def proj(tmp_path: Path) -> Project:
    return Project(tmp_path)


@pytest.fixture
def isolated(proj: Project, monkeypatch: pytest.MonkeyPatch) -> Project:
    """A project whose builds use a cache of their own (to check nothing is stored)."""
    monkeypatch.setenv("WINML_RECIPES_CACHE", str(proj.cache))
    return proj


@pytest.fixture(scope="module")
def mproj(tmp_path_factory: pytest.TempPathFactory) -> Project:
    return Project(tmp_path_factory.mktemp("quant-project"))


def steps_of(result, component: str = "model") -> dict[str, dict]:
    return {s["pass"]: s for s in result.manifest["components"][component]["steps"]}


def prepare_rewrites(steps: dict) -> dict[str, int]:
    """Rule -> nodes replaced by the prepare step (its `htp` stage holds HTP's rewrites)."""
    rewrites = steps.get("prepare", {}).get("metrics", {}).get("rewrites", [])
    return {r["rule"]: r["count"] for r in rewrites}


def qmetrics(result, component: str = "model") -> dict:
    return steps_of(result, component)["quantize"]["metrics"]


def load(result, component: str = "model") -> onnx.ModelProto:
    return onnx.load(str(result.models[component]))


def inits_of(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def q_of(model: onnx.ModelProto, tensor: str) -> onnx.NodeProto:
    """The QuantizeLinear reading `tensor`."""
    hits = [n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == tensor]
    assert len(hits) == 1, (tensor, [n.input[0] for n in model.graph.node if n.op_type in QDQ])
    return hits[0]


def scale_of(model: onnx.ModelProto, tensor: str) -> float:
    return float(inits_of(model)[q_of(model, tensor).input[1]])


def zp_type(model: onnx.ModelProto, node: onnx.NodeProto) -> np.dtype:
    return inits_of(model)[node.input[2]].dtype


def ops(model: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in model.graph.node)


def producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {o: n for n in model.graph.node for o in n.output}


def user_error(*args) -> str:
    """Run the CLI: exit 2, exactly one `error: ` line on stderr; returns the message."""
    result = cli(*args)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0][len("error: ") :]


def quantize_entries(cache: Path) -> list[Path]:
    return [
        p for p in cache.rglob(RESULT_FILE) if json.loads(p.read_text()).get("pass") == "quantize"
    ]


def assert_plan_error_wrote_nothing(p: Project, recipe: Path, *args: str) -> str:
    """`build` fails at plan time: same message from `plan`; no output root, empty cache."""
    message = user_error("build", recipe, "-o", p.out, *args)
    assert user_error("plan", recipe, *args) == message
    assert not p.out.exists(), sorted(p.out.rglob("*"))
    assert not p.cache.exists() or not any(p.cache.rglob("*"))
    return message


def assert_run_error_wrote_nothing(p: Project, recipe: Path, device: str, precision: str) -> str:
    """`build` fails while running: no target output, nothing under the output root but
    a lock file and the failed build's evidence (`<target>.failed/`, named in the error),
    and no quantize result in the cache."""
    message = user_error("build", recipe, "-o", p.out, "--device", device, "--precision", precision)
    target = p.out / recipe.stem / f"{device}-{precision}"
    assert not target.exists()
    failed = target.with_name(target.name + ".failed")
    leftovers = [f for f in p.out.rglob("*") if f.is_file() and not f.name.endswith(".lock")
                 and failed not in f.parents]  # fmt: skip
    assert leftovers == []
    if failed.exists():
        assert message.endswith(f"; evidence kept in {failed}/")
        message = message.removesuffix(f"; evidence kept in {failed}/")
    assert quantize_entries(p.cache) == []
    return message


# --------------------------------------------------------------------------- 1. contradictions

PLAN_CONTRADICTIONS = [
    pytest.param(
        "npu",
        "uint8",
        "  - quantize: {format: qoperator, ep_rules: true}\n",
        "quantize: format qoperator cannot be used with ep_rules (qnn-htp needs QDQ); "
        "set format: qdq or ep_rules: false",
        id="qoperator-with-ep-rules",
    ),
    pytest.param(
        "cpu",
        "int8",
        "  - quantize: {mode: dynamic, calibration: {samples: 4}}\n",
        "quantize: calibration options do nothing in dynamic mode (ranges are computed at run "
        "time); remove calibration or use mode: static",
        id="calibration-in-dynamic-mode",
    ),
    pytest.param(
        "npu",
        "w8a16",
        "  - quantize: {mode: auto}\n",
        "quantize: mode auto may choose dynamic quantization, which only the CPU EP runs here "
        "(npu builds for qnn-htp); use mode: static",
        id="mode-auto-off-the-cpu",
    ),
    pytest.param(
        "cpu",
        "int8",
        "  - quantize: {held_out: {npz: 'h*.npz'}}\n",
        "quantize: held_out is the data mode auto scores on; set mode: auto or remove held_out",
        id="held-out-without-mode-auto",
    ),
    pytest.param(
        "cpu",
        "int8",
        "  - quantize: {mode: auto, held_out: {npz: 'h*.npz', images: photos}}\n",
        "quantize.held_out: npz and images are two data sources; keep one of them",
        id="held-out-two-sources",
    ),
    pytest.param(
        "cpu",
        "uint8",
        "  - quantize: {calibration: {percentile: 99.9}}\n",
        "quantize.calibration: percentile is only used by method: percentile; set method: "
        "percentile or remove percentile",
        id="percentile-without-method",
    ),
    pytest.param(
        "cpu",
        "uint8",
        "  - quantize: {calibration: {npz: 'data/*.npz', images: imgs}}\n",
        "quantize.calibration: npz and images are two data sources; keep one of them",
        id="two-calibration-sources",
    ),
    pytest.param(
        "cpu",
        "int8",
        "  - quantize: {held_to: {min_sqnr_db: 20}}\n",
        "quantize: held_to is what mode auto holds its candidates to; set mode: auto or "
        "remove held_to",
        id="held-to-without-mode-auto",
    ),
    pytest.param(
        "cpu",
        "int8",
        "  - quantize: {mode: auto, held_to: {outputs: {yy: {min_sqnr_db: 3}}}}\n",
        "quantize.held_to.outputs: 'yy' is not an output of model (did you mean 'y'?); outputs: y",
        id="held-to-output-typo",
    ),
    pytest.param(
        "cpu",
        "uint8",
        "  - quantize\n  - quantize: {calibration: {samples: 4}}\n",
        "model: two quantize steps; keep one (once per component)",
        id="two-quantize-steps",
    ),
]


@pytest.mark.parametrize(("device", "precision", "steps", "message"), PLAN_CONTRADICTIONS)
def test_contradiction_is_a_plan_error(isolated, device, precision, steps, message) -> None:
    recipe = isolated.recipe("mlp", "steps:\n" + steps)
    got = assert_plan_error_wrote_nothing(
        isolated, recipe, "--device", device, "--precision", precision
    )
    assert got.startswith(f"{recipe}:"), got  # FILE:LINE of the offending step
    assert got.split(": ", 1)[1] == message


def test_mode_auto_held_out_data_is_checked_when_planning(isolated) -> None:
    """A held-out glob that matches nothing stops the build when planning, before any
    calibration runs, naming the option and the glob."""
    recipe = isolated.recipe(
        "mlp", "steps:\n  - quantize: {mode: auto, held_out: {npz: 'h*.npz'}}\n"
    )
    got = assert_plan_error_wrote_nothing(
        isolated, recipe, "--device", "cpu", "--precision", "int8"
    )
    assert got.startswith(f"{recipe}:") and "quantize.held_out: no file matches 'h*.npz'" in got


def test_quantize_on_quantized_source_needs_dequantize(isolated) -> None:
    from onnxruntime.quantization import quantize_dynamic

    p = isolated
    quantize_dynamic(str(p.catalog / "mlp.onnx"), str(p.catalog / "mlp_q.onnx"))
    (p.catalog / "mlp.yaml").write_text(MLP_CATALOG.format(ref="./mlp_q.onnx"))
    recipe = p.recipe("mlp", "steps: [quantize, verify]\n")
    message = assert_plan_error_wrote_nothing(p, recipe, "--device", "cpu", "--precision", "int8")
    assert message.startswith(f"{recipe}:10: model: quantize on an already-quantized model (")
    assert "MatMulInteger" in message
    assert message.endswith("; add a dequantize step before it")


# --------------------------------------------------------------------------- 2. static / dynamic


@pytest.fixture(scope="module")
def mlp_builds(mproj: Project) -> dict[tuple[str, str], object]:
    recipe = mproj.recipe(
        "mlp",
        """\
        steps:
        {% if device == "npu" %}
          - fix_shapes  # QNN HTP runs static shapes only
        {% endif %}
          - quantize: {calibration: {samples: 5}}
          - verify: {min_sqnr_db: 15, min_cosine: 0.98}
        """,
        name="mlp-static",
    )
    targets = [("npu", "uint8"), ("cpu", "int8"), ("npu", "w8a16"), ("cpu", "uint8")]
    return {t: mproj.build(recipe, *t) for t in targets}


def _check_static_metrics(
    result, model: onnx.ModelProto, samples: int, source: str = "synthetic (catalog I/O contract)"
) -> None:
    m = qmetrics(result)
    prod = producers(model)
    fed = Counter(
        n.op_type
        for n in model.graph.node
        if n.op_type not in QDQ
        and n.input
        and prod.get(n.input[0], None) is not None
        and prod[n.input[0]].op_type == "DequantizeLinear"
    )
    assert m["nodes_quantized_by_op"] == dict(fed)
    assert m["nodes_quantized"] == sum(fed.values()) > 0
    compute = [n for n in model.graph.node if n.op_type in ("MatMul", "Conv")]
    for n in compute:  # activation and weight both dequantized
        assert [prod[i].op_type for i in n.input[:2]] == ["DequantizeLinear"] * 2, n.name
    assert m["matmul_conv_total"] == len(compute) == m["matmul_conv_quantized"]
    assert m["matmul_conv_quantized_fraction"] == 1.0
    assert m["quantize_linear_inserted"] == ops(model)["QuantizeLinear"] > 0
    assert m["dequantize_linear_inserted"] == ops(model)["DequantizeLinear"]
    assert m["calibration_method"] == "minmax"
    assert m["calibration_source"] == source
    assert m["calibration_samples"] == samples
    for key in ("calibration_time_seconds", "qdq_insertion_time_seconds"):
        assert isinstance(m[key], float) and 0.0 <= m[key] < 60.0, key
    assert steps_of(result)["verify"]["status"] == "ran"


@pytest.mark.parametrize(
    ("target", "act", "weight", "rules"),
    [
        (("npu", "uint8"), np.uint8, np.uint8, "qnn"),
        (("cpu", "int8"), np.int8, np.int8, None),
        (("npu", "w8a16"), np.uint16, np.uint8, "qnn"),
        (("cpu", "uint8"), np.uint8, np.uint8, None),
    ],
    ids=lambda v: "-".join(v) if isinstance(v, tuple) else None,
)
def test_static_mlp(mlp_builds, target, act, weight, rules) -> None:
    result = mlp_builds[target]
    model = load(result)
    _check_static_metrics(result, model, samples=5)
    m = qmetrics(result)
    assert (m["activation_type"], m["weight_type"]) == (np.dtype(act).name, np.dtype(weight).name)
    assert (m["mode"], m["format"], m["ep_rules"]) == ("static", "qdq", rules)
    activations = [n for n in model.graph.node if n.op_type == "QuantizeLinear"]
    assert activations and all(zp_type(model, n) == act for n in activations)
    weights = [
        n
        for n in model.graph.node
        if n.op_type == "DequantizeLinear" and n.input[0] in ("w1_quantized", "w2_quantized")
    ]
    assert len(weights) == 2 and all(zp_type(model, n) == weight for n in weights)
    assert inits_of(model)["w1_quantized"].dtype == weight
    assert m["nodes_quantized_by_op"]["MatMul"] == 2
    # 16-bit QuantizeLinear needs opset 21
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    assert m["opset"] == opset == (21 if act == np.uint16 else 17)


def test_static_conv(mproj: Project) -> None:
    recipe = mproj.recipe("conv", "steps: [quantize, {verify: {min_sqnr_db: 15}}]\n", name="cv")
    result = mproj.build(recipe, "cpu", "uint8")
    model = load(result)
    # its input has an `image:` block: without data it calibrates on the bundled photographs
    _check_static_metrics(result, model, samples=16, source="bundled photos (calibration set)")
    assert qmetrics(result)["matmul_conv_total"] == 2
    # mean = std = 0.5 maps pixels [0, 1] to [-1, 1]: at most 2/255 per step, and photos
    # whose darkest and brightest pixels come near 0 and 255 fill most of it
    assert 1.6 / 255 < scale_of(model, "x") <= 2.0 / 255 * 1.0001
    assert inits_of(model)["w1_quantized"].shape == (4, 3, 3, 3)
    assert inits_of(model)["w1_scale"].shape == (4,)  # cpu preset: per channel


def test_dynamic_mode(mproj: Project) -> None:
    recipe = mproj.recipe(
        # reduce_range: 7-bit weights, so u8 x s8 products cannot saturate on CPUs whose
        # MatMulInteger kernel adds pairs in int16 (VPMADDUBSW without VNNI): the model is
        # then the same on every machine.
        "mlp",
        "steps: [{quantize: {mode: dynamic, reduce_range: true}}, {verify: {min_sqnr_db: 25}}]\n",
        name="dyn",
    )
    result = mproj.build(recipe, "cpu", "int8")
    model = load(result)
    counts = ops(model)
    assert counts["MatMulInteger"] == 2 and counts["DynamicQuantizeLinear"] == 2
    assert counts["MatMul"] == 0 and counts["QuantizeLinear"] == 0
    m = qmetrics(result)
    assert (m["mode"], m["activation_type"], m["weight_type"]) == ("dynamic", "uint8", "int8")
    assert m["nodes_quantized_by_op"] == {"MatMul": 2}
    assert m["matmul_conv_quantized_fraction"] == 1.0
    assert "calibration_method" not in m and "calibration_samples" not in m
    assert inits_of(model)["w1_quantized"].dtype == np.int8


def test_qoperator_format(mproj: Project) -> None:
    recipe = mproj.recipe(
        "mlp", "steps: [{quantize: {format: qoperator}}, {verify: {min_sqnr_db: 15}}]\n", name="qo"
    )
    result = mproj.build(recipe, "cpu", "int8")
    model = load(result)
    counts = ops(model)
    assert counts["QLinearMatMul"] == 2 and counts["MatMul"] == 0
    assert counts["QuantizeLinear"] == 1 and counts["DequantizeLinear"] == 1  # at the edges
    m = qmetrics(result)
    assert (m["format"], m["ep_rules"], m["nodes_quantized_by_op"]["MatMul"]) == (
        "qoperator",
        None,
        2,
    )
    assert inits_of(model)["x_zero_point"].dtype == np.int8


# --------------------------------------------------------------------------- 3. calibration


@pytest.fixture(scope="module")
def heavy_scales(mproj: Project) -> dict[str, float]:
    out = {}
    for method, extra in [
        ("minmax", ""),
        ("entropy", ""),
        ("percentile", ", percentile: 99.0"),
    ]:
        recipe = mproj.recipe(
            "heavy",
            f"steps:\n  - quantize: {{calibration: {{method: {method}{extra}}}}}\n",
            name=f"heavy-{method}",
        )
        result = mproj.build(recipe, "cpu", "uint8")
        assert qmetrics(result)["calibration_method"] == method
        out[method] = scale_of(load(result), "t")
    return out


def _heavy_activation(p: Project) -> np.ndarray:
    """`t` = tan(x) over the 16 synthetic calibration samples (seed 0) of the heavy model."""
    from winml_recipes.catalog import load_entry
    from winml_recipes.feeds import synthetic

    contract = load_entry("heavy", p.catalog).components["model"].contract
    xs = [f["x"] for f in synthetic(contract, 16, 0)()]
    assert len(xs) == 16 and xs[0].shape == (16, 64)
    return np.tan(np.concatenate(xs)).astype(np.float64)


def test_minmax_scale_is_the_full_range(mproj, heavy_scales) -> None:
    t = _heavy_activation(mproj)
    assert heavy_scales["minmax"] == pytest.approx((t.max() - t.min()) / 255, rel=1e-3)


def test_entropy_clips_the_heavy_tail(heavy_scales) -> None:
    assert heavy_scales["entropy"] < 0.7 * heavy_scales["minmax"]


def test_entropy_with_16_bit_activations(mproj: Project, heavy_scales) -> None:
    """w8a16 (the npu default) with entropy raised at run time: 32,768 target bins > the
    histogram's 2,048. It now clips the tail less than at 8 bits, but still clips it."""
    recipe = mproj.recipe(
        "heavy",
        "steps:\n  - quantize: {activation_type: uint16, calibration: {method: entropy}}\n",
        name="heavy-entropy16",
    )
    result = mproj.build(recipe, "cpu", "uint8")
    assert qmetrics(result)["calibration_method"] == "entropy"
    t = _heavy_activation(mproj)
    kept = scale_of(load(result), "t") * 65535
    assert heavy_scales["entropy"] * 255 < kept < t.max() - t.min()


def test_percentile_follows_the_data(mproj, heavy_scales) -> None:
    t = _heavy_activation(mproj)
    expected = (np.percentile(t, 99.5) - np.percentile(t, 0.5)) / 255
    assert heavy_scales["percentile"] == pytest.approx(expected, rel=0.02)
    assert heavy_scales["percentile"] < 0.5 * heavy_scales["minmax"]
    assert heavy_scales["percentile"] != pytest.approx(heavy_scales["entropy"], rel=0.05)


def test_no_cache_builds_are_byte_identical(proj: Project) -> None:
    recipe = proj.recipe(
        "conv",
        "steps: [{quantize: {calibration: {method: entropy, samples: 6, seed: 3}}}]\n",
    )
    digests = []
    for out in ("a", "b"):
        result = cli(
            "build", recipe, "--device", "npu", "--precision", "uint8", "--no-cache",
            "-o", proj.root / out,
        )  # fmt: skip
        assert result.exit_code == 0, result.stderr
        digests.append((proj.root / out / "r" / "npu-uint8" / "model" / "model.onnx").read_bytes())
    assert digests[0] == digests[1]
    assert b"QuantizeLinear" in digests[0]


# --------------------------------------------------------------------------- 4. sources


def test_npz_calibration(proj: Project) -> None:
    rng = np.random.default_rng(11)
    data = proj.recipes / "data"
    data.mkdir()
    singles = [rng.uniform(-10, 10, (2, 4)).astype(np.float32) for _ in range(3)]
    for i, x in enumerate(singles):
        np.savez(data / f"a{i}.npz", x=x)
    stacked = rng.uniform(-10, 10, (4, 2, 4)).astype(np.float32)
    np.savez(data / "b.npz", x=stacked)
    recipe = proj.recipe(
        "mlp", "steps: [{quantize: {calibration: {npz: 'data/*.npz', samples: 100}}}]\n", name="all"
    )
    all_samples = proj.build(recipe, "cpu", "uint8")
    m = qmetrics(all_samples)
    assert m["calibration_samples"] == 7
    assert m["calibration_source"] == "npz: data/*.npz"
    everything = np.concatenate([*singles, *stacked])
    expected = (everything.max() - everything.min()) / 255
    assert scale_of(load(all_samples), "x") == pytest.approx(expected, rel=1e-5)

    # a sample cap reads files in order: the 3 singles and the first stacked sample
    capped = proj.recipe(
        "mlp", "steps:\n  - quantize: {calibration: {npz: 'data/*.npz', samples: 4}}\n", name="c"
    )
    result = proj.build(capped, "cpu", "uint8")
    assert qmetrics(result)["calibration_samples"] == 4
    first4 = np.concatenate([*singles, stacked[0]])
    assert scale_of(load(result), "x") == pytest.approx(
        (first4.max() - first4.min()) / 255, rel=1e-5
    )

    synthetic = proj.recipe("mlp", "steps: [quantize]\n", name="syn")
    ratio = scale_of(load(all_samples), "x") / scale_of(
        load(proj.build(synthetic, "cpu", "uint8")), "x"
    )
    assert 8 < ratio < 12  # data x10 -> scale ~x10


def _write_pngs(folder: Path, count: int = 4) -> list[np.ndarray]:
    from PIL import Image

    folder.mkdir(parents=True)
    rng = np.random.default_rng(5)
    images = []
    for i in range(count):
        pixels = rng.integers(100, 151, size=(8, 8, 3)).astype(np.uint8)
        Image.fromarray(pixels, "RGB").save(folder / f"img{i}.png")
        images.append(pixels)
    return images


def test_preprocess_image_from_catalog_block(proj: Project) -> None:
    from PIL import Image

    from winml_recipes.catalog import load_entry
    from winml_recipes.feeds import preprocess_image

    spec = load_entry("conv", proj.catalog).components["model"].contract.input("x")
    pixels = np.zeros((8, 8, 3), np.uint8)
    pixels[3, 6] = (255, 51, 0)
    Image.fromarray(pixels, "RGB").save(proj.root / "one.png")
    x = preprocess_image(proj.root / "one.png", spec)
    assert x.shape == (1, 3, 8, 8) and x.dtype == np.float32
    assert x[0, :, 3, 6].tolist() == pytest.approx([1.0, (51 / 255 - 0.5) / 0.5, -1.0])
    assert x[0, :, 0, 0].tolist() == pytest.approx([-1.0, -1.0, -1.0])


def test_images_calibration(proj: Project) -> None:
    images = _write_pngs(proj.recipes / "imgs")
    recipe = proj.recipe("conv", "steps: [{quantize: {calibration: {images: imgs}}}]\n")
    result = proj.build(recipe, "cpu", "uint8")
    m = qmetrics(result)
    assert m["calibration_source"] == "images: imgs"
    assert m["calibration_samples"] == 4
    values = (np.stack(images) / 255.0 - 0.5) / 0.5
    lo, hi = min(values.min(), 0.0), max(values.max(), 0.0)
    assert scale_of(load(result), "x") == pytest.approx((hi - lo) / 255, rel=1e-4)


def test_inputs_from_calibrates_on_upstream_outputs(proj: Project) -> None:
    body = """\
    components:
      enc:
        steps: [verify]
      dec:
        steps:
          - quantize: {calibration: {inputs_from: enc, samples: 8}}
          - verify: {inputs_from: enc, min_sqnr_db: 15}
    """
    recipe = proj.recipe("chain", body)
    result = proj.build(recipe, "cpu", "uint8")
    m = qmetrics(result, "dec")
    assert m["calibration_source"] == "inputs_from: enc"
    assert m["calibration_samples"] == 8
    scale = scale_of(load(result, "dec"), "h")
    # enc multiplies its [-1, 1] input by 20: about 40 / 255, not the contract's 2 / 255
    assert 30 / 255 < scale < 41 / 255
    # the same without inputs_from: calibrated on the contract's synthetic [-1, 1]
    synthetic = proj.recipe(
        "chain",
        """\
        components:
          enc:
            steps: [verify]
          dec:
            steps: [{quantize: {calibration: {samples: 8}}}]
        """,
        name="syn",
    )
    plain = scale_of(load(proj.build(synthetic, "cpu", "uint8"), "dec"), "h")
    assert plain == pytest.approx(2 / 255, rel=0.05)
    assert scale > 10 * plain


def test_inputs_from_unknown_component(isolated) -> None:
    recipe = isolated.recipe(
        "chain",
        """\
        components:
          dec:
            steps: [{quantize: {calibration: {inputs_from: enx}}}]
        """,
    )
    message = assert_plan_error_wrote_nothing(
        isolated, recipe, "--device", "cpu", "--precision", "uint8"
    )
    assert "'enx'" in message and "(did you mean 'enc'?)" in message, message
    assert "components: enc, dec" in message


def test_inputs_from_cycle(isolated) -> None:
    recipe = isolated.recipe(
        "chain",
        """\
        components:
          enc:
            steps: [{quantize: {calibration: {inputs_from: dec}}}]
          dec:
            steps: [{quantize: {calibration: {inputs_from: enc}}}]
        """,
    )
    message = assert_plan_error_wrote_nothing(
        isolated, recipe, "--device", "cpu", "--precision", "uint8"
    )
    assert message in (
        f"{recipe}: inputs_from cycle: enc -> dec -> enc",
        f"{recipe}: inputs_from cycle: dec -> enc -> dec",
    ), message


# --------------------------------------------------------------------------- 5. bad input


def _npz_recipe(p: Project, **arrays) -> Path:
    np.savez(p.recipes / "cal.npz", **arrays)
    return p.recipe("mlp", "steps: [{quantize: {calibration: {npz: cal.npz}}}]\n")


@pytest.mark.parametrize(
    ("arrays", "tail"),
    [
        (
            {"z": np.zeros((2, 4), np.float32)},
            "calibration.npz: cal.npz has no input 'x' (expected float32[2, 4]; it has: z)",
        ),
        (
            {"x": np.zeros((2, 5), np.float32)},
            "calibration.npz: cal.npz: input 'x' has shape [2, 5], expected float32[2, 4] "
            "(optionally with a leading sample axis of at most 4096)",
        ),
        (
            {"x": np.zeros((2, 4), np.int32)},
            "calibration.npz: cal.npz: input 'x' is int32, expected float32[2, 4]",
        ),
    ],
    ids=["missing-input", "wrong-shape", "wrong-dtype"],
)
def test_bad_npz_is_a_plan_error(isolated, arrays, tail) -> None:
    recipe = _npz_recipe(isolated, **arrays)
    message = assert_plan_error_wrote_nothing(
        isolated, recipe, "--device", "cpu", "--precision", "uint8"
    )
    assert message == f"{recipe}:10: {tail}"


def test_npz_glob_matching_nothing(isolated) -> None:
    recipe = isolated.recipe("mlp", "steps: [{quantize: {calibration: {npz: 'nope/*.npz'}}}]\n")
    message = assert_plan_error_wrote_nothing(
        isolated, recipe, "--device", "cpu", "--precision", "uint8"
    )
    assert message == (
        f"{recipe}:10: calibration.npz: no file matches 'nope/*.npz' (relative to "
        f"{isolated.recipes})"
    )


def test_mixed_precision_glob_matching_nothing(isolated) -> None:
    recipe = isolated.recipe(
        "mlp", "steps: [{quantize: {mixed_precision: [{tensors: ['nope*'], type: uint16}]}}]\n"
    )
    message = assert_run_error_wrote_nothing(isolated, recipe, "cpu", "uint8")
    assert message == (
        f"{recipe}:10: model/quantize [cpu/uint8]: mixed_precision: tensor glob 'nope*' "
        "matches no activation"
    )
    recipe = isolated.recipe(
        "mlp", "steps: [{quantize: {mixed_precision: [{nodes: ['mm9'], type: float}]}}]\n"
    )
    message = assert_run_error_wrote_nothing(isolated, recipe, "cpu", "uint8")
    assert message == (
        f"{recipe}:10: model/quantize [cpu/uint8]: mixed_precision: node glob 'mm9' matches "
        "no node name or weight name"
    )


def test_exclude_glob_matching_nothing(isolated) -> None:
    recipe = isolated.recipe("mlp", "steps: [{quantize: {exclude: ['conv*']}}]\n")
    message = assert_run_error_wrote_nothing(isolated, recipe, "cpu", "uint8")
    assert message == (
        f"{recipe}:10: model/quantize [cpu/uint8]: quantize.exclude: node glob 'conv*' "
        "matches no node name or weight name"
    )


def test_exclude_keeps_nodes_float(proj: Project) -> None:
    recipe = proj.recipe("mlp", "steps: [{quantize: {exclude: ['mm2']}}]\n")
    result = proj.build(recipe, "cpu", "uint8")
    model = load(result)
    mm2 = next(n for n in model.graph.node if n.name == "mm2")
    assert mm2.input[1] == "w2"  # weight left in float
    m = qmetrics(result)
    assert m["float_nodes"] == ["mm2"]
    assert m["matmul_conv_quantized"] == 1  # an excluded MatMul is not reported as quantized


def test_nothing_quantizable_is_skipped(proj: Project) -> None:
    recipe = proj.recipe("flat", "steps: [quantize, {verify: {min_sqnr_db: 100}}]\n")
    result = proj.build(recipe, "cpu", "uint8")
    step = steps_of(result)["quantize"]
    assert step["status"] == "skipped"
    assert step["reason"].startswith("nothing to quantize")
    assert ops(load(result))["QuantizeLinear"] == 0
    # the model is its own reference and runs on the CPU EP: nothing to compare
    assert steps_of(result)["verify"]["status"] == "skipped"


# --------------------------------------------------------------------------- 6. mixed precision


@pytest.fixture(scope="module")
def mixed_builds(mproj: Project) -> dict[str, object]:
    out = {}
    for name, steps in [
        ("plain", "[quantize]"),
        ("tensors", "[{quantize: {mixed_precision: [{tensors: ['h'], type: uint16}]}}]"),
        ("nodes", "[{quantize: {mixed_precision: [{nodes: ['mm2'], type: float}]}}]"),
    ]:
        for device in ("cpu", "npu"):
            recipe = mproj.recipe("mlp", f"steps: {steps}\n", name=f"mixed-{name}")
            out[f"{name}-{device}"] = mproj.build(recipe, device, "uint8")
    return out


@pytest.mark.parametrize("device", ["cpu", "npu"])
def test_tensor_region_is_16_bit(mixed_builds, device) -> None:
    plain, mixed = mixed_builds[f"plain-{device}"], mixed_builds[f"tensors-{device}"]
    model = load(mixed)
    assert zp_type(model, q_of(model, "h")) == np.uint16
    for tensor in ("x", "r"):  # the rest keeps the precision's 8 bits
        assert zp_type(model, q_of(model, tensor)) == np.uint8, tensor
    assert zp_type(model, producers(model)["y"]) == np.uint8
    # ORT's fixer converts at the borders of the 16-bit region
    assert ops(model)["QuantizeLinear"] > ops(load(plain))["QuantizeLinear"]
    assert any(n.name.endswith("_convert_QuantizeLinear") for n in model.graph.node)
    m = qmetrics(mixed)
    assert (m["tensor_overrides"], m["float_nodes"]) == (["h"], [])


@pytest.mark.parametrize("device", ["cpu", "npu"])
def test_node_region_stays_float(mixed_builds, device) -> None:
    result = mixed_builds[f"nodes-{device}"]
    model = load(result)
    prod = producers(model)
    mm2 = next(n for n in model.graph.node if n.name == "mm2")
    fed_by = [prod[i].op_type if i in prod else "graph" for i in mm2.input]
    assert "DequantizeLinear" not in fed_by, fed_by
    mm1 = next(n for n in model.graph.node if n.name == "mm1")
    assert prod[mm1.input[0]].op_type == "DequantizeLinear"  # the rest is quantized
    m = qmetrics(result)
    assert (m["tensor_overrides"], m["float_nodes"]) == ([], ["mm2"])
    assert m["matmul_conv_quantized"] == 1 and m["matmul_conv_quantized_fraction"] == 0.5


# --------------------------------------------------------------------------- 7. sam3-tiny


@pytest.fixture(scope="module")
def sam3(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    out = tmp_path_factory.mktemp("sam3-quant")
    return {
        f"{d}/{p}": api.build(RECIPES / "sam3-tiny.yaml", device=d, precision=p, output_root=out)
        for d, p in [("cpu", "uint8"), ("npu", "w8a16"), ("npu", "uint8"), ("cpu", "int8")]
    }


def verify_sqnr(result, component: str) -> dict[str, float]:
    outputs = steps_of(result, component)["verify"]["metrics"]["outputs"]
    return {name: m["sqnr_db"] for name, m in outputs.items()}


DECODER = "prompt_encoder_mask_decoder"


def test_sam3_auto_mixed_precision(sam3) -> None:
    auto = qmetrics(sam3["cpu/uint8"], DECODER)["mixed_precision_auto"]
    assert auto["met"] is True
    assert auto["target_sqnr_db"] == 24 and auto["type"] == "uint16"
    assert auto["scored_on"] == "cpu" and auto["ranked_on"] == "cpu-simulation"
    promoted = auto["promoted"]
    assert 0 < len(promoted) <= auto["max_promoted"]
    for entry in promoted:
        assert set(entry) == {
            "tensor", "kind", "to", "round", "output_sqnr_db_if_only_this_is_quantized"
        }  # fmt: skip
        assert entry["to"] == "uint16" and isinstance(entry["tensor"], str)
        assert entry["kind"] == "activation-16bit"
        added = next(r for r in auto["rounds"] if r["round"] == entry["round"])["added"]
        assert entry["tensor"] in added
    damages = [e["output_sqnr_db_if_only_this_is_quantized"] for e in promoted]
    assert damages == sorted(damages)  # most damaging first
    rounds = auto["rounds"]
    assert rounds[0]["promoted"] == 0 and rounds[-1]["promoted"] == len(promoted)
    first, last = rounds[0]["output_sqnr_db"], rounds[-1]["output_sqnr_db"]
    # scored on grid prompts over held-out photographs, where the 8-bit masks start near
    # 23.6 dB (on uniform-noise prompts they started below 22 and gained 3 dB or more)
    assert first["pred_masks"] < 24
    assert last["pred_masks"] >= 24 and min(last.values()) >= 24
    assert last["pred_masks"] - first["pred_masks"] >= 0.5
    # the promoted tensors are 16 bit in the written model
    model = load(sam3["cpu/uint8"], DECODER)
    inits = inits_of(model)
    wide = {
        n.input[0].removesuffix("_QuantizeLinear_Input")
        for n in model.graph.node
        if n.op_type == "QuantizeLinear" and inits[n.input[2]].dtype == np.uint16
    }
    assert {e["tensor"] for e in promoted} <= wide
    assert verify_sqnr(sam3["cpu/uint8"], DECODER)["pred_masks"] >= 20


def test_sam3_w8a16_quality_contract(sam3) -> None:
    result = sam3["npu/w8a16"]
    vision = verify_sqnr(result, "vision_encoder")
    assert set(vision) == {"image_embeddings.0", "image_embeddings.1", "image_embeddings.2"}
    assert all(v >= 30 for v in vision.values()), vision
    decoder = verify_sqnr(result, DECODER)
    assert decoder["iou_scores"] >= 30 and decoder["pred_masks"] >= 20, decoder
    for comp in ("vision_encoder", DECODER):
        # measured on QNN HTP, every node on the NPU
        verify = steps_of(result, comp)["verify"]["metrics"]
        assert verify["verified_on"] == "qnn-htp" and verify["cpu_fallback_allowed"] is False
        m = qmetrics(result, comp)
        assert m["matmul_conv_quantized_fraction"] >= 0.9, comp
        assert (m["activation_type"], m["weight_type"], m["ep_rules"]) == ("uint16", "uint8", "qnn")
    assert qmetrics(result, DECODER)["calibration_source"] == (
        "inputs_from: vision_encoder; 4x4 grid prompts: fg point, bg point or padding, box"
    )
    assert qmetrics(result, DECODER)["calibration_samples"] == 64


def test_sam3_npu_uint8_holds_on_htp(sam3) -> None:
    """8-bit activations on the NPU: the HTP rewrites keep the coordinate path in range."""
    result = sam3["npu/uint8"]
    for comp in ("vision_encoder", DECODER):
        verify = steps_of(result, comp)["verify"]["metrics"]
        assert verify["verified_on"] == "qnn-htp"
        assert set(verify["placement"]["nodes"]) == {"QNNExecutionProvider"}
    assert verify_sqnr(result, DECODER)["pred_masks"] >= 15
    rewrites = prepare_rewrites(steps_of(result, DECODER))  # its prepare: {stages: [ep]}
    # the four in-place coordinate normalizations and the point-embedding updates; then
    # `x[..., 2] = constant` as x * keep + table (its Mul merged into the chain before)
    assert rewrites["channel_scatter_to_elementwise"] == 8
    assert rewrites["constant_scatter_to_arithmetic"] == 1
    assert rewrites["merge_constant_chain"] == 3
    model = load(result, DECODER)
    assert ops(model).get("ScatterElements", 0) == 0


def test_sam3_cpu_int8_builds_both_components(sam3) -> None:
    result = sam3["cpu/int8"]
    for comp in ("vision_encoder", DECODER):
        steps = steps_of(result, comp)
        assert steps["quantize"]["status"] in ("ran", "cached")
        assert steps["verify"]["status"] in ("ran", "cached")
        m = qmetrics(result, comp)
        assert (m["activation_type"], m["weight_type"], m["ep_rules"]) == ("int8", "int8", None)
        assert m["matmul_conv_quantized_fraction"] >= 0.9
        model = load(result, comp)
        q = next(n for n in model.graph.node if n.op_type == "QuantizeLinear")
        assert zp_type(model, q) == np.int8
        assert result.models[comp].is_file()


# --------------------------------------------------------------------------- 8. fp16


def test_fp16_keeps_float32_io(mproj: Project) -> None:
    recipe = mproj.recipe("mlp", "steps: [fp16, {verify: {min_sqnr_db: 40}}]\n", name="half")
    result = mproj.build(recipe, "cpu", "fp16")
    model = load(result)
    assert [i.type.tensor_type.elem_type for i in model.graph.input] == [F]
    assert [o.type.tensor_type.elem_type for o in model.graph.output] == [F]
    assert {t.name: t.data_type for t in model.graph.initializer} == {
        "w1": TensorProto.FLOAT16,
        "b1": TensorProto.FLOAT16,
        "w2": TensorProto.FLOAT16,
    }
    assert verify_sqnr(result, "model")["y"] >= 40
    assert steps_of(result)["fp16"]["metrics"]["casts"] == ops(model)["Cast"] == 2


def test_fp16_op_block_list(mproj: Project) -> None:
    recipe = mproj.recipe(
        "mlp", "steps: [{fp16: {op_block_list: [MatMul]}}, verify]\n", name="half-block"
    )
    result = mproj.build(recipe, "cpu", "fp16")
    model = load(result)
    types = {t.name: t.data_type for t in model.graph.initializer}
    assert types["w1"] == types["w2"] == F  # MatMul weights kept in float32
    assert types["b1"] == TensorProto.FLOAT16  # the Add is converted
    prod = producers(model)
    for mm in (n for n in model.graph.node if n.op_type == "MatMul"):
        src = prod.get(mm.input[0])
        assert src is not None and src.op_type == "Cast"
        assert helper.get_attribute_value(src.attribute[0]) == F
    assert steps_of(result)["fp16"]["metrics"]["op_block_list"] == ["MatMul"]


# --------------------------------------------------------------------------- 9. build --onnx


def _adhoc_build(tmp_path: Path, *args: str) -> dict:
    model = make_mlp_onnx(tmp_path / "mlp.onnx")
    result = cli("build", "--onnx", model, "-o", tmp_path / "out", "--json", *args)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_build_onnx_npu_uint8_with_shape(tmp_path: Path) -> None:
    manifest = _adhoc_build(tmp_path, "--device", "npu", "--precision", "uint8", "--shape", "x=4x4")
    assert manifest["target"] == {"device": "npu", "precision": "uint8"}
    steps = {s["pass"]: s for s in manifest["components"]["model"]["steps"]}
    assert steps["fix_shapes"]["metrics"] == {"fixed": {"batch": 4}}
    assert steps["quantize"]["status"] == "ran"
    assert steps["quantize"]["metrics"]["activation_type"] == "uint8"
    assert steps["verify"]["status"] == "ran"
    assert steps["verify"]["metrics"]["outputs"]["y"]["sqnr_db"] >= 10
    model = onnx.load(str(tmp_path / "out" / "mlp" / "npu-uint8" / "model" / "model.onnx"))
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert shape == [4, 4]
    assert ops(model)["QuantizeLinear"] > 0


@pytest.mark.parametrize(
    ("device", "precision", "activation"), [("npu", "w8a16", "uint16"), ("cpu", "int8", "int8")]
)
def test_build_onnx_device_default_precision(tmp_path, device, precision, activation) -> None:
    manifest = _adhoc_build(tmp_path, "--device", device)
    assert manifest["target"] == {"device": device, "precision": precision}
    steps = {s["pass"]: s for s in manifest["components"]["model"]["steps"]}
    assert steps["quantize"]["metrics"]["activation_type"] == activation
    assert steps["verify"]["status"] == "ran"
    assert (tmp_path / "out" / "mlp" / f"{device}-{precision}" / "manifest.json").is_file()


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ("y=4x4", "--shape y: the model has no input 'y'; inputs: x"),
        ("x=4", "--shape x: 1 dims given, the input has 2 (['batch', 4])"),
        ("x=4by4", "--shape 'x=4by4': expected NAME=DxDx... (e.g. pixel_values=1x3x224x224)"),
        ("x", "--shape 'x': expected NAME=DxDx... (e.g. pixel_values=1x3x224x224)"),
        ("x=4x5", "--shape x: dim of size 4 cannot be 5"),
        ("x=0x4", "--shape 'x=0x4': dims must be at least 1"),
    ],
)
def test_build_onnx_bad_shape(tmp_path: Path, shape: str, message: str) -> None:
    model = make_mlp_onnx(tmp_path / "mlp.onnx")
    args = ("build", "--onnx", model, "--device", "npu", "--shape", shape, "-o", tmp_path / "o")
    assert user_error(*args) == message
    assert not (tmp_path / "o").exists()


def test_build_onnx_conflicting_named_dim(tmp_path: Path) -> None:
    two = _model(
        [helper.make_node("Add", ["a", "b"], ["y"])],
        [
            helper.make_tensor_value_info("a", F, ["batch", 4]),
            helper.make_tensor_value_info("b", F, ["batch", 4]),
        ],
        [helper.make_tensor_value_info("y", F, ["batch", 4])],
    )
    path = _save(two, tmp_path / "two.onnx")
    base = ("build", "--onnx", path, "--device", "cpu", "--precision", "fp32", "-o", tmp_path / "o")
    assert user_error(*base, "--shape", "a=2x4", "--shape", "b=3x4") == (
        "--shape b: dim 'batch' is 3 here but 2 in --shape a; give it one value"
    )
    assert user_error(*base, "--shape", "a=2x4", "--shape", "a=3x4") == (
        "--shape a: given twice; keep one"
    )
    assert not (tmp_path / "o").exists()
    ok = cli(*base, "--shape", "a=2x4", "--shape", "b=2x4")
    assert ok.exit_code == 0, ok.stderr


def test_build_onnx_missing_file_and_device(tmp_path: Path) -> None:
    missing = tmp_path / "nope.onnx"
    assert user_error("build", "--onnx", missing, "--device", "cpu") == (
        f"{missing}: file not found; check the path"
    )
    model = make_mlp_onnx(tmp_path / "mlp.onnx")
    assert user_error("build", "--onnx", model, "-o", tmp_path / "o") == (
        "--onnx needs --device (cpu, gpu, npu)"
    )
    assert user_error("build", "--onnx", model, "--device", "tpu") == (
        "unknown device 'tpu' (did you mean 'npu'?); known: cpu, gpu, npu"
    )
    assert not (tmp_path / "o").exists()


def test_build_onnx_stops_on_dims_it_would_guess(tmp_path: Path) -> None:
    """A dynamic N, H, W image input: N (batch-like) defaults to 1, H and W are unknown and
    the build stops before anything runs; it used to build a 1x1-pixel model and report SQNR."""
    conv = _model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", F, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info("y", F, ["N", 3, "H", "W"])],
    )
    path = _save(conv, tmp_path / "img.onnx")
    base = ("build", "--onnx", path, "--device", "cpu", "--precision", "fp32", "-o", tmp_path / "o")
    assert user_error(*base) == (
        f"{path}: dims with no value (x: H, W); give each input's shape, e.g. --shape "
        "x=Nx3xNxN with N replaced by the sizes the model runs at"
    )
    assert not (tmp_path / "o").exists()
    ok = cli(*base, "--shape", "x=1x3x32x32")
    assert ok.exit_code == 0, ok.stderr


def test_build_onnx_of_a_qdq_model_says_what_it_built(tmp_path: Path) -> None:
    """An int8/int8 QDQ file built for npu (w8a16) used to land in npu-w8a16/ unchanged,
    labelled with a precision it does not have. It is refused, naming the precision it
    has; built for that precision, the summary says why quantize did nothing."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    float_path = make_mlp_onnx(tmp_path / "mlp.onnx")

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            rng = np.random.default_rng(0)
            self.data = iter([{"x": rng.uniform(-1, 1, (2, 4)).astype(np.float32)}] * 4)

        def get_next(self):
            return next(self.data, None)

    qdq = tmp_path / "tp_qdq.onnx"
    quantize_static(
        str(float_path), str(qdq), Reader(), quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
    )  # fmt: skip
    base = ("build", "--onnx", qdq, "--shape", "x=2x4", "-o", tmp_path / "o")
    message = user_error(*base, "--device", "npu")
    assert "the output would stay as quantized as the source (QDQ" in message
    assert "npu/w8a16 asks for uint16 activations and uint8 weights" in message
    assert message.endswith("or build the precision it has (--precision int8)")
    assert not (tmp_path / "o").exists()
    done = cli(*base, "--device", "cpu", "--precision", "int8")
    assert done.exit_code == 0, done.stderr
    assert "quantize skipped: source already quantized (QDQ" in done.stdout


def _w8a16_qdq_mlp(path: Path, weight_type: int) -> Path:
    """x -> MatMul(W) -> Add(b) as an npu/w8a16 build writes it: uint16 activations, W at
    `weight_type`, and the Add's constant quantized like an activation (uint16)."""
    rng = np.random.default_rng(0)
    w_np = {TensorProto.UINT8: np.uint8, TensorProto.UINT16: np.uint16}[weight_type]
    inits = [
        numpy_helper.from_array(rng.integers(0, 200, (4, 3)).astype(w_np), "w_q"),
        numpy_helper.from_array(np.array(0.01, np.float32), "w_s"),
        numpy_helper.from_array(np.array(100, w_np), "w_z"),
        numpy_helper.from_array(rng.integers(0, 60000, (3,)).astype(np.uint16), "b_q"),
        numpy_helper.from_array(np.array(1e-4, np.float32), "b_s"),
        numpy_helper.from_array(np.array(30000, np.uint16), "b_z"),
        numpy_helper.from_array(np.array(1e-4, np.float32), "a_s"),
        numpy_helper.from_array(np.array(32768, np.uint16), "a_z"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "a_s", "a_z"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "a_s", "a_z"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["w"]),
        helper.make_node("MatMul", ["xd", "w"], ["m"]),
        helper.make_node("QuantizeLinear", ["m", "a_s", "a_z"], ["mq"]),
        helper.make_node("DequantizeLinear", ["mq", "a_s", "a_z"], ["md"]),
        helper.make_node("DequantizeLinear", ["b_q", "b_s", "b_z"], ["b"]),
        helper.make_node("Add", ["md", "b"], ["a"]),
        helper.make_node("QuantizeLinear", ["a", "a_s", "a_z"], ["aq"]),
        helper.make_node("DequantizeLinear", ["aq", "a_s", "a_z"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "qdq_mlp", [helper.make_tensor_value_info("x", F, [2, 4])],
        [helper.make_tensor_value_info("y", F, [2, 3])], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    onnx.save(model, path)
    return path


def test_a_w8a16_build_is_a_w8a16_source(tmp_path: Path) -> None:
    """This tool's own npu/w8a16 output (uint8 weights, elementwise constants at uint16 like
    activations) builds again for npu/w8a16 as it is (it was refused as 'would stay as
    quantized'); a graph whose MatMul weights are 16-bit is still refused for w8a16."""
    ours = _w8a16_qdq_mlp(tmp_path / "ours.onnx", TensorProto.UINT8)
    done = cli("build", "--onnx", ours, "--device", "npu", "--precision", "w8a16",
               "-o", tmp_path / "o")  # fmt: skip
    assert done.exit_code == 0, done.stderr
    assert "quantize skipped: source already quantized (QDQ" in done.stdout
    wide = _w8a16_qdq_mlp(tmp_path / "wide.onnx", TensorProto.UINT16)
    message = user_error("build", "--onnx", wide, "--device", "npu", "--precision", "w8a16",
                         "-o", tmp_path / "o2")  # fmt: skip
    assert "npu/w8a16 asks for uint16 activations and uint8 weights" in message


def test_converter_dim_names_are_renamed_and_settable(tmp_path: Path, monkeypatch) -> None:
    """Dims as converters write them: paddle2onnx's `p2o.DynamicDimension.0`, `?`, torch
    dynamo's `((4//s3)) - 1` and a -1 value. The catalog names them `<input>_dim<i>`;
    --shape sets them; `init` writes an entry that validates."""
    x = helper.make_tensor_value_info("x", F, ["p2o.DynamicDimension.0", 3, "?", "W"])
    y = helper.make_tensor_value_info("y", F, ["p2o.DynamicDimension.0", 3, "?", "((4//s3)) - 1"])
    x.type.tensor_type.shape.dim[3].Clear()
    x.type.tensor_type.shape.dim[3].dim_value = -1
    path = _save(_model([helper.make_node("Relu", ["x"], ["y"])], [x], [y]), tmp_path / "p.onnx")
    base = (
        "build",
        "--onnx",
        path,
        "--device",
        "npu",
        "--precision",
        "w8a16",
        "-o",
        tmp_path / "o",
    )
    assert user_error(*base) == (
        f"{path}: dims with no value (x: x_dim0, x_dim2, x_dim3); give each input's shape, "
        "e.g. --shape x=Nx3xNxN with N replaced by the sizes the model runs at"
    )
    done = cli(*base, "--shape", "x=1x3x48x192", "--json")
    assert done.exit_code == 0, done.stderr
    built = onnx.load(str(tmp_path / "o" / "p" / "npu-w8a16" / "model" / "model.onnx"))
    assert [d.dim_value for d in built.graph.input[0].type.tensor_type.shape.dim] == [1, 3, 48, 192]
    monkeypatch.chdir(tmp_path)
    assert cli("init", str(path), "--name", "conv").exit_code == 0
    assert cli("validate", tmp_path / "recipes" / "conv.yaml").exit_code == 0


def test_anonymous_dims_get_one_name_per_position(tmp_path: Path) -> None:
    """An OCR classifier's input `[?, 3, 48, ?]`: the two `?` are different dims (48 x 192
    is not square). They used to share one catalog name, so `--shape x=1x3x48x192` was
    refused ("dim 'x_dim0' is 192 here but 1"); a name a tensor repeats is no promise
    that the dims are equal unless it is an identifier (dynamo's `s3`)."""
    x = helper.make_tensor_value_info("x", F, ["?", 3, 48, "?"])
    y = helper.make_tensor_value_info("y", F, ["?", 3, 48, "?"])
    path = _save(_model([helper.make_node("Relu", ["x"], ["y"])], [x], [y]), tmp_path / "c.onnx")
    done = cli(
        "build", "--onnx", path, "--device", "npu", "--precision", "w8a16",
        "--shape", "x=1x3x48x192", "-o", tmp_path / "o", "--json",
    )  # fmt: skip
    assert done.exit_code == 0, done.stderr
    built = onnx.load(str(tmp_path / "o" / "c" / "npu-w8a16" / "model" / "model.onnx"))
    assert [d.dim_value for d in built.graph.input[0].type.tensor_type.shape.dim] == [1, 3, 48, 192]


@pytest.mark.parametrize(("device", "precision"), [("cpu", "int8"), ("npu", "w8a16")])
def test_opset_12_models_quantize(tmp_path: Path, device: str, precision: str) -> None:
    """Converted models are often opset 11/12. Per-channel used to write a DequantizeLinear
    with `axis` (opset 13+) and w8a16 crashed in onnxruntime's own opset upgrade (its
    Softmax adapter makes tensors the calibrated ranges lack). The model is moved to opset
    13 before calibration."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((16, 4)).astype(np.float32), "w2")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["h"]),
            helper.make_node("Softmax", ["h"], ["p"], axis=1),
            helper.make_node("MatMul", ["p", "w2"], ["y"]),
        ],
        "old",
        [helper.make_tensor_value_info("x", F, ["batch", 8])],
        [helper.make_tensor_value_info("y", F, ["batch", 4])],
        [w1, w2],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)], ir_version=7)
    path = _save(model, tmp_path / "old.onnx")
    done = cli(
        "build", "--onnx", path, "--device", device, "--precision", precision,
        "--shape", "x=2x8", "-o", tmp_path / "o", "--json",
    )  # fmt: skip
    assert done.exit_code == 0, done.stderr
    manifest = json.loads(done.stdout)
    steps = {s["pass"]: s for s in manifest["components"]["model"]["steps"]}
    assert steps["quantize"]["status"] == "ran"
    assert steps["verify"]["metrics"]["outputs"]["y"]["sqnr_db"] > 20
    built = onnx.load(
        str(tmp_path / "o" / "old" / f"{device}-{precision}" / "model" / "model.onnx")
    )
    assert next(o.version for o in built.opset_import if o.domain in ("", "ai.onnx")) >= 13


def test_build_onnx_with_real_data_calibrates_and_verifies_on_it(tmp_path: Path) -> None:
    """Calibration and held-out data of real inputs. The data lives in [100, 200]: ranges
    from it are useless on the synthetic [-1, 1] inputs, so a verification that did not
    read the held-out file would fail its threshold (and calibration on noise would fail
    on the held-out data)."""
    model = make_mlp_onnx(tmp_path / "mlp.onnx")
    rng = np.random.default_rng(7)
    np.savez(tmp_path / "calib.npz", x=rng.uniform(100, 200, (16, 2, 4)).astype(np.float32))
    np.savez(tmp_path / "held.npz", x=rng.uniform(100, 200, (4, 2, 4)).astype(np.float32))
    base = ("build", "--onnx", model, "--device", "cpu", "--precision", "uint8", "--shape",
            "x=2x4", "-o", tmp_path / "o", "--json")  # fmt: skip
    done = cli(*base, "--calibration-data", str(tmp_path / "calib.npz"),
               "--eval-data", str(tmp_path / "held.npz"))  # fmt: skip
    assert done.exit_code == 0, done.stderr
    steps = {s["pass"]: s for s in json.loads(done.stdout)["components"]["model"]["steps"]}
    assert steps["quantize"]["metrics"]["calibration_source"].startswith("npz: ")
    assert steps["quantize"]["metrics"]["calibration_samples"] == 16
    assert steps["verify"]["metrics"]["outputs"]["y"]["sqnr_db"] > 25
    # calibrated on noise, judged on the real held-out data: the static model misses
    # verify's gates there, and mode auto keeps onnxruntime's dynamic quantization (ranges
    # measured on every run), which holds them
    noise = cli(*base, "--eval-data", str(tmp_path / "held.npz"), "--no-cache")
    assert noise.exit_code == 0, noise.stderr
    got = {s["pass"]: s for s in json.loads(noise.stdout)["components"]["model"]["steps"]}
    choice = got["quantize"]["metrics"]["format_choice"]
    assert any(m.startswith("y: sqnr_db") for m in choice["tried"][0]["missed"]), choice
    assert choice["kept"].startswith("dynamic")
    assert got["verify"]["metrics"]["data_source"].startswith("npz: ")


def _auto_build(tmp_path: Path, model: onnx.ModelProto, shape: str) -> dict:
    path = _save(model, tmp_path / "m.onnx")
    (tmp_path / "p").mkdir()
    done = cli("init", str(path), "--name", "m", "--catalog", tmp_path / "p" / "catalog",
               "--recipes", tmp_path / "p" / "recipes")  # fmt: skip
    assert done.exit_code == 0, done.stderr
    recipe = tmp_path / "p" / "recipes" / "m.yaml"
    recipe.write_text(
        "schema_version: 1\nname: m\nmodel: m\ntargets: [{device: cpu, precision: uint8}]\n"
        "steps:\n  - quantize: {mixed_precision: {auto: {target_sqnr_db: 80, max_promoted: 2}}}\n"
    )
    result = api.build(recipe, output_root=tmp_path / "o")
    return steps_of(result)["quantize"]["metrics"]["mixed_precision_auto"]


def test_auto_mixed_precision_on_a_cnn_with_relu6(tmp_path: Path) -> None:
    """ReLU6 (Clip 0..6 with initializer bounds) folded into Q/DQ: the gate re-applies the
    Clip, whose bounds the QDQ graph no longer has ("cannot order the gated graph")."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.standard_normal((2, 4, 3, 3)).astype(np.float32), "w2"),
        numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
        numpy_helper.from_array(np.array(6.0, np.float32), "hi"),
    ]
    model = _model(
        [
            helper.make_node("Conv", ["x", "w1"], ["c"], name="conv1", pads=[1, 1, 1, 1]),
            helper.make_node("Clip", ["c", "lo", "hi"], ["r"], name="relu6"),
            helper.make_node("Conv", ["r", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1]),
        ],
        [helper.make_tensor_value_info("x", F, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", F, [1, 2, 8, 8])],
        inits,
    )
    auto = _auto_build(tmp_path, model, "x=1x3x8x8")
    assert auto["promoted"] and auto["rounds"][-1]["output_sqnr_db"]["y"] > -100


def test_auto_mixed_precision_with_an_infinite_attention_mask(tmp_path: Path) -> None:
    """An additive mask of -inf: a gate blending T + 0 * (DQ(Q(T)) - T) is NaN there, every
    candidate scored -200 dB and the promotion order was alphabetical."""
    rng = np.random.default_rng(1)
    mask = np.zeros((4, 4), np.float32)
    mask[:, 3] = -np.inf
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "wq"),
        numpy_helper.from_array(mask, "mask"),
        numpy_helper.from_array(rng.standard_normal((4, 8)).astype(np.float32), "wo"),
    ]
    model = _model(
        [
            helper.make_node("MatMul", ["x", "wq"], ["s"], name="q"),
            helper.make_node("Add", ["s", "mask"], ["masked"], name="mask_add"),
            helper.make_node("Softmax", ["masked"], ["p"], name="softmax", axis=-1),
            helper.make_node("MatMul", ["p", "wo"], ["y"], name="out"),
        ],
        [helper.make_tensor_value_info("x", F, [4, 8])],
        [helper.make_tensor_value_info("y", F, [4, 8])],
        inits,
    )
    auto = _auto_build(tmp_path, model, "x=4x8")
    assert auto["output_sqnr_db_weights_only"] > 0  # not NaN -> -200
    ranked = [p["output_sqnr_db_if_only_this_is_quantized"] for p in auto["promoted"]]
    assert all(r > -100 for r in ranked), ranked


def test_a_16bit_build_of_a_model_saved_with_external_data(tmp_path, monkeypatch) -> None:
    """npu/w8a16 of an opset-17 MLP whose every save goes to external data (as a full-size
    model's does): the pass converts it to opset 21 on a light view, saves it, and goes on
    reading the constants of the model it saved (the HTP rewrites read the biases) and
    calibrating; the output uses ai.onnx Q/DQ."""
    from tests.conftest import make_mlp_project
    from winml_recipes.onnx import io

    monkeypatch.setattr(io, "EXTERNAL_DATA_THRESHOLD_BYTES", 1)
    monkeypatch.setenv("WINML_RECIPES_CACHE", str(tmp_path / "cache"))
    recipe = make_mlp_project(tmp_path, steps="[fix_shapes, quantize, verify]")
    make_mlp_onnx(tmp_path / "catalog" / "mlp.onnx", hidden=256)  # weights over 1 KB
    recipe.write_text(recipe.read_text().replace("npu, precision: fp32", "npu, precision: w8a16"))
    result = api.build(recipe, device="npu", precision="w8a16", output_root=tmp_path / "b")
    model = io.load_model(result.models["model"])
    assert {(o.domain, o.version) for o in model.opset_import} >= {("", 21)}
    ops = Counter((n.domain, n.op_type) for n in model.graph.node)
    assert ops[("", "QuantizeLinear")] and not ops[("com.microsoft", "QuantizeLinear")]
    (step,) = [s for s in result.manifest["components"]["model"]["steps"] if s["pass"] == "verify"]
    assert step["status"] == "ran"


def test_synthetic_calibration_is_named_and_blamed_on_a_failed_gate(tmp_path: Path) -> None:
    """`build --onnx` on a token-id model without --calibration-data says, once, that the
    ranges come from synthetic inputs; when the gate then fails, the error names that as
    the likely cause. (The model fails any 8-bit calibration: a weight row of 1000 that
    never reaches the output sets the weight's range, so only the hint is under test.)"""
    rng = np.random.default_rng(3)
    table = rng.standard_normal((32, 16)).astype(np.float32)
    w = rng.standard_normal((16, 16)).astype(np.float32)
    w[0, :] = 1000.0
    mask = np.ones((16,), np.float32)
    mask[0] = 0.0
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
            helper.make_node("Mul", ["e", "mask"], ["h"], name="gate"),
            helper.make_node("MatMul", ["h", "w"], ["y"], name="mm"),
        ],
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 16])],
        [helper.make_tensor_value_info("y", F, [1, 16, 16])],
        [numpy_helper.from_array(x, n) for x, n in ((table, "table"), (w, "w"), (mask, "mask"))],
    )
    path = _save(
        _model(graph.node, graph.input, graph.output, graph.initializer), tmp_path / "t.onnx"
    )
    base = (
        "build",
        "--onnx",
        path,
        "--device",
        "cpu",
        "--precision",
        "uint8",
        "-o",
        tmp_path / "o",
    )
    done = cli(*base)
    assert done.exit_code == 3, done.stderr
    assert done.stderr.count("calibrating ids (token ids) on synthetic inputs") == 1
    assert "likely cause: the model was calibrated on synthetic inputs" in done.stderr
    np.savez(tmp_path / "c.npz", ids=rng.integers(0, 32, (4, 1, 16)))
    done = cli(*base, "--calibration-data", tmp_path / "c.npz")
    assert done.exit_code == 3
    assert "on synthetic inputs" not in done.stdout + done.stderr


def test_an_image_model_without_data_calibrates_on_the_bundled_photos(tmp_path: Path) -> None:
    """No --calibration-data for a [1, 3, 32, 32] input: calibration reads the bundled
    calibration photographs, verification the held-out ones (every one), and the summary
    says so; no "synthetic" note."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["y"], name="relu"),
    ]
    x = helper.make_tensor_value_info("x", F, [1, 3, 32, 32])
    y = helper.make_tensor_value_info("y", F, [1, 4, 32, 32])
    path = _save(_model(nodes, [x], [y], [w]), tmp_path / "c.onnx")
    done = cli("build", "--onnx", path, "--device", "cpu", "--precision", "int8",
               "-o", tmp_path / "o")  # fmt: skip
    assert done.exit_code == 0, done.stderr
    assert "on synthetic inputs" not in done.stderr
    assert "calibrated on bundled photos (calibration set) (16 samples)" in done.stdout
    assert "verified with bundled photos (heldout set) (8 samples)" in done.stdout


def _held_out_case(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A Conv model with 8 calibration and 8 held-out samples (different content)."""
    path = _save(conv_model(), tmp_path / "c.onnx")
    rng = np.random.default_rng(11)
    calib, held = tmp_path / "calib.npz", tmp_path / "held.npz"
    np.savez(calib, x=rng.standard_normal((8, 1, 3, 8, 8)).astype(np.float32))
    np.savez(held, x=rng.standard_normal((8, 1, 3, 8, 8)).astype(np.float32))
    return path, calib, held


def test_every_held_out_sample_is_verified(tmp_path: Path) -> None:
    """--eval-data with 8 samples verified 2 of them (`data_samples: 2`)."""
    path, calib, held = _held_out_case(tmp_path)
    done = cli("build", "--onnx", path, "--device", "cpu", "--precision", "int8",
               "--shape", "x=1x3x8x8", "--calibration-data", calib, "--eval-data", held,
               "-o", tmp_path / "o", "--json")  # fmt: skip
    assert done.exit_code == 0, done.stderr
    steps = {s["pass"]: s for s in json.loads(done.stdout)["components"]["model"]["steps"]}
    assert steps["verify"]["metrics"]["data_samples"] == 8
    assert steps["verify"]["metrics"]["samples"] == 8
    assert "data_capped" not in steps["verify"]["metrics"]


def test_held_out_data_holding_calibration_samples_is_refused(tmp_path: Path) -> None:
    """The same file for calibration and evaluation used to verify on calibration samples
    silently; a held-out file holding one calibration sample (same content) is refused too.
    --allow-calibration-overlap builds and says so."""
    path, calib, held = _held_out_case(tmp_path)
    base = ("build", "--onnx", path, "--device", "cpu", "--precision", "int8",
            "--shape", "x=1x3x8x8", "--calibration-data", calib, "-o", tmp_path / "o")  # fmt: skip
    message = user_error(*base, "--eval-data", calib)
    assert "model: 8 of 8 held-out samples (npz: " in message
    assert "are calibration samples (same content)" in message
    mixed = tmp_path / "mixed.npz"
    x = np.load(held)["x"].copy()
    x[5] = np.load(calib)["x"][2]
    np.savez(mixed, x=x)
    assert "model: 1 of 8 held-out samples" in user_error(*base, "--eval-data", mixed)
    done = cli(*base, "--eval-data", calib, "--allow-calibration-overlap")
    assert done.exit_code == 0, done.stderr
    assert "warning: verified on data that may hold calibration samples" in done.stdout


def test_mode_auto_holds_candidates_to_the_verify_steps_gates(isolated) -> None:
    """mode auto used to hold the mlp's candidates to its task metric's default gates
    (embedding cosine), which static QDQ holds: kept after one score, then withheld by
    verify. The candidates are now held to the gates of the verify step after it, the
    recipe's own thresholds included (min_sqnr_db 80 here, which no 8-bit model of it
    reaches). Static and onnxruntime's dynamic candidate are scored, each misses that gate
    by name, and static is kept. verify then withholds it by the same gate."""
    from winml_recipes.sdk.errors import QualityGateError

    recipe = isolated.recipe(
        "mlp",
        "steps:\n  - quantize: {mode: auto}\n  - verify: {min_sqnr_db: 80, min_cosine: 0.9}\n",
    )
    planned = api.plan(recipe, device="cpu", precision="int8").components[0].steps
    quantize = next(s for s in planned if s.name == "quantize")
    assert quantize.options["held_to"] == {"min_sqnr_db": 80, "min_cosine": 0.9,
                                           "task_decides": False}  # fmt: skip
    with pytest.raises(QualityGateError) as failed:
        isolated.build(recipe, "cpu", "int8")
    assert "y: SQNR" in str(failed.value)
    (manifest,) = isolated.out.glob("r/cpu-int8.failed/manifest.json")
    steps = {s["pass"]: s for s in json.loads(manifest.read_text())["components"]["model"]["steps"]}
    choice = steps["quantize"]["metrics"]["format_choice"]
    scored = [t for t in choice["tried"] if "missed" in t]
    assert [t["candidate"] for t in scored][:2] == ["static", "dynamic"], choice
    for t in scored:
        assert any(m.startswith("y: sqnr_db ") and m.endswith("(gate >= 80)") for m in t["missed"])
    assert choice["kept"] == "static" and "verify's gates (embedding-cosine)" in choice["why"]


def test_a_recipe_held_to_of_its_own_is_kept(isolated) -> None:
    recipe = isolated.recipe(
        "mlp", "steps:\n  - quantize: {mode: auto, held_to: {min_sqnr_db: 5}}\n  - verify\n"
    )
    planned = api.plan(recipe, device="cpu", precision="int8").components[0].steps
    quantize = next(s for s in planned if s.name == "quantize")
    assert quantize.options["held_to"] == {"min_sqnr_db": 5}
    assert quantize.config.held_to.min_sqnr_db == 5
