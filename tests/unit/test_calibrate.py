"""Tests for winml_recipes.quant.calibrate: streaming calibration and the ORT cache hand-off.

Models are built here with onnx.helper; the expected ranges are computed with numpy.
"""

from __future__ import annotations

import weakref
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
from onnxruntime.quantization.calibrate import MinMaxCalibrater, load_tensors_data

from winml_recipes.quant.calibrate import (
    CalibrationSettings,
    calibrate,
    entropy_threshold_bins,
    tensors_to_calibrate,
    write_ort_cache,
)
from winml_recipes.sdk.errors import PassError

# onnx 1.23 writes IR 14 by default; onnxruntime 1.31 reads up to IR 13.
IR_VERSION = 10
F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits=(), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION
    )


def _weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w1": rng.standard_normal((16, 32)).astype(np.float32) * 0.5,
        "b1": rng.standard_normal(32).astype(np.float32),
        "w2": rng.standard_normal((32, 4)).astype(np.float32) * 0.3,
    }


def mlp_model(seed: int = 0) -> onnx.ModelProto:
    """x[batch,16] -> MatMul -> h -> Add -> a -> Relu -> r -> MatMul -> m -> Tanh -> y,
    plus Shape(x) (an int64 tensor, never calibrated)."""
    w = _weights(seed)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("Add", ["h", "b1"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["m"], name="mm2"),
        helper.make_node("Tanh", ["m"], ["y"], name="tanh"),
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", F, ["batch", 16])],
        [
            helper.make_tensor_value_info("y", F, ["batch", 4]),
            helper.make_tensor_value_info("s", TensorProto.INT64, [2]),
        ],
        [numpy_helper.from_array(v, k) for k, v in w.items()],
    )


def mlp_reference(x: np.ndarray, seed: int = 0) -> dict[str, np.ndarray]:
    w = _weights(seed)
    h = x @ w["w1"]
    a = h + w["b1"]
    r = np.maximum(a, 0)
    m = r @ w["w2"]
    return {"x": x, "h": h, "a": a, "r": r, "m": m, "y": np.tanh(m)}


def scale_model() -> onnx.ModelProto:
    """x[n,256] -> Mul 2 -> y -> Add 1 -> z: `x` is read from the feeds, `y`/`z` from runs."""
    inits = [
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
    ]
    nodes = [
        helper.make_node("Mul", ["x", "two"], ["y"], name="mul"),
        helper.make_node("Add", ["y", "one"], ["z"], name="add"),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", F, ["n", 256])],
        [helper.make_tensor_value_info("z", F, ["n", 256])],
        inits,
    )


def _save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save_model(model, str(path))
    return path


def mlp_feeds(count: int = 12, seed: int = 1):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        yield {"x": (rng.standard_normal((8, 16)) * 2).astype(np.float32)}


def heavy_samples(count: int = 16, seed: int = 3) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_t(2.0, size=(64, 256)).astype(np.float32) for _ in range(count)]


@pytest.fixture
def mlp_path(tmp_path: Path) -> Path:
    return _save(mlp_model(), tmp_path / "mlp.onnx")


@pytest.fixture
def scale_path(tmp_path: Path) -> Path:
    return _save(scale_model(), tmp_path / "scale.onnx")


def _heavy_feeds(samples):
    return lambda: ({"x": s} for s in samples)


# --------------------------------------------------------------------------- selection


def test_tensors_to_calibrate_matches_ort_selection(mlp_path: Path) -> None:
    model = onnx.load(str(mlp_path))
    ours = tensors_to_calibrate(model)
    assert ours == ["x", "h", "a", "r", "m", "y"]  # graph order; no weights, no int64 `s`
    for op_types in (None, ["MatMul"], ["Relu", "Tanh"]):
        ort_cal = MinMaxCalibrater(mlp_path, op_types_to_calibrate=op_types)
        expected, _ = ort_cal.select_tensors_to_calibrate(ort_cal.model)
        assert set(tensors_to_calibrate(model, op_types)) == expected
    assert tensors_to_calibrate(model, ["Relu"]) == ["a", "r"]


def test_constant_node_outputs_are_not_activations() -> None:
    nodes = [
        helper.make_node(
            "Constant", [], ["c"], value=numpy_helper.from_array(np.ones(4, np.float32))
        ),
        helper.make_node("Add", ["x", "c"], ["y"]),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", F, [4])],
        [helper.make_tensor_value_info("y", F, [4])],
    )
    assert tensors_to_calibrate(model) == ["x", "y"]


# --------------------------------------------------------------------------- minmax


def test_minmax_equals_numpy_extremes(mlp_path: Path) -> None:
    ranges = calibrate(mlp_path, mlp_feeds(), CalibrationSettings())
    refs = [mlp_reference(f["x"]) for f in mlp_feeds()]
    assert set(ranges) == {"x", "h", "a", "r", "m", "y"}
    for name, (lo, hi) in ranges.items():
        true_lo = min(min(float(r[name].min()) for r in refs), 0.0)
        true_hi = max(max(float(r[name].max()) for r in refs), 0.0)
        assert lo == pytest.approx(true_lo, rel=1e-5, abs=1e-6), name
        assert hi == pytest.approx(true_hi, rel=1e-5, abs=1e-6), name
        assert type(lo) is float and type(hi) is float


def test_ranges_include_zero_and_symmetric(mlp_path: Path) -> None:
    plain = calibrate(mlp_path, mlp_feeds(), CalibrationSettings())
    assert plain["r"][0] == 0.0 and plain["r"][1] > 0  # Relu output: min is 0, not above
    sym = calibrate(mlp_path, mlp_feeds(), CalibrationSettings(symmetric=True))
    for name, (lo, hi) in sym.items():
        assert lo == -hi
        assert hi == pytest.approx(max(-plain[name][0], plain[name][1]))
    assert sym["r"][0] < 0  # a one-sided tensor gets the mirrored range


@pytest.mark.parametrize("method", ["minmax", "entropy", "percentile", "distribution"])
def test_positive_tensors_start_at_zero(scale_path: Path, method: str) -> None:
    rng = np.random.default_rng(0)
    samples = [rng.uniform(0.5, 1.0, (4, 256)).astype(np.float32) for _ in range(3)]
    ranges = calibrate(scale_path, _heavy_feeds(samples), CalibrationSettings(method=method))
    for name, floor in (("x", 0.5), ("y", 1.0), ("z", 2.0)):
        assert ranges[name][0] == 0.0, name  # as ORT's quantizer does: 0 is representable
        assert ranges[name][1] > floor, name


def test_tensors_argument_and_non_float_tensor(mlp_path: Path) -> None:
    ranges = calibrate(mlp_path, mlp_feeds(), CalibrationSettings(), tensors=["m"])
    assert list(ranges) == ["m"]
    with pytest.raises(PassError, match="'s'"):
        calibrate(mlp_path, mlp_feeds(), CalibrationSettings(), tensors=["s"])


def test_deterministic_and_independent_of_work_dir(mlp_path: Path, tmp_path: Path) -> None:
    def feeds():
        return mlp_feeds()

    settings = CalibrationSettings(method="entropy", num_bins=512)
    first = calibrate(mlp_path, feeds, settings)
    second = calibrate(mlp_path, feeds, settings, work_dir=tmp_path / "work")
    assert first == second
    assert sorted(p.name for p in (tmp_path / "work").glob("*.onnx")) == [
        "calibrate-minmax.onnx",
        "calibrate-outputs.onnx",
    ]


def test_external_data_model(tmp_path: Path) -> None:
    """Weights stay in the original sidecar; the augmented graphs live in work_dir."""
    model = mlp_model()
    src = tmp_path / "src"
    src.mkdir()
    onnx.save_model(
        model,
        str(src / "model.onnx"),
        save_as_external_data=True,
        location="model.onnx_data",
        size_threshold=256,
    )
    assert (src / "model.onnx_data").stat().st_size > 1024
    inline = _save(mlp_model(), tmp_path / "inline.onnx")  # onnx.save_model moved `model`
    settings = CalibrationSettings(method="percentile", percentile=99.0)
    got = calibrate(src / "model.onnx", mlp_feeds, settings, work_dir=tmp_path / "w")
    assert got == calibrate(inline, mlp_feeds, settings)
    assert not (tmp_path / "w" / "model.onnx_data").exists()


# --------------------------------------------------------------------------- histograms


def test_entropy_narrower_than_minmax_on_heavy_tails(scale_path: Path) -> None:
    samples = heavy_samples()
    feeds = _heavy_feeds(samples)
    minmax = calibrate(scale_path, feeds(), CalibrationSettings())
    entropy = calibrate(scale_path, feeds, CalibrationSettings(method="entropy"))
    for name in ("x", "y", "z"):
        lo, hi = entropy[name]
        assert minmax[name][0] < lo < 0 < hi < minmax[name][1], name
        assert hi - lo < 0.5 * (minmax[name][1] - minmax[name][0]), name
    # Mul by 2 scales the distribution: the threshold scales with it (same bins, 2x edges).
    assert entropy["y"][1] == pytest.approx(2 * entropy["x"][1], rel=1e-6)


def test_entropy_threshold_matches_brute_force_kl() -> None:
    def brute(hist: np.ndarray, nq: int) -> int:
        h = hist.astype(np.float64)
        best, best_i = np.inf, h.size
        for i in range(nq, h.size + 1):
            p = h[:i].copy()
            p[-1] += h[i:].sum()
            chunk = (np.arange(i) * nq) // i
            q = np.zeros(i)
            for c in range(nq):
                sel = (chunk == c) & (h[:i] > 0)
                if sel.any():
                    q[sel] = h[:i][sel].sum() / sel.sum()
            if q.sum() == 0 or ((p > 0) & (q == 0)).any():
                continue
            pn, qn = p / p.sum(), q / q.sum()
            pos = pn > 0
            kl = float(np.sum(pn[pos] * np.log(pn[pos] / qn[pos])))
            if kl < best - 1e-12:
                best, best_i = kl, i
        return best_i

    rng = np.random.default_rng(0)
    for df in (1.5, 3.0, 8.0):
        x = np.abs(rng.standard_t(df, size=20000))
        hist, _ = np.histogram(x, bins=192, range=(0, x.max()))
        assert entropy_threshold_bins(hist, 24) == brute(hist, 24)
    uniform, _ = np.histogram(rng.uniform(0, 1, 200000), bins=256, range=(0, 1))
    assert entropy_threshold_bins(uniform, 32) >= 250  # no tail to clip


def test_percentile_matches_numpy_within_a_bin(scale_path: Path) -> None:
    samples = heavy_samples(8)
    data = np.concatenate([s.ravel() for s in samples]).astype(np.float64)
    bins = 4096
    settings = CalibrationSettings(method="percentile", percentile=99.0, num_bins=bins)
    got = calibrate(scale_path, _heavy_feeds(samples), settings)["x"]
    width = (data.max() - data.min()) / bins
    assert got[0] == pytest.approx(np.percentile(data, 0.5), abs=width)
    assert got[1] == pytest.approx(np.percentile(data, 99.5), abs=width)
    assert data.min() < got[0] and got[1] < data.max()

    sym = CalibrationSettings(method="percentile", percentile=99.0, num_bins=bins, symmetric=True)
    lo, hi = calibrate(scale_path, _heavy_feeds(samples), sym)["x"]
    assert lo == -hi
    amax = np.abs(data).max()
    assert hi == pytest.approx(np.percentile(np.abs(data), 99.0), abs=amax / bins)


def test_distribution_is_mean_plus_minus_four_std(scale_path: Path) -> None:
    samples = heavy_samples(8)
    data = np.concatenate([s.ravel() for s in samples]).astype(np.float64)
    settings = CalibrationSettings(method="distribution", num_bins=4096)
    lo, hi = calibrate(scale_path, _heavy_feeds(samples), settings)["x"]
    mean, std = data.mean(), data.std()
    width = (data.max() - data.min()) / 4096
    assert lo == pytest.approx(mean - 4 * std, abs=4 * width)
    assert hi == pytest.approx(mean + 4 * std, abs=4 * width)
    assert data.min() < lo and hi < data.max()


def test_histogram_methods_need_a_reiterable_source(scale_path: Path) -> None:
    samples = heavy_samples(2)
    with pytest.raises(TypeError, match="callable"):
        calibrate(scale_path, ({"x": s} for s in samples), CalibrationSettings(method="entropy"))
    as_list = [{"x": s} for s in samples]  # a re-iterable collection is fine
    assert calibrate(scale_path, as_list, CalibrationSettings(method="entropy")) == calibrate(
        scale_path, _heavy_feeds(samples), CalibrationSettings(method="entropy")
    )


# --------------------------------------------------------------------------- streaming


class _Tracked:
    """A feed generator that records how many of its arrays were alive at once."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.made = 0
        self.max_alive = 0
        self._refs: list[weakref.ref] = []

    def __call__(self):
        rng = np.random.default_rng(0)
        for _ in range(self.count):
            alive = sum(r() is not None for r in self._refs)
            self.max_alive = max(self.max_alive, alive)
            x = rng.standard_normal((8, 16)).astype(np.float32)
            self._refs.append(weakref.ref(x))
            self.made += 1
            yield {"x": x}
            del x


@pytest.mark.parametrize("method", ["minmax", "entropy"])
def test_feeds_are_streamed_not_collected(mlp_path: Path, method: str) -> None:
    tracked = _Tracked(100)
    source = tracked() if method == "minmax" else tracked  # generator / factory
    ranges = calibrate(mlp_path, source, CalibrationSettings(method=method, num_bins=256))
    assert len(ranges) == 6
    assert tracked.made == (100 if method == "minmax" else 200)  # two passes for entropy
    assert tracked.max_alive == 0  # the previous sample is gone before the next is made


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("feed", "pattern"),
    [
        ({}, r"input 'x' is missing; expected float32\[batch, 16\]"),
        ({"x": np.zeros((8, 16), np.float64)}, r"'x' is float64\[8, 16\], expected float32"),
        ({"x": np.zeros((8, 15), np.float32)}, r"'x' is float32\[8, 15\], expected .*16\]"),
        ({"x": np.zeros(16, np.float32)}, r"'x' is float32\[16\], expected"),
        (
            {"x": np.zeros((8, 16), np.float32), "extra": np.zeros(1)},
            "'extra' is not an input",
        ),
    ],
)
def test_bad_feed_is_a_one_line_pass_error(mlp_path: Path, feed: dict, pattern: str) -> None:
    good = {"x": np.zeros((2, 16), np.float32)}
    with pytest.raises(PassError, match=pattern) as info:
        calibrate(mlp_path, iter([good, feed]), CalibrationSettings())
    assert "sample 1" in str(info.value)
    assert "\n" not in str(info.value)


def test_no_samples_is_an_error(mlp_path: Path) -> None:
    with pytest.raises(PassError, match="no calibration samples"):
        calibrate(mlp_path, iter([]), CalibrationSettings())


def test_bad_settings(mlp_path: Path) -> None:
    with pytest.raises(ValueError, match="method"):
        calibrate(mlp_path, mlp_feeds(), CalibrationSettings(method="kl"))
    with pytest.raises(ValueError, match="percentile"):
        calibrate(mlp_path, mlp_feeds, CalibrationSettings(method="percentile", percentile=0))


# --------------------------------------------------------------------------- ORT hand-off


def test_ort_cache_drives_quantize_static(mlp_path: Path, tmp_path: Path) -> None:
    ranges = calibrate(mlp_path, mlp_feeds, CalibrationSettings(method="entropy"))
    ranges["h"] = (-7.0, 9.0)  # unmistakably ours
    cache = tmp_path / "ranges.json"
    write_ort_cache(ranges, cache)
    loaded = load_tensors_data(cache)
    assert loaded.calibration_method == CalibrationMethod.MinMax
    assert float(loaded["m"].range_value[1]) == pytest.approx(ranges["m"][1], rel=1e-6)

    out = tmp_path / "q.onnx"
    quantize_static(
        str(mlp_path),
        str(out),
        calibration_data_reader=None,
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        calibrate_method=CalibrationMethod.MinMax,
        calibration_cache_path=cache,
    )
    q = onnx.load(str(out))
    inits = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    scales = {
        n.input[0]: float(inits[n.input[1]]) for n in q.graph.node if n.op_type == "QuantizeLinear"
    }
    assert {"x", "h", "m"} <= set(scales)
    assert scales["h"] == pytest.approx(16.0 / 255, rel=1e-6)
    for name in ("x", "m"):
        lo, hi = ranges[name]
        assert scales[name] == pytest.approx((hi - lo) / 255, rel=1e-5), name


def test_rearranged_tensors_share_their_sources_reductions(tmp_path: Path) -> None:
    """Reshape/Transpose/Squeeze outputs hold their input's values: one pair of reductions
    serves the chain, and every tensor still gets its own exact range."""
    from winml_recipes.quant.calibrate import _minmax_model, _value_infos

    shape = numpy_helper.from_array(np.array([4, 6], np.int64), "shape")
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        helper.make_node("Sub", ["sq", "x"], ["d"]),
        helper.make_node("Reshape", ["d", "shape"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[1, 0]),
        helper.make_node("Unsqueeze", ["t", "axes"], ["u"]),
        helper.make_node("Squeeze", ["u", "axes"], ["s"]),
        helper.make_node("Neg", ["s"], ["y"]),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", F, [2, 12])],
        [helper.make_tensor_value_info("y", F, [6, 4])],
        [shape, axes],
    )
    path = tmp_path / "chain.onnx"
    onnx.save(model, path)
    _, pairs = _minmax_model(model, ["d", "r", "t", "u", "s", "y"], _value_infos(model))
    assert len(set(pairs)) == 2 and len({pairs[0], *pairs[1:5]}) == 1  # d..s: one pair

    def feeds():
        for seed in range(3):
            yield {"x": np.random.default_rng(seed).normal(0.2, 1.0, (2, 12)).astype(np.float32)}

    ranges = calibrate(path, feeds, CalibrationSettings(), tensors=["d", "r", "t", "u", "s", "y"])
    xs = np.stack([f["x"] for f in feeds()])
    d = xs * xs - xs
    want = {"d": d, "r": d, "t": d, "u": d, "s": d, "y": -d}
    for name, values in want.items():
        lo, hi = min(float(values.min()), 0.0), max(float(values.max()), 0.0)
        assert ranges[name] == pytest.approx((lo, hi), rel=1e-6), name
