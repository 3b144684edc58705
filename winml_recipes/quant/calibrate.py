"""Activation ranges for static quantization, computed in streaming passes.

Why not `onnxruntime.quantization.quantize_static(calibrate_method=Entropy|Percentile|...)`:
its `HistogramCalibrater` keeps every intermediate output of every sample in memory before
building histograms (peak memory grows with the sample count), and `quantize_static` cannot
pass `num_bins`, so entropy runs on 128 bins with 128 quantized bins and equals MinMax.
Here memory does not grow with the number of samples:

- minmax: ONE pass over an augmented model whose extra outputs are ReduceMin/ReduceMax of
  each calibrated tensor (ORT frees the intermediates; only scalars come back).
- entropy / percentile / distribution: pass 1 is the minmax pass, which fixes the histogram
  edges of each tensor; pass 2 runs the model with the calibrated tensors as extra outputs,
  one sample at a time, adds each output to a fixed-edge histogram and drops it.

The ranges are handed to ORT's own quantizer through its calibration cache
(`write_ort_cache` -> `quantize_static(calibration_data_reader=None,
calibration_cache_path=..., calibrate_method=CalibrationMethod.MinMax)`).
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper
from onnxruntime.quantization.calibrate import (
    CalibrationMethod,
    TensorData,
    TensorsData,
    save_tensors_data,
)

from winml_recipes.onnx.io import load_model, save_model, sidecar_paths
from winml_recipes.quant.config import CALIBRATION_METHODS, CalibrationConfig
from winml_recipes.runtime.sessions import calibration_session
from winml_recipes.sdk.errors import PassError

METHODS = tuple(CALIBRATION_METHODS)
# Element types ORT calibrates (MinMaxCalibrater.select_tensors_to_calibrate).
CALIBRATED_ELEM_TYPES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16})
# distribution: range = mean ± DISTRIBUTION_STDS · std, clipped to the observed min/max.
DISTRIBUTION_STDS = 4.0
# Elements binned at a time: bounds the temporaries (float32 copy + int64 bin index).
_HIST_CHUNK = 1 << 20
_EXT_FOLDER_KEY = "session.model_external_initializers_file_folder_path"

Feed = Mapping[str, np.ndarray]
Feeds = Iterable[Feed] | Callable[[], Iterable[Feed]]


@dataclass(frozen=True)
class CalibrationSettings:
    method: str = CalibrationConfig.method  # "minmax" | "entropy" | "percentile" | ...
    num_bins: int = 2048  # histogram bins for the histogram methods
    num_quantized_bins: int = 128  # entropy: target bins over [0, threshold] of |x|
    percentile: float = 99.999  # percentile method: share of the values kept, in %
    symmetric: bool = False  # activation ranges symmetric around 0

    def validate(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"calibration method {self.method!r}: expected one of {METHODS}")
        if self.num_bins < 1:
            raise ValueError(f"num_bins must be >= 1, got {self.num_bins}")
        if self.method == "entropy" and not 1 <= self.num_quantized_bins <= self.num_bins:
            raise ValueError(
                f"num_quantized_bins must be in [1, num_bins={self.num_bins}], "
                f"got {self.num_quantized_bins}"
            )
        if not 0.0 < self.percentile <= 100.0:
            raise ValueError(f"percentile must be in (0, 100], got {self.percentile}")


# --------------------------------------------------------------------------- selection


def _value_infos(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """Typed value infos after shape inference (as ORT's calibrators see them)."""
    from winml_recipes.onnx.lightview import light_view

    try:  # on a view without the weights' bytes (a copy of them would cost gigabytes)
        inferred = onnx.shape_inference.infer_shapes(light_view(model))
    except Exception:  # unknown domains...: use what the model declares
        inferred = model
    infos = {vi.name: vi for vi in inferred.graph.value_info}
    infos.update({vi.name: vi for vi in inferred.graph.output})
    infos.update({vi.name: vi for vi in inferred.graph.input})
    return infos


def _elem_type(vi: onnx.ValueInfoProto | None) -> int | None:
    if vi is None or not vi.type.HasField("tensor_type"):
        return None
    return vi.type.tensor_type.elem_type


def _select(
    model: onnx.ModelProto, infos: Mapping[str, onnx.ValueInfoProto], op_types
) -> list[str]:
    initializers = {t.name for t in model.graph.initializer}
    # Outputs of Constant nodes are weights, not activations (after normalize they are
    # initializers anyway). ORT's selection would include them; the quantizer treats
    # them as weights, so leaving them out changes nothing but the cost of calibrating.
    constants = {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    wanted = set(op_types) if op_types else None
    seen: set[str] = set()
    names: list[str] = []
    for node in model.graph.node:
        if wanted is not None and node.op_type not in wanted:
            continue
        for name in (*node.input, *node.output):
            if not name or name in seen or name in initializers or name in constants:
                continue
            if _elem_type(infos.get(name)) in CALIBRATED_ELEM_TYPES:
                seen.add(name)
                names.append(name)
    return names


def tensors_to_calibrate(
    model: onnx.ModelProto, op_types: Sequence[str] | None = None
) -> list[str]:
    """Float activations (graph inputs and node outputs) ORT's quantizer asks ranges for.

    Mirrors `MinMaxCalibrater.select_tensors_to_calibrate`: the float32/float16 inputs and
    outputs of every node (of `op_types`, when given) that are not initializers, typed by
    shape inference. In graph order, without duplicates (ORT returns a set).
    """
    return _select(model, _value_infos(model), op_types)


# --------------------------------------------------------------------------- feeds


_ORT_DTYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int16)": np.int16,
    "tensor(int8)": np.int8,
    "tensor(uint64)": np.uint64,
    "tensor(uint32)": np.uint32,
    "tensor(uint16)": np.uint16,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


@dataclass(frozen=True)
class _InputSpec:
    name: str
    dtype: np.dtype | None
    shape: tuple[int | str | None, ...]

    def describe(self) -> str:
        dtype = self.dtype.name if self.dtype is not None else "?"
        dims = ", ".join("?" if d is None else str(d) for d in self.shape)
        return f"{dtype}[{dims}]"

    def accepts(self, value: np.ndarray) -> bool:
        if self.dtype is not None and value.dtype != self.dtype:
            return False
        if len(value.shape) != len(self.shape):
            return False
        return all(
            not isinstance(d, int) or d == s for d, s in zip(self.shape, value.shape, strict=True)
        )


def _input_specs(session: ort.InferenceSession) -> list[_InputSpec]:
    specs = []
    for arg in session.get_inputs():
        dtype = _ORT_DTYPES.get(arg.type)
        specs.append(_InputSpec(arg.name, np.dtype(dtype) if dtype else None, tuple(arg.shape)))
    return specs


def _check_feed(feed: Feed, specs: Sequence[_InputSpec], index: int, where: str) -> dict:
    if not isinstance(feed, Mapping):
        raise PassError(
            f"calibration sample {index} is a {type(feed).__name__}, expected a dict of "
            "input name -> numpy array",
            where=where,
        )
    known = {s.name for s in specs}
    for name in feed:
        if name not in known:
            raise PassError(
                f"calibration sample {index}: '{name}' is not an input of the model "
                f"(inputs: {', '.join(sorted(known))})",
                where=where,
            )
    checked = {}
    for spec in specs:
        if spec.name not in feed:
            raise PassError(
                f"calibration sample {index}: input '{spec.name}' is missing; "
                f"expected {spec.describe()}",
                where=where,
            )
        value = np.asarray(feed[spec.name])
        if not spec.accepts(value):
            got = f"{value.dtype.name}[{', '.join(map(str, value.shape))}]"
            raise PassError(
                f"calibration sample {index}: input '{spec.name}' is {got}, "
                f"expected {spec.describe()}",
                where=where,
            )
        if np.issubdtype(value.dtype, np.floating) and value.size:
            bad = ~np.isfinite(value) | (np.abs(value) >= SENTINEL)
            if bad.any():
                at = [int(i) for i in np.argwhere(bad)[0]]
                raise PassError(
                    f"calibration sample {index}: input '{spec.name}' holds "
                    f"{float(value[tuple(at)]):g} at {at} (NaN, Inf or |x| >= {SENTINEL:g}): no "
                    "range fits it (the model would stay float, or its range would leave real "
                    "values no resolution); fix or drop that sample",
                    where=where,
                )
        checked[spec.name] = value
    return checked


def _open(feeds: Feeds) -> Iterator[Feed]:
    return iter(feeds() if callable(feeds) else feeds)


def _stream(
    session: ort.InferenceSession, outputs: Sequence[str], feeds: Feeds, where: str
) -> Iterator[tuple[dict, list[np.ndarray]]]:
    """(checked feed, outputs) per sample; the caller drops both before asking for the next."""
    specs = _input_specs(session)
    it = _open(feeds)
    index = 0
    while True:
        feed = next(it, None)
        if feed is None:
            break
        checked = _check_feed(feed, specs, index, where)
        del feed
        try:
            values = session.run(list(outputs), checked)
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            raise PassError(
                f"onnxruntime failed on calibration sample {index}: {first}", where=where
            ) from None
        yield checked, values
        del checked, values
        index += 1
    if index == 0:
        raise PassError("no calibration samples: the feeds were empty", where=where)


# --------------------------------------------------------------------------- models


def _session(model: onnx.ModelProto, path: Path, weights_dir: Path | None, arena: bool = False):
    """Save `model` (graph only; external weights stay where they are) and open it on CPU.

    `arena`: onnxruntime's CPU memory arena on (the memory pattern stays off). For the
    minmax pass, whose reductions free each activation right after its producer: without
    the arena every activation is a fresh allocation whose pages the kernel zeroes on first
    touch. sam3-mid's 1008 px encoder, 4 samples: 7.4 CPU s per sample instead of 8.4 (a
    plain forward: 6.2-6.5), peak RSS 2.76 GB instead of 2.98 GB. The passes that return
    activations keep it off (an arena keeps what those outputs took).
    """
    save_model(model, path)
    folder = str(weights_dir.resolve()) if weights_dir is not None else None
    if sidecar_paths(path):
        folder = None

    def configure(options: ort.SessionOptions) -> None:
        if arena:
            options.enable_cpu_mem_arena = True
        if folder is not None:
            # The augmented graph is written elsewhere but references the original
            # sidecars: ORT resolves external data against this folder (symlinks are
            # refused by its "escapes model directory" check; a copy doubles the disk use).
            options.add_session_config_entry(_EXT_FOLDER_KEY, folder)

    return calibration_session(path, configure)


def _fresh_name(base: str, taken: set[str]) -> str:
    name, i = base, 0
    while name in taken:
        i += 1
        name = f"{base}_{i}"
    taken.add(name)
    return name


# Ops whose output holds exactly the values of their first input, rearranged: the output's
# min/max are the input's, so calibration reads them from the input's reductions instead of
# passing over the tensor again (sam3-mid's 1008 px encoder: 15 % of the reductions' time).
SAME_VALUES_OPS = frozenset(
    {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity",
     "DepthToSpace", "SpaceToDepth"}
)  # fmt: skip


def _value_sources(model: onnx.ModelProto) -> dict[str, str]:
    """{tensor: the tensor whose values it holds} through chains of SAME_VALUES_OPS."""
    direct = {
        n.output[0]: n.input[0]
        for n in model.graph.node
        if n.domain in ("", "ai.onnx") and n.op_type in SAME_VALUES_OPS and n.input and n.output
    }
    sources = {}
    for tensor in direct:
        root, seen = tensor, {tensor}
        while root in direct and direct[root] not in seen:
            root = direct[root]
            seen.add(root)
        sources[tensor] = root
    return sources


def _minmax_model(
    model: onnx.ModelProto,
    tensors: Sequence[str],
    infos: Mapping[str, onnx.ValueInfoProto],
    keep_outputs: bool = False,
) -> tuple[onnx.ModelProto, list[tuple[str, str]]]:
    """A copy with ReduceMin/ReduceMax(keepdims=1, all axes) outputs for each tensor, and
    each tensor's (min output, max output) names (shared by tensors holding the same values:
    see SAME_VALUES_OPS).

    Like `MinMaxCalibrater.augment_graph` without its Reshape (we flatten in numpy). Each
    tensor's reductions are placed right after the node that produces it (graph inputs':
    first): onnxruntime orders ready nodes by their index, so reductions appended at the
    end would run last and keep every activation of the model alive until then (on the
    full-size SAM 3 encoder, more than 24 GB); placed early they free it as a plain forward
    pass does. Reducing over all axes needs no `axes`, so the nodes are valid in every opset.
    """
    aug = onnx.ModelProto()
    aug.CopyFrom(model)
    taken = {n.name for n in aug.graph.node}
    taken |= {o for n in aug.graph.node for o in n.output}
    taken |= {t.name for t in aug.graph.input} | {t.name for t in aug.graph.initializer}
    kept = list(aug.graph.output) if keep_outputs else []
    del aug.graph.output[:]
    sources = _value_sources(model)
    reducers: dict[str, list[onnx.NodeProto]] = {}
    reduced: dict[str, tuple[str, str]] = {}
    pairs = []
    for tensor in tensors:
        reduce = sources.get(tensor, tensor)
        if reduce not in reduced:
            elem = _elem_type(infos.get(reduce)) or _elem_type(infos.get(tensor))
            pair = []
            for op in ("ReduceMin", "ReduceMax"):
                out = _fresh_name(f"calib{len(reduced)}_{op}", taken)
                node = helper.make_node(op, [reduce], [out], name=out, keepdims=1)
                reducers.setdefault(reduce, []).append(node)
                vi = helper.make_tensor_value_info(out, elem or TensorProto.FLOAT, None)
                aug.graph.output.append(vi)
                pair.append(out)
            reduced[reduce] = (pair[0], pair[1])
        pairs.append(reduced[reduce])
    original = list(aug.graph.node)
    ordered: list[onnx.NodeProto] = []
    for name in [i.name for i in aug.graph.input]:
        ordered += reducers.pop(name, [])
    for node in original:
        ordered.append(node)
        for out in node.output:
            ordered += reducers.pop(out, [])
    for rest in reducers.values():  # tensors no node produces (initializers): at the end
        ordered += rest
    del aug.graph.node[:]
    aug.graph.node.extend(ordered)
    aug.graph.output.extend(kept)  # after the reductions: outputs are asked for by name
    return aug, pairs


def _outputs_model(
    model: onnx.ModelProto, tensors: Sequence[str], infos: Mapping[str, onnx.ValueInfoProto]
) -> onnx.ModelProto:
    """A copy whose outputs are exactly `tensors` (graph inputs are read from the feeds)."""
    aug = onnx.ModelProto()
    aug.CopyFrom(model)
    del aug.graph.output[:]
    for tensor in tensors:
        elem = _elem_type(infos.get(tensor)) or TensorProto.FLOAT
        aug.graph.output.append(helper.make_tensor_value_info(tensor, elem, None))
    return aug


# --------------------------------------------------------------------------- histograms


class _Histogram:
    """Fixed-edge histogram: `bins` equal bins over [low, high] (of |x| when `absolute`).

    Edges never move (ORT's HistogramCollector widens and re-bins as data arrives; with
    the range known from pass 1 that is not needed). Values outside fall in the end bins.
    """

    def __init__(self, low: float, high: float, bins: int, absolute: bool) -> None:
        self.low, self.high, self.bins, self.absolute = low, high, bins, absolute
        self.counts = np.zeros(bins, dtype=np.int64)
        self._scale = bins / (high - low)

    def add(self, values: np.ndarray) -> None:
        flat = values.reshape(-1)
        for start in range(0, flat.size, _HIST_CHUNK):
            x = flat[start : start + _HIST_CHUNK].astype(np.float64)
            if self.absolute:
                np.abs(x, out=x)
            x -= self.low
            x *= self._scale
            np.floor(x, out=x)
            np.clip(x, 0, self.bins - 1, out=x)  # also the pass-1 max, which lands on `bins`
            x[np.isnan(x)] = 0
            self.counts += np.bincount(x.astype(np.int64), minlength=self.bins)

    def edge(self, index: int | np.ndarray) -> float | np.ndarray:
        return self.low + index * (self.high - self.low) / self.bins


def _nlogn(x: np.ndarray) -> np.ndarray:
    out = np.zeros_like(x, dtype=np.float64)
    pos = x > 0
    out[pos] = x[pos] * np.log(x[pos])
    return out


@lru_cache(maxsize=8)
def _chunk_bounds(num_bins: int, nq: int) -> tuple[np.ndarray, np.ndarray]:
    """Candidates i = nq..num_bins and, per candidate, the nq + 1 quantized-bin boundaries.

    Bin j < i of candidate i goes to quantized bin floor(j * nq / i), i.e. quantized bin c
    spans bins [ceil(c * i / nq), ceil((c + 1) * i / nq)): every quantized bin gets i/nq
    bins, as in TensorRT's calibrator (ORT instead gives the whole remainder to the last).
    """
    cand = np.arange(nq, num_bins + 1, dtype=np.int64)
    c = np.arange(nq + 1, dtype=np.int64)
    return cand, -((-c[None, :] * cand[:, None]) // nq)  # ceil division, (K, nq + 1)


@lru_cache(maxsize=8)
def _log_ints(n: int) -> np.ndarray:
    """log(k) for k = 0..n, with log(0) := 0 (only ever multiplied by a zero count)."""
    out = np.zeros(n + 1)
    out[1:] = np.log(np.arange(1, n + 1))
    return out


def entropy_threshold_bins(hist: np.ndarray, num_quantized_bins: int) -> int:
    """Number of leading bins of a |x| histogram minimising KL(P || Q) (TensorRT style).

    For each candidate i in [nq, num_bins]: P = hist[:i] with the outliers (hist[i:])
    added to its last bin; Q = hist[:i] merged into nq bins, each spread evenly over the
    nonzero bins it covers (as in ORT's get_entropy_threshold and TensorRT). Vectorized
    over all candidates with cumulative sums instead of a Python loop per candidate (ORT
    loops, which is what makes its entropy slow with 2048 bins):
        T·KL = sum_j p_j log p_j - T log T
               - [sum_c S_c log(S_c / nz_c) - K log K + O log(S_last / (nz_last K))]
    with T the total count, O the outliers, K = T - O the count inside [0, i), and S_c,
    nz_c the count and nonzero bins of quantized bin c. No smoothing (ORT smooths with an
    eps): a candidate whose last bin is empty while outliers remain has infinite
    divergence and is skipped. Ties go to the smallest threshold.
    """
    h = np.asarray(hist, dtype=np.float64)
    n = h.size
    nq = int(num_quantized_bins)
    total = float(h.sum())
    if n <= nq or total <= 0:
        return n
    cand, bounds = _chunk_bounds(n, nq)
    cs = np.concatenate(([0.0], np.cumsum(h)))
    nzc = np.concatenate(([0], np.cumsum(h > 0)))
    hlogh = _nlogn(h)
    cs_hlogh = np.concatenate(([0.0], np.cumsum(hlogh)))

    kept = cs[cand]
    outliers = total - kept
    last = h[cand - 1]
    p_log_p = cs_hlogh[cand] - hlogh[cand - 1] + _nlogn(last + outliers)

    s = np.diff(cs[bounds], axis=1)  # (K, nq) counts per quantized bin
    log_nz = _log_ints(n)[np.diff(nzc[bounds], axis=1)]
    log_s = np.log(np.maximum(s, 1.0))  # counts are integers: s log s = 0 when s = 0
    log_s -= log_nz
    q_log_q = np.einsum("ij,ij->i", s, log_s) - _nlogn(kept)
    ok = (kept > 0) & ((last > 0) | (outliers <= 0))
    with np.errstate(divide="ignore"):
        tail = np.where(ok, outliers * (log_s[:, -1] - np.log(kept)), 0.0)
    kl = p_log_p - total * math.log(total) - q_log_q - tail
    kl[~ok] = np.inf
    if not ok.any():
        return n
    return int(cand[int(np.argmin(kl))])


def _entropy_range(hist: _Histogram, lo: float, hi: float, nq: int) -> tuple[float, float]:
    i = entropy_threshold_bins(hist.counts, nq)
    t = float(hist.edge(i))
    return max(lo, -t), min(hi, t)


def _percentile_range(
    hist: _Histogram, lo: float, hi: float, percentile: float
) -> tuple[float, float]:
    """Bin edges enclosing the kept share: the upper edge of the bin where the CDF reaches
    the upper quantile, the lower edge of the bin where it reaches the lower one."""
    cdf = np.cumsum(hist.counts) / hist.counts.sum()
    if hist.absolute:  # symmetric: `percentile` % of |x| below the threshold
        idx = min(int(np.searchsorted(cdf, percentile / 100.0)), hist.bins - 1)
        t = float(hist.edge(idx + 1))
        return max(lo, -t), min(hi, t)
    cut = (100.0 - percentile) / 200.0  # both tails, as ORT's compute_percentile
    left = min(int(np.searchsorted(cdf, cut)), hist.bins - 1)
    right = min(int(np.searchsorted(cdf, 1.0 - cut)), hist.bins - 1)
    return max(lo, float(hist.edge(left))), min(hi, float(hist.edge(right + 1)))


def _distribution_range(hist: _Histogram, lo: float, hi: float) -> tuple[float, float]:
    """mean ± 4·std of the histogram (bin centres), clipped to the observed min/max.

    ORT's Distribution calibrater returns avg/std/hist for float8 scaling and leaves
    lowest/highest at the histogram ends; for integer ranges we cut at 4 standard
    deviations, which keeps > 99.99% of a Gaussian and trims far outliers.
    """
    counts = hist.counts.astype(np.float64)
    centres = hist.edge(np.arange(hist.bins) + 0.5)
    total = counts.sum()
    mean = float((counts * centres).sum() / total)
    var = float((counts * (centres - mean) ** 2).sum() / total)
    std = math.sqrt(max(var, 0.0))
    return max(lo, mean - DISTRIBUTION_STDS * std), min(hi, mean + DISTRIBUTION_STDS * std)


def _finish(lo: float, hi: float, symmetric: bool) -> tuple[float, float]:
    """Include 0 (ORT's compute_scale_zp does the same), then symmetrize if asked."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    if symmetric:
        a = max(-lo, hi)
        lo, hi = -a, a
    return float(lo), float(hi)


# --------------------------------------------------------------------------- calibrate


def calibrate(
    model_path: Path,
    feeds: Feeds,
    settings: CalibrationSettings,
    tensors: Sequence[str] | None = None,
    work_dir: Path | None = None,
    on_outputs: Callable[[dict, dict[str, np.ndarray]], None] | None = None,
    nonfinite: list[str] | None = None,
    sentinels: dict[str, dict[str, list[float]]] | None = None,
) -> dict[str, tuple[float, float]]:
    """{tensor: (low, high)} for the float activations of `model_path`, as python floats.

    `feeds` yields one input dict per sample and is consumed one sample at a time (never
    collected into a list). minmax needs one pass; the histogram methods need two, so for
    them `feeds` must be re-iterable: a zero-argument callable returning a fresh iterator
    (preferred: nothing is held between passes) or a re-iterable collection. A one-shot
    iterator/generator is refused for them. Both passes must see the same samples.

    Methods: minmax = observed min/max. entropy = KL-divergence threshold on a
    `num_bins` histogram of |x| with `num_quantized_bins` target bins (TensorRT style),
    clipped to the observed min/max. percentile = `percentile` % of the values kept
    (of |x| when symmetric, else half the rest cut from each tail). distribution = mean ±
    4·std of the histogram, clipped to the observed min/max. Every range includes 0 and
    is symmetric around 0 when `settings.symmetric`.

    `tensors` defaults to `tensors_to_calibrate(model)`. Augmented models are written to
    `work_dir` (a temporary directory when None). Bad feeds raise `PassError`.
    `on_outputs(feed, outputs)` receives the model's own outputs for each sample of the
    first pass, computed by the same forward pass (a downstream component's calibration
    then needs no second forward of this model).
    """
    settings.validate()
    model_path = Path(model_path)
    where = str(model_path)
    histogram = settings.method != "minmax"
    if histogram and not callable(feeds) and iter(feeds) is feeds:
        raise TypeError(
            f"calibration method {settings.method!r} reads the samples twice: pass a "
            "zero-argument callable returning a fresh iterator (or a re-iterable), "
            "not a one-shot iterator"
        )
    model = load_model(model_path, load_external_data=False)
    infos = _value_infos(model)
    names = list(tensors) if tensors is not None else _select(model, infos, None)
    for name in names:
        if _elem_type(infos.get(name)) not in CALIBRATED_ELEM_TYPES:
            raise PassError(
                f"cannot calibrate '{name}': not a float32/float16 tensor of the graph",
                where=where,
            )
    if not names:
        return {}
    weights_dir = model_path.parent if sidecar_paths(model_path) else None

    with tempfile.TemporaryDirectory(prefix="calibrate-") as tmp:
        out_dir = Path(work_dir) if work_dir is not None else Path(tmp)
        own = [o.name for o in model.graph.output] if on_outputs is not None else []
        aug, pairs = _minmax_model(model, names, infos, keep_outputs=bool(own))
        session = _session(aug, out_dir / "calibrate-minmax.onnx", weights_dir, arena=True)
        del aug
        lows = np.full(len(names), np.inf)
        highs = np.full(len(names), -np.inf)
        order = list(dict.fromkeys(o for pair in pairs for o in pair))  # each output once
        index = {o: k for k, o in enumerate(order)}
        low_at = [index[lo] for lo, _ in pairs]
        high_at = [index[hi] for _, hi in pairs]
        for feed, values in _stream(session, order + own, feeds, where):
            if own:
                assert on_outputs is not None
                on_outputs(feed, dict(zip(own, values[len(order) :], strict=True)))
            values = values[: len(order)]
            mins = np.array([np.min(v) if v.size else np.inf for v in values], np.float64)
            maxs = np.array([np.max(v) if v.size else -np.inf for v in values], np.float64)
            mins, maxs = mins[low_at], maxs[high_at]
            np.fmin(lows, mins, out=lows)
            np.fmax(highs, maxs, out=highs)
            del feed, values  # nothing of this sample is alive while the next is made
        del session
        seen = lows <= highs  # empty tensors are never seen: ReduceMin gives +inf
        for k, name in enumerate(names):
            if seen[k] and not (math.isfinite(lows[k]) and math.isfinite(highs[k])):
                if nonfinite is not None:
                    # e.g. an additive attention mask (-inf, or float32 min overflowing):
                    # no range fits it; it gets none and stays float
                    nonfinite.append(name)
                    continue
                raise PassError(
                    f"tensor '{name}' has non-finite values (min {lows[k]}, max "
                    f"{highs[k]}); leave it out of `tensors` or fix the model",
                    where=where,
                )
        skipped = set(nonfinite or ())
        observed = {
            name: (float(lows[k]), float(highs[k])) if seen[k] else (0.0, 0.0)
            for k, name in enumerate(names)
            if name not in skipped
        }
        names = [n for n in names if n not in skipped]
        if sentinels is not None:
            huge = [n for n in names if max(-observed[n][0], observed[n][1]) >= SENTINEL]
            if huge:
                inner = _inner_ranges(model, huge, infos, feeds, out_dir, weights_dir, where)
                for name in huge:
                    clamped = _clamp_sentinel(observed[name], inner[name])
                    sentinels[name] = {"observed": list(observed[name]), "range": list(clamped)}
                    observed[name] = clamped
        if histogram:
            observed = _histogram_ranges(
                model, names, infos, observed, feeds, settings, out_dir, weights_dir, where
            )
    return {name: _finish(lo, hi, settings.symmetric) for name, (lo, hi) in observed.items()}


# Values this large are sentinels, not data: an additive attention mask of float32's min
# (transformers' `(1 - mask) * finfo.min`), or a "minus infinity" written as -1e38. A range
# that covers them leaves the real values no resolution (a 16-bit step of 5e33).
SENTINEL = 1e30
# How far below (above) the other values a clamped sentinel lands: a masked attention score
# then weighs exp(-32) ~ 1e-14 in its softmax, as good as zero.
SENTINEL_DEPTH = 32.0


def _clamp_sentinel(
    observed: tuple[float, float], inner: tuple[float, float]
) -> tuple[float, float]:
    """The range of the values that are not sentinels, widened by SENTINEL_DEPTH on the side
    that had them: a sentinel then quantizes to the range's end."""
    lo, hi = observed
    in_lo, in_hi = inner
    if in_lo > in_hi:  # nothing but sentinels (and zeros)
        in_lo = in_hi = 0.0
    return (
        in_lo - SENTINEL_DEPTH if lo <= -SENTINEL else min(lo, in_lo),
        in_hi + SENTINEL_DEPTH if hi >= SENTINEL else max(hi, in_hi),
    )


def replace_sentinel_constants(
    model: onnx.ModelProto, sentinels: Mapping[str, Mapping[str, list[float]]]
) -> list[str]:
    """Constants holding sentinels (|v| >= SENTINEL) that make a clamped tensor take the
    clamped range's end instead; returns their names.

    The quantized model sees the clamped value anyway (QuantizeLinear saturates), so the
    float graph it is made from may as well compute it: a Where(mask, 0, -3.4e38) left
    with its float constant fails to finalize on HTP (the npu's EP) (a MEM_ALLOC error).
    """
    from onnx import numpy_helper

    inits = {t.name: t for t in model.graph.initializer}
    constants = {n.output[0]: n for n in model.graph.node if n.op_type == "Constant"}
    replaced: list[str] = []
    for node in model.graph.node:
        clamped = next((sentinels[o]["range"] for o in node.output if o in sentinels), None)
        if clamped is None:
            continue
        for name in node.input:
            if name in replaced:
                continue
            if name in inits:
                tensor = inits[name]
            elif name in constants:
                attr = next((a for a in constants[name].attribute if a.name == "value"), None)
                if attr is None:
                    continue
                tensor = attr.t
            else:
                continue
            value = numpy_helper.to_array(tensor)
            if value.dtype.kind != "f" or not (np.abs(value) >= SENTINEL).any():
                continue
            fixed = np.where(value <= -SENTINEL, clamped[0], value)
            fixed = np.where(fixed >= SENTINEL, clamped[1], fixed).astype(value.dtype)
            tensor.CopyFrom(numpy_helper.from_array(fixed, tensor.name))
            replaced.append(name)
    return replaced


def replace_unseen_sentinels(model: onnx.ModelProto) -> list[str]:
    """Finite sentinel constants (|v| >= SENTINEL) left after `replace_sentinel_constants`
    -> -SENTINEL_DEPTH / +SENTINEL_DEPTH; returns their names.

    Calibration never saw what they make (an attention mask calibrated on unpadded inputs
    only: `cond * 3.4e38 + -3.4e38` is 0 on every sample), so the ranges around them hold
    no sentinel and the quantized graph saturates those values at the range's end whatever
    the constant. Left as they are they become weights with a 16-bit step of 5e33, which
    HTP (the npu's EP) cannot finalize (a MEM_ALLOC error, Hugging Face BERT through the
    tool's own exporter with synthetic masks). Infinite constants are left alone.
    """
    from onnx import numpy_helper

    tensors = [*model.graph.initializer]
    tensors += [a.t for n in model.graph.node if n.op_type == "Constant"
                for a in n.attribute if a.name == "value"]  # fmt: skip
    replaced: list[str] = []
    for tensor in tensors:
        if tensor.data_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16):
            continue
        value = numpy_helper.to_array(tensor)
        huge = np.isfinite(value) & (np.abs(value) >= SENTINEL)
        if not huge.any():
            continue
        fixed = np.where(huge, np.sign(value) * SENTINEL_DEPTH, value).astype(value.dtype)
        tensor.CopyFrom(numpy_helper.from_array(fixed, tensor.name))
        replaced.append(tensor.name)
    return replaced


def _inner_ranges(
    model: onnx.ModelProto,
    names: Sequence[str],
    infos: Mapping[str, onnx.ValueInfoProto],
    feeds: Feeds,
    out_dir: Path,
    weights_dir: Path | None,
    where: str,
) -> dict[str, tuple[float, float]]:
    """Min and max of the values of `names` below SENTINEL in magnitude (a second pass over
    the samples, reading only these tensors). One-shot feeds cannot be read twice: the
    range is then the sentinel side's depth around 0."""
    out = {n: (math.inf, -math.inf) for n in names}
    if not callable(feeds) and iter(feeds) is feeds:
        return out
    graph_inputs = {i.name for i in model.graph.input}
    from_run = [n for n in names if n not in graph_inputs]
    aug = _outputs_model(model, from_run, infos) if from_run else model
    session = _session(aug, out_dir / "calibrate-sentinels.onnx", weights_dir)
    del aug
    requested = from_run or [session.get_outputs()[0].name]
    for feed, values in _stream(session, requested, feeds, where):
        arrays = {n: feed[n] for n in names if n in graph_inputs}
        arrays.update(zip(from_run, values, strict=False))
        for name, value in arrays.items():
            kept = value[np.abs(value) < SENTINEL]
            if kept.size:
                lo, hi = out[name]
                out[name] = (min(lo, float(kept.min())), max(hi, float(kept.max())))
        del feed, values, arrays
    return out


def _histogram_ranges(
    model: onnx.ModelProto,
    names: Sequence[str],
    infos: Mapping[str, onnx.ValueInfoProto],
    observed: Mapping[str, tuple[float, float]],
    feeds: Feeds,
    settings: CalibrationSettings,
    out_dir: Path,
    weights_dir: Path | None,
    where: str,
) -> dict[str, tuple[float, float]]:
    absolute = settings.method == "entropy" or (
        settings.method == "percentile" and settings.symmetric
    )
    hists: dict[str, _Histogram] = {}
    for name in names:
        lo, hi = observed[name]
        low, high = (0.0, max(-lo, hi)) if absolute else (lo, hi)
        if high > low:  # constant (or empty) tensors keep their min/max
            hists[name] = _Histogram(low, high, settings.num_bins, absolute)
    graph_inputs = {i.name for i in model.graph.input}
    from_feed = [n for n in hists if n in graph_inputs]
    from_run = [n for n in hists if n not in graph_inputs]
    # With nothing to read from the graph, run it for its first output anyway: the feeds
    # are then checked exactly as in pass 1.
    aug = _outputs_model(model, from_run, infos) if from_run else model
    session = _session(aug, out_dir / "calibrate-outputs.onnx", weights_dir)
    del aug
    requested = from_run or [session.get_outputs()[0].name]
    for feed, values in _stream(session, requested, feeds, where):
        for name in from_feed:
            hists[name].add(feed[name])
        for k, name in enumerate(from_run):
            value, values[k] = values[k], None  # free each output once it is binned
            hists[name].add(value)
            del value
        del feed, values
    del session

    ranges = dict(observed)
    for name, hist in hists.items():
        lo, hi = observed[name]
        if settings.method == "entropy":
            ranges[name] = _entropy_range(hist, lo, hi, settings.num_quantized_bins)
        elif settings.method == "percentile":
            ranges[name] = _percentile_range(hist, lo, hi, settings.percentile)
        else:
            ranges[name] = _distribution_range(hist, lo, hi)
    return ranges


# --------------------------------------------------------------------------- ORT cache


def write_ort_cache(ranges: Mapping[str, tuple[float, float]], path: Path) -> None:
    """Write `ranges` as an ORT calibration cache (MinMax TensorsData JSON).

    `quantize_static(model, out, calibration_data_reader=None, calibration_cache_path=path,
    calibrate_method=CalibrationMethod.MinMax)` then quantizes with exactly these ranges.
    """
    data = {
        name: TensorData(lowest=np.float32(lo), highest=np.float32(hi))
        for name, (lo, hi) in ranges.items()
    }
    save_tensors_data(TensorsData(CalibrationMethod.MinMax, data), Path(path))
