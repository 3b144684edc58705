"""The OpenVINO plugin EP (onnxruntime-ep-openvino) on this host's CPU device.

Real OpenVINO sessions: device selection (the plugin picks the device by EP device, not
by provider option), the quantization rules (OpenVINO's QDQ scheme, written by
onnxruntime's quantizer), and a QDQ sam3-tiny component opened with every node on
OpenVINO and verified against the float model. Facts: docs/eps/openvino.md.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from winml_recipes.eps import openvino
from winml_recipes.onnx.metrics import compare_runs
from winml_recipes.sdk.errors import ExecutionProviderError

# onnxruntime-ep-openvino ships wheels for Windows and Linux x86_64 (pyproject's `openvino`
# extra); there `make install` installs it and every test here must run.
OV_WHEELS = platform.system() == "Windows" or (
    platform.system() == "Linux" and platform.machine() == "x86_64"
)
pytestmark = pytest.mark.skipif(not OV_WHEELS, reason="no onnxruntime-ep-openvino wheel here")
# The plugin offers devices on Intel hosts only (docs/eps/openvino.md); where it offers
# none, these do not run and say why, and test_openvino_no_device.py covers that host.
NEEDS_DEVICE = pytest.mark.ep_device("openvino")


@NEEDS_DEVICE
def test_openvino_loads_and_records_its_device() -> None:
    ok, why = openvino.available()
    assert ok, why
    info = openvino.device_info("npu")
    assert info is not None
    # this host has no Intel NPU: the CPU device stands in, and says so
    assert (info.ov_device, info.requested, info.stand_in) == ("CPU", "NPU", True)
    assert "ran on CPU" in info.to_manifest()["stand_in"]
    assert info.name  # FULL_DEVICE_NAME, e.g. "Intel(R) Xeon(R) Processor"
    assert openvino.device_info("cpu").stand_in is False
    versions = openvino.versions()
    assert versions["onnxruntime-ep-openvino"] == "1.8.1"
    assert versions["openvino_ep_library"].startswith("1.8.1")
    assert versions["openvino_device"].startswith("CPU: ")
    assert versions["openvino_device"].endswith("(standing in for the NPU)")
    assert openvino.PLUGIN.emulation_note() == "OpenVINO CPU device standing in for the NPU"


@NEEDS_DEVICE
def test_device_type_selects_the_ep_device_and_is_not_passed_on() -> None:
    """The plugin ignores a `device_type` provider option, so it is ours: it picks the EP
    device, and asking for a device by name allows no stand-in."""
    import onnxruntime as ort

    assert openvino.available()[0]
    devices = ort.get_ep_devices()
    assert openvino.choose_device(devices, "npu", {"device_type": "npu"}) is None
    found = openvino.choose_device(devices, "npu", {"device_type": "CPU"})
    assert found is not None and found[0].ep_metadata["ov_device"] == "CPU"
    assert found[0].ep_name == "OpenVINOExecutionProvider"  # not the .AUTO meta device
    options = openvino.PLUGIN.provider_options("npu", {"device_type": "CPU", "num_streams": "1"})
    assert options == {"num_streams": "1"}


def _add_concat_model() -> onnx.ModelProto:
    w = numpy_helper.from_array(np.ones((1, 4), np.float32), "w")
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Sigmoid", ["x"], ["b"]),
        helper.make_node("Tanh", ["x"], ["c"]),
        helper.make_node("Add", ["a", "b"], ["s"]),
        helper.make_node("Concat", ["b", "c"], ["k"], axis=1),
        helper.make_node("Mul", ["s", "w"], ["y"]),  # w is a weight: not an activation
        helper.make_node("MatMul", ["k", "k2"], ["z"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "z")],
        [w, numpy_helper.from_array(np.ones((8, 2), np.float32), "k2")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_unified_scales_share_one_range() -> None:
    model = _add_concat_model()
    acts = ["x", "a", "b", "c", "s", "k", "y", "z"]
    assert openvino.unified_scale_groups(model, acts) == [["a", "b", "c"]]
    ranges = {"a": (0.0, 1.0), "b": (0.0, 0.5), "c": (-2.0, 0.25), "s": (0.0, 3.0)}
    out, metrics = openvino.QUANT_RULES.adjust_ranges(model, ranges, acts)
    assert out["a"] == out["b"] == out["c"] == (-2.0, 1.0)
    assert out["s"] == (0.0, 3.0)
    assert metrics == {"unified_scales": [["a", "b", "c"]]}


class _Reader:
    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self._it = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)


def _quantize(
    src: Path,
    dst: Path,
    feeds: list[dict[str, np.ndarray]],
    exclude: list[str] | None = None,
    **override,
) -> Path:
    """onnxruntime's quantizer with the rules' arguments; `exclude`d nodes read float
    inputs (as the quantize pass leaves them)."""
    from onnxruntime.quantization import quantize_static

    from winml_recipes.quant.ort import restore_float_inputs

    cfg = SimpleNamespace(
        **{**openvino.QUANT_RULES.defaults, "reduce_range": False, "op_types": (), **override}
    )
    args = openvino.QUANT_RULES.quantizer_args(src, cfg, {}, list(exclude or []))
    assert args is not None
    quantize_static(str(src), str(dst), _Reader(feeds), **args)
    restore_float_inputs(dst, list(exclude or []))
    return dst


def _pixels(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        {"pixel_values": rng.uniform(-1, 1, (1, 3, 112, 112)).astype(np.float32)} for _ in range(n)
    ]


@NEEDS_DEVICE
def test_sam3_tiny_encoder_qdq_runs_on_openvino_cpu(tiny_build, tmp_path: Path) -> None:
    """OpenVINO's scheme on the float sam3-tiny vision encoder: u8 asymmetric activations,
    s8 symmetric per-channel weights; every node on OpenVINO; close to the float model."""
    import onnxruntime as ort

    src = tiny_build.output_dir / "vision_encoder" / "model.onnx"
    qdq = _quantize(src, tmp_path / "ve.onnx", _pixels(4, 0))
    model = onnx.load(qdq)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    weights = [
        n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits
    ]
    acts = [n for n in model.graph.node if n.op_type == "QuantizeLinear"]
    assert weights and acts
    conv_or_matmul_weights = [n for n in weights if inits[n.input[0]].dtype == np.int8]
    assert conv_or_matmul_weights
    for n in conv_or_matmul_weights:  # symmetric: zero points 0, values within -127..127
        assert not np.any(inits[n.input[2]]) and inits[n.input[0]].min() >= -127
    assert any(inits[n.input[1]].size > 1 for n in conv_or_matmul_weights)  # per channel
    assert {inits[n.input[2]].dtype for n in acts} == {np.dtype(np.uint8)}
    assert any(int(inits[n.input[2]]) != 128 for n in acts)  # asymmetric
    # ConvTranspose is not in OpenVINO's NPU list: its weights stay float
    deconvs = [n for n in model.graph.node if n.op_type == "ConvTranspose"]
    assert deconvs and all(n.input[1] in inits for n in deconvs)

    session, info = openvino.open_session(qdq, "npu")  # no CPU fallback
    assert list(openvino.placement(session)) == ["OpenVINOExecutionProvider"]
    assert (info.ov_device, info.requested) == ("CPU", "NPU")
    reference = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    held_out = _pixels(2, 7)
    ours = [dict(zip(names, session.run(names, f), strict=True)) for f in held_out]
    ref = [dict(zip(names, reference.run(names, f), strict=True)) for f in held_out]
    metrics = compare_runs(ref, ours)
    # measured 27-30 dB on random pixels (docs/eps/openvino.md); a broken scheme is < 10 dB
    assert min(m["sqnr_db"] for m in metrics.values()) > 20, metrics


@NEEDS_DEVICE
def test_int8_activations_do_not_compile_on_openvino_cpu(tiny_build, tmp_path: Path) -> None:
    """Why the rules refuse int8 activations: OpenVINO's CPU device has no kernel for the
    encoder quantized that way."""
    src = tiny_build.output_dir / "vision_encoder" / "model.onnx"
    qdq = _quantize(src, tmp_path / "ve-s8.onnx", _pixels(2, 0), activation_type="int8")
    with pytest.raises(ExecutionProviderError, match="No suitable implementations"):
        openvino.open_session(qdq, "cpu")
    assert openvino.QUANT_RULES.check(SimpleNamespace(activation_type="int8")) is not None


# -- a Concat along a row axis feeding a MatMul (the sam3-tiny decoder's tokens) ----------

ROW_CONCAT_CATALOG = """\
schema_version: 1
name: rowcat
task: feature-extraction
license: mit
components:
  model:
    source: {ref: ./rowcat.onnx}
    inputs:
      a: {dtype: float32, shape: [1, 6, 16], range: [-1.0, 1.0]}
      b: {dtype: float32, shape: [1, 5, 16], range: [-1.0, 1.0]}
    outputs:
      rows_out: {shape: [1, 11, 8]}
      cols_out: {shape: [1, 6, 8]}
"""


def _row_concat_model() -> onnx.ModelProto:
    """Two quantized Adds concatenated along the row axis (1) into a MatMul with a weight
    ("rows", as SAM's point embeddings and prompt tokens), and along the contracted axis
    into another ("cols")."""
    rng = np.random.default_rng(0)

    def const(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.uniform(-1, 1, shape).astype(np.float32), name)

    nodes = [
        helper.make_node("Add", ["a", "ca"], ["sa"], name="add_a"),
        helper.make_node("Add", ["b", "cb"], ["sb"], name="add_b"),
        helper.make_node("Concat", ["sa", "sb"], ["rows"], name="cat_rows", axis=1),
        helper.make_node("MatMul", ["rows", "w_rows"], ["rows_out"], name="mm_rows"),
        helper.make_node("Concat", ["sa", "sa"], ["cols"], name="cat_cols", axis=-1),
        helper.make_node("MatMul", ["cols", "w_cols"], ["cols_out"], name="mm_cols"),
    ]
    graph = helper.make_graph(
        nodes,
        "rowcat",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 6, 16]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 5, 16]),
        ],
        [
            helper.make_tensor_value_info("rows_out", TensorProto.FLOAT, [1, 11, 8]),
            helper.make_tensor_value_info("cols_out", TensorProto.FLOAT, [1, 6, 8]),
        ],
        [
            const("ca", (16,)),
            const("cb", (16,)),
            const("w_rows", (16, 8)),
            const("w_cols", (32, 8)),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


@NEEDS_DEVICE
def test_a_matmul_after_a_row_concat_stays_float(tmp_path: Path) -> None:
    """OpenVINO 2026.4 cannot load a quantized MatMul whose data input is a Concat along a
    row axis (its int8 MatMul transformation cannot broadcast the Concat's per-slice zero
    point); the rules leave exactly that MatMul float, and then every node runs on
    OpenVINO. If a newer OpenVINO loads the first model, the rule can go."""
    src = tmp_path / "rowcat.onnx"
    onnx.save(_row_concat_model(), src)
    float_nodes = openvino.QUANT_RULES.float_nodes(onnx.load(src))
    assert list(float_nodes) == ["mm_rows"]  # not mm_cols: its Concat is on the last axis
    assert "Concat along axis 1" in float_nodes["mm_rows"]
    rng = np.random.default_rng(1)
    feeds = [
        {
            n: rng.uniform(-1, 1, s).astype(np.float32)
            for n, s in (("a", (1, 6, 16)), ("b", (1, 5, 16)))
        }
        for _ in range(4)
    ]
    every_matmul = _quantize(src, tmp_path / "all.onnx", feeds)
    with pytest.raises(
        ExecutionProviderError, match=r"MatMulTransformation\] END: node: opset1::MatMul mm_rows"
    ):
        openvino.open_session(every_matmul, "npu")
    kept = _quantize(src, tmp_path / "kept.onnx", feeds, exclude=list(float_nodes))
    session, _ = openvino.open_session(kept, "npu")  # no CPU fallback
    assert list(openvino.placement(session)) == ["OpenVINOExecutionProvider"]
    weights = {n.input[0] for n in onnx.load(kept).graph.node if n.op_type == "DequantizeLinear"}
    assert any(w.startswith("w_cols") for w in weights)  # mm_cols is still quantized
    assert not any(w.startswith("w_rows") for w in weights)


@NEEDS_DEVICE
def test_build_for_openvino_records_ep_device_and_versions(tmp_path: Path) -> None:
    """`build --ep openvino` builds a recipe's npu/uint8 target for OpenVINO: the QDQ model
    opens with every node on OpenVINO's CPU device (standing in for the NPU), and the
    manifest names the EP, the device and the versions; the MatMul OpenVINO refuses
    quantized stays float, with the reason. `perf` finds the build folder."""
    from tests.conftest import cli
    from winml_recipes.perf import resolve_builds

    (tmp_path / "catalog").mkdir()
    (tmp_path / "recipes").mkdir()
    onnx.save(_row_concat_model(), tmp_path / "catalog" / "rowcat.onnx")
    (tmp_path / "catalog" / "rowcat.yaml").write_text(ROW_CONCAT_CATALOG)
    recipe = tmp_path / "recipes" / "rowcat.yaml"
    recipe.write_text(
        "schema_version: 1\nname: rowcat\nmodel: rowcat\ntargets:\n"
        "  - {device: npu, precision: uint8}\n  - {device: npu, precision: uint8, ep: openvino}\n"
        "steps: [{quantize: {calibration: {samples: 4}}}, verify]\n"
    )
    out = tmp_path / "out"
    args = ("build", recipe, "--device", "npu", "--precision", "uint8", "-o", out)
    result = cli(*args, "--ep", "openvino")
    assert result.exit_code == 0, result.output + result.stderr
    folder = out / "rowcat" / "npu-uint8-openvino"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["target"] == {"device": "npu", "precision": "uint8", "ep": "openvino"}
    steps = {s["pass"]: s for s in manifest["components"]["model"]["steps"]}
    assert list(steps["quantize"]["metrics"]["ep_float_nodes"]) == ["mm_rows"]
    verify = steps["verify"]["metrics"]
    assert verify["verified_on"] == "openvino"
    assert list(verify["placement"]["nodes"]) == ["OpenVINOExecutionProvider"]
    ep = verify["execution_provider"]
    assert ep["key"] == "openvino" and ep["provider"] == "OpenVINOExecutionProvider"
    assert ep["versions"]["onnxruntime-ep-openvino"] == "1.8.1"
    assert ep["versions"]["openvino_device"].startswith("CPU: ")
    assert ep["versions"]["openvino_device"].endswith("(standing in for the NPU)")
    session, info = openvino.open_session(folder / "model" / "model.onnx", "npu")
    assert info.stand_in and list(openvino.placement(session)) == ["OpenVINOExecutionProvider"]
    builds, notes = resolve_builds([recipe], out)
    assert [b.relpath for b in builds] == ["rowcat/npu-uint8-openvino"]
    assert [b.ep_key for b in builds] == ["openvino"]
    assert notes == [f"rowcat npu/uint8: not built ({out / 'rowcat' / 'npu-uint8'})"]


@pytest.mark.slow
@NEEDS_DEVICE
def test_sam3_tiny_npu_builds_and_verifies_through_openvino(tmp_path: Path) -> None:
    """The recipe's npu/uint8 target for OpenVINO: both components quantized with
    OpenVINO's rules and verified on its CPU device, every node on OpenVINO (~90 s)."""
    from tests.conftest import RECIPES
    from winml_recipes import api

    built = api.build(
        RECIPES / "sam3-tiny.yaml", device="npu", precision="uint8", ep="openvino",
        output_root=tmp_path,
    )  # fmt: skip
    manifest = built.manifest
    assert built.output_dir.name == "npu-uint8-openvino"
    assert manifest["status"] == "ok" and manifest["target"]["ep"] == "openvino"
    for name, comp in manifest["components"].items():
        steps = {s["pass"]: s for s in comp["steps"]}
        verify = steps["verify"]["metrics"]
        assert verify["verified_on"] == "openvino", name
        assert list(verify["placement"]["nodes"]) == ["OpenVINOExecutionProvider"], name
        assert verify["execution_provider"]["versions"]["openvino_device"].startswith("CPU: ")
        assert steps["compile"]["status"] == "skipped"
    decoder = {s["pass"]: s for s in manifest["components"]["prompt_encoder_mask_decoder"]["steps"]}
    # the q/k/v projections of the tokens (point embeddings + prompt tokens, a row Concat)
    assert len(decoder["quantize"]["metrics"]["ep_float_nodes"]) == 3
    # measured 21.1 dB (docs/eps/openvino.md); the recipe's gate is 15 dB
    assert decoder["verify"]["metrics"]["outputs"]["pred_masks"]["sqnr_db"] > 18
