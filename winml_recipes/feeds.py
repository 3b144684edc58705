"""Input feeds for calibration and verification, produced one sample at a time.

Sources: synthetic data drawn from the catalog I/O contract (seeded), `.npz` files, a
folder of images preprocessed as the contract says, a `datasets` split saved to disk
(hfdata.py), or the outputs of another
component's float model (`inputs_from`: the SAM 3 decoder sees real encoder embeddings).
Every source is a zero-argument callable returning a fresh iterator, so calibration can
stream over the samples twice without holding them.
"""

from __future__ import annotations

import contextlib
import glob
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from winml_recipes.datafiles import (
    folder_files,
    regular_file_inside,
    require_regular_file,
)
from winml_recipes.images import MAX_IMAGE_BYTES, preprocess_image
from winml_recipes.prompts import PROMPT_PLAN
from winml_recipes.sdk.contract import IOContract, TensorSpec, resolve_shape
from winml_recipes.sdk.errors import PassError, PlanError
from winml_recipes.sdk.types import DataRead, UpstreamComponent
from winml_recipes.speech import bundled_audio_input
from winml_recipes.untrusted import printable

Feed = dict[str, np.ndarray]
FeedFactory = Callable[[], Iterator[Feed]]
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff"}


def sample_seed(seed: int, index: int) -> int:
    """Independent seed per sample: sample i is the same whatever the sample count."""
    return seed * 1_000_003 + index


def synthetic(contract: IOContract, samples: int, seed: int) -> FeedFactory:
    """Seeded inputs from the contract; SAM-style prompt inputs get prompts placed as people
    prompt (prompts.synthetic_prompts), not uniform noise (boxes with x2 < x1, all padding)."""
    from winml_recipes.onnx.inputs import make_inputs
    from winml_recipes.prompts import synthetic_prompts

    specs = list(contract.inputs)
    frame = prompt_frame(contract)
    shapes = {s.name: resolve_shape(s, contract.dims) for s in specs}

    def gen() -> Iterator[Feed]:
        for i in range(samples):
            feed = make_inputs(specs, contract.dims, seed=sample_seed(seed, i), count=1)[0]
            if frame is not None:
                feed.update(synthetic_prompts(shapes, frame, i, seed))
            yield feed

    return gen


def prompt_frame(contract: IOContract) -> float | None:
    """The pixel frame of a SAM-style contract's prompts (input_points' range), else None."""
    from winml_recipes.prompts import POINTS, takes_prompts

    points = contract.input(POINTS)
    if points is None or not takes_prompts([s.name for s in contract.inputs]):
        return None
    if points.range is None or float(points.range[1]) <= 1.0:
        return None  # not pixel coordinates: leave them to the contract's range
    return float(points.range[1])


def _spec_text(spec: TensorSpec, dims: Mapping[str, int]) -> str:
    return f"{spec.dtype}{list(resolve_shape(spec, dims))}"


MAX_SAMPLES_PER_FILE = 4096
CALIBRATION_NPZ = "calibration.npz"  # the option an npz error names (verify's: verify.npz)
# Input values this large are not data (a float32 max written for "missing", an overflow):
# one of them stretches a calibration range until every real value rounds to zero.
ABSURD = 1e30


def npz_files(pattern: str, base: Path, what: str = CALIBRATION_NPZ) -> list[Path]:
    """The files a glob names; `what` (the option, e.g. `verify.npz`) heads every error."""
    full = pattern if Path(pattern).is_absolute() else str(base / pattern)
    files = sorted(Path(p) for p in glob.glob(full))
    if not files:
        raise PlanError(f"{what}: no file matches '{pattern}' (relative to {base})")
    for path in files:
        require_regular_file(path, what)
    return files


def npz_headers(
    path: Path, what: str = CALIBRATION_NPZ
) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Shape and dtype of every array in an .npz, read from the .npy headers only.

    Nothing is decompressed beyond the headers, so a small file declaring a huge array (or a
    pickled object array) is refused before any allocation.
    """
    import zipfile

    out: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                with archive.open(info) as member:
                    version = np.lib.format.read_magic(member)
                    read = (
                        np.lib.format.read_array_header_1_0
                        if version == (1, 0)
                        else np.lib.format.read_array_header_2_0
                    )
                    shape, _, dtype = read(member)
                if dtype.hasobject:
                    raise PlanError(
                        f"{what}: {path.name}: '{info.filename[:-4]}' is an object "
                        "array (pickled data is never loaded); save plain numeric arrays"
                    )
                declared = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
                if declared > info.file_size:
                    raise PlanError(
                        f"{what}: {path.name}: '{info.filename[:-4]}' declares "
                        f"{declared} bytes but holds {info.file_size}; the file is damaged"
                    )
                out[info.filename[:-4]] = (tuple(shape), dtype)
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
        raise PlanError(f"{what}: cannot read {path}: {exc}") from None
    return out


def check_npz(
    files: list[Path],
    contract: IOContract,
    what: str = CALIBRATION_NPZ,
    exact_dims: bool = False,
) -> int:
    """Validate every file against the contract; returns the number of samples available.

    `what` (the option, e.g. `verify.npz` or `--eval-data`) heads every error. With
    `exact_dims`, named dims must hold the contract's values too (a model whose shapes the
    build fixes runs at no other size)."""
    total = 0
    for path in files:
        headers = npz_headers(path, what)
        n = None
        for spec in contract.inputs:
            expected = _spec_text(spec, contract.dims)
            if spec.name not in headers:
                raise PlanError(
                    f"{what}: {path.name} has no input '{spec.name}' (expected {expected}; "
                    f"it has: {', '.join(headers) or 'nothing'})"
                )
            shape, dtype = headers[spec.name]
            want = resolve_shape(spec, contract.dims)
            if dtype != np.dtype(spec.dtype):
                raise PlanError(
                    f"{what}: {path.name}: input '{spec.name}' is {dtype}, expected {expected}"
                )
            fits = _exact if exact_dims else _matches
            loose = _matches(shape, want, spec) and not _too_big(shape, want)
            if loose and _batch_ambiguous(shape, want, spec):
                raise PlanError(
                    f"{what}: {path.name}: input '{spec.name}' has shape "
                    f"{list(shape)} where the catalog says {expected}"
                    f": one sample of {spec.shape[0]} {shape[0]}, or {shape[0]} samples? "
                    f"Stack samples on a new leading axis ({[shape[0], 1, *shape[1:]]}), "
                    f"or set dims {spec.shape[0]}: {shape[0]} to calibrate with that batch"
                )
            if fits(shape, want, spec) and not _too_big(shape, want):
                count = 1
            elif (
                len(shape) == len(want) + 1
                and fits(shape[1:], want, spec)
                and shape[0] <= MAX_SAMPLES_PER_FILE
                and not _too_big(shape[1:], want)
            ):
                count = shape[0]
            else:
                raise PlanError(
                    f"{what}: {path.name}: input '{spec.name}' has shape "
                    f"{list(shape)}, expected {expected} "
                    f"(optionally with a leading sample axis of at most "
                    f"{MAX_SAMPLES_PER_FILE})"
                )
            if n is not None and count != n:
                raise PlanError(f"{what}: {path.name}: inputs have different sample counts")
            n = count
        total += n or 0
    return total


def check_npz_values(files: list[Path], contract: IOContract, what: str = CALIBRATION_NPZ) -> None:
    """Refuse NaN, +-Inf and absurd magnitudes (|x| >= 1e30) in the float inputs of every
    file, naming the file, the input and the sample: calibration would drop such a tensor's
    range (the model stays float) or stretch it until real values round to zero, and
    verification would score noise. Read one array at a time (after check_npz)."""
    for path in files:
        with np.load(path, allow_pickle=False) as data:
            for spec in contract.inputs:
                if spec.name not in data.files:
                    continue
                array = data[spec.name]
                if not np.issubdtype(array.dtype, np.floating):
                    continue
                bad = ~np.isfinite(array) | (np.abs(array) >= ABSURD)
                if not bad.any():
                    continue
                stacked = array.ndim == len(spec.shape) + 1
                at = np.argwhere(bad)[0]
                value = float(array[tuple(at)])
                sample = f"sample {int(at[0])}" if stacked else "its one sample"
                count = int(bad.sum())
                raise PlanError(
                    f"{what}: {path.name}: input '{spec.name}', {sample}, holds {value:g}"
                    f" at {[int(i) for i in at]} ({count} such value{'s' * (count > 1)}: "
                    "NaN, Inf or |x| >= 1e30); fix or drop that sample before calibrating "
                    "or verifying"
                )


MAX_DYNAMIC_DIM_FACTOR = 64


def header_fits(shape: tuple[int, ...], want: tuple[int, ...], spec: TensorSpec) -> bool:
    """Whether an npz member's declared `shape` is one sample of `spec` (resolved to `want`)
    or at most MAX_SAMPLES_PER_FILE stacked on a leading axis, named dims within bounds:
    checked from the header, before the array is allocated (`run --npz`)."""
    if _matches(shape, want, spec) and not _too_big(shape, want):
        return True
    return (
        len(shape) == len(want) + 1
        and _matches(shape[1:], want, spec)
        and not _too_big(shape[1:], want)
        and shape[0] <= MAX_SAMPLES_PER_FILE
    )


def _too_big(got: tuple[int, ...], want: tuple[int, ...]) -> bool:
    """A dynamic dim may differ from the catalog's default, within reason (memory)."""
    return int(np.prod(got, dtype=np.int64)) > MAX_DYNAMIC_DIM_FACTOR * max(
        1, int(np.prod(want, dtype=np.int64))
    )


def _batch_ambiguous(got: tuple[int, ...], want: tuple[int, ...], spec: TensorSpec) -> bool:
    """A leading named dim valued 1 (a batch) that the array fills with more: it may be a
    stack of samples missing their batch axis as well as one bigger batch."""
    return bool(got) and isinstance(spec.shape[0], str) and want[0] == 1 and got[0] != 1


def _exact(got: tuple[int, ...], want: tuple[int, ...], spec: TensorSpec) -> bool:
    """Every dim at the contract's value (named dims at the value the build fixes)."""
    return tuple(got) == tuple(want)


def _matches(got: tuple[int, ...], want: tuple[int, ...], spec: TensorSpec) -> bool:
    """Static dims must match; named (dynamic) dims may take any value."""
    if len(got) != len(want):
        return False
    return all(isinstance(d, str) or g == w for g, w, d in zip(got, want, spec.shape, strict=True))


def from_npz(files: list[Path], contract: IOContract, samples: int, skip: int = 0) -> FeedFactory:
    """Samples from npz files in order, after the first `skip` (held-out data must not be
    the calibration samples)."""
    names = [s.name for s in contract.inputs]
    static = {s.name: len(resolve_shape(s, contract.dims)) for s in contract.inputs}

    def gen() -> Iterator[Feed]:
        produced = 0
        skipped = 0
        for path in files:
            with np.load(path, allow_pickle=False) as data:
                arrays = {n: data[n] for n in names}  # each array read once per file
            first = arrays[names[0]]
            stacked = first.ndim == static[names[0]] + 1
            count = first.shape[0] if stacked else 1
            for i in range(count):
                if skipped < skip:
                    skipped += 1
                    continue
                if produced >= samples:
                    return
                # np.asarray: a stacked scalar input (`sr` of a VAD) indexes to a numpy
                # scalar, which onnxruntime does not take
                yield {n: np.asarray(arrays[n][i] if stacked else arrays[n]) for n in names}
                produced += 1
            del arrays

    return gen


def image_files(folder: str, base: Path) -> list[Path]:
    path = Path(folder) if Path(folder).is_absolute() else base / folder
    if not path.is_dir():
        raise PlanError(f"calibration.images: folder not found: {path}")
    # a link out of the folder (`a.png -> /proc/self/environ`) is refused unopened; sizes
    # come from the listing, headers are read when an image is decoded
    files = folder_files(
        path, IMAGE_SUFFIXES, "calibration.images", MAX_IMAGE_BYTES, "use smaller images"
    )
    if not files:
        raise PlanError(f"calibration.images: no image files in {printable(path)}")
    return files


def from_images(
    files: list[Path], contract: IOContract, samples: int, seed: int, skip: int = 0
) -> FeedFactory:
    image_inputs = [s for s in contract.inputs if s.image is not None]
    if len(image_inputs) != 1:
        raise PlanError(
            "calibration.images: the catalog contract needs exactly one input with an 'image' "
            f"preprocessing block (found {len(image_inputs)})"
        )
    target = image_inputs[0]
    others = IOContract(
        tuple(s for s in contract.inputs if s is not target), contract.outputs, contract.dims
    )
    rest = synthetic(others, samples, seed)

    def gen() -> Iterator[Feed]:
        for path, extra in zip(files[skip : skip + samples], rest(), strict=False):
            # checked again when read: the folder may have changed since it was listed
            regular_file_inside(path.parent, path.name, "calibration.images")
            yield {target.name: preprocess_image(path, target), **extra}

    return gen


def from_upstream(
    up: UpstreamComponent,
    up_feeds: FeedFactory,
    contract: IOContract,
    samples: int,
    seed: int,
    per_upstream: int = 1,
    store: Path | None = None,
    for_calibration: bool = False,
) -> FeedFactory:
    """Run the upstream float model; its outputs feed the inputs of the same name.

    Each upstream output serves `per_upstream` consecutive samples (the other inputs, e.g.
    SAM 3's prompts, differ per sample): a full-size image encoder forward costs minutes,
    a prompt nothing. With a `store` folder, outputs are kept content-addressed (upstream
    model digest + input bytes), so no upstream input is ever run twice, across steps,
    targets and builds.
    """
    produced = {s.name for s in up.contract.outputs}
    fed = [s.name for s in contract.inputs if s.name in produced]
    if not fed:
        raise PlanError(
            f"inputs_from {up.name}: none of its outputs ({', '.join(sorted(produced))}) is an "
            f"input of this component ({', '.join(s.name for s in contract.inputs)})"
        )
    others = IOContract(
        tuple(s for s in contract.inputs if s.name not in fed), contract.outputs, contract.dims
    )
    rest = synthetic(others, samples, seed)
    model, digest = up.for_calibration() if for_calibration else (up.model, up.digest)
    return UpstreamFeeds(model, digest, up_feeds, rest, fed, per_upstream, store)


class UpstreamFeeds:
    """A feed factory over an upstream model's outputs; counts the forwards it ran.

    `computed` and `reused` (upstream outputs read from the store) cover every pass over
    the samples, so a step can report that no upstream input was run twice.
    """

    def __init__(
        self,
        model: Path,
        digest: str,
        up_feeds: FeedFactory,
        rest: FeedFactory,
        fed: list[str],
        per_upstream: int,
        store: Path | None,
    ) -> None:
        self.model, self.digest, self.store = model, digest, store
        self.up_feeds, self.rest, self.fed, self.per = up_feeds, rest, fed, per_upstream
        self.computed = 0
        self.reused = 0

    def __call__(self) -> Iterator[Feed]:
        outputs = ModelOutputs(self.model, self.digest, self.store)  # a session per pass
        upstream = self.up_feeds()
        outs: dict[str, np.ndarray] = {}
        for i, extra in enumerate(self.rest()):
            if i % self.per == 0:
                upstream_feed = next(upstream, None)
                if upstream_feed is None:
                    return
                outs, computed = outputs(upstream_feed, self.fed)
                self.computed += computed
                self.reused += not computed
            yield {**extra, **outs}


class ModelOutputs:
    """A float model's outputs per feed: read from the store when kept there, else
    computed (the session is made once, on first need) and kept (`keep`)."""

    def __init__(
        self, model: Path, digest: str | None, store: Path | None, keep: bool = True
    ) -> None:
        self.model, self.digest, self.store, self.keep = model, digest, store, keep
        self.session = None

    def __call__(
        self, feed: Feed, names: list[str] | None = None
    ) -> tuple[dict[str, np.ndarray], bool]:
        """Outputs `names` (None: all) for `feed`, and whether they were computed now."""
        stored = self.store is not None and bool(self.digest)
        if stored:
            kept = stored_outputs(self.store, self.digest, feed, names)
            if kept is not None:
                return kept, False
        if self.session is None:
            from winml_recipes.runtime.sessions import load_session

            self.session = load_session(self.model)
        out_names = [o.name for o in self.session.get_outputs()]
        values = dict(zip(out_names, self.session.run(None, feed), strict=True))
        if stored and self.keep:
            store_outputs(self.store, self.digest, feed, values)
        return (values if names is None else {n: values[n] for n in names}), True


def _output_key(digest: str, feed: Feed) -> str:
    import hashlib

    h = hashlib.sha256(digest.encode())
    for name in sorted(feed):
        arr = np.ascontiguousarray(feed[name])
        h.update(f"{name}:{arr.dtype.str}:{arr.shape}".encode())
        h.update(arr.tobytes())
    return h.hexdigest()


def _output_path(store: Path, digest: str, feed: Feed) -> Path:
    key = _output_key(digest, feed)
    return store / "upstream" / key[:2] / f"{key}.npz"


def stored_outputs(
    store: Path, digest: str, feed: Feed, names: Iterable[str] | None = None
) -> dict[str, np.ndarray] | None:
    """Outputs `names` (None: all) of the model with digest `digest` for `feed`, if kept."""
    try:
        with np.load(_output_path(store, digest, feed), allow_pickle=False) as data:
            wanted = list(data.files if names is None else names)
            if all(n in data.files for n in wanted):
                return {n: data[n] for n in wanted}
    except (OSError, ValueError):
        pass  # absent or damaged: computed again
    return None


def store_outputs(store: Path, digest: str, feed: Feed, outputs: Mapping[str, np.ndarray]) -> None:
    """Keep a model's outputs for `feed` by content (model digest + input bytes).

    A full-size image encoder forward costs minutes; whatever step runs it first (the
    encoder's own calibration or verification) leaves its outputs here for the next one
    (the decoder's calibration or verification), across targets and builds.
    """
    _store_npz(_output_path(store, digest, feed), dict(outputs))


def outputs_for(
    model: Path,
    digest: str | None,
    feeds: list[Feed],
    store: Path | None,
    keep: bool = True,
    on_sample: Callable[[int], None] | None = None,
    counts: dict[str, int] | None = None,
) -> list[dict[str, np.ndarray]]:
    """A float model's outputs for each feed, read from the store (and written, if `keep`);
    `counts` (when given) gets how many were `computed` and how many `reused`."""
    outputs = ModelOutputs(model, digest, store, keep)
    out = []
    for i, feed in enumerate(feeds):
        if on_sample is not None:
            on_sample(i)
        values, computed = outputs(feed)
        out.append(values)
        if counts is not None:
            key = "computed" if computed else "reused"
            counts[key] = counts.get(key, 0) + 1
    if on_sample is not None:
        on_sample(len(feeds))
    return out


def _store_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".npz", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def take(factory: FeedFactory, count: int) -> list[Feed]:
    out = []
    for feed in factory():
        out.append(feed)
        if len(out) >= count:
            break
    if not out:
        raise PassError("no input samples were produced")
    return out


def feeds_for(
    options: Mapping[str, Any] | None,
    contract: IOContract,
    base: Path,
    upstream: Mapping[str, UpstreamComponent],
    samples: int,
    seed: int,
    store: Path | None = None,
    for_calibration: bool = False,
    skip: int = 0,
    held_out: bool | None = None,
) -> FeedFactory:
    """The feed source described by calibration-style options (dataset, npz, images,
    inputs_from).

    `skip` leaves out the first samples of npz files, image folders and datasets (held-out data
    after the calibration samples); seeded sources differ by their seed instead.

    With `for_calibration`, an upstream component's inputs come from the float model its
    own calibration ran (whose outputs that calibration stored), else from its reference.

    Without data, a contract with one image input reads the bundled photographs: the
    held-out set where `held_out` (default: not `for_calibration`), else the calibration set.
    """
    if held_out is None:
        held_out = not for_calibration
    opts = dict(options or {})
    if opts.get("dataset"):
        from winml_recipes import hfdata

        split = hfdata.open_split(opts["dataset"], base)
        rows = hfdata.check_split(split, contract)
        if skip and rows <= skip:
            raise PlanError(
                f"calibration.dataset: {rows} rows, all used for calibration; held-out "
                f"scoring needs more (add rows beyond the first {skip}, or use another split)"
            )
        return lambda: hfdata.samples(split, contract, samples, skip)
    if opts.get("npz"):
        what = CALIBRATION_NPZ if for_calibration else "verify.npz"
        files = npz_files(opts["npz"], base, what)
        available = check_npz(files, contract, what)
        if skip and available <= skip:
            raise PlanError(
                f"{what}: {available} samples, all used for calibration; held-out "
                f"scoring needs more (add samples beyond the first {skip})"
            )
        return from_npz(files, contract, samples, skip)
    if opts.get("images"):
        images = image_files(opts["images"], base)
        if skip and len(images) <= skip:
            raise PlanError(
                f"calibration.images: {len(images)} images, all used for calibration; "
                f"held-out scoring needs more (add images beyond the first {skip})"
            )
        return from_images(images, contract, samples, seed, skip)
    if opts.get("inputs_from"):
        up = upstream[opts["inputs_from"]]
        if (up.calibration or {}).get("inputs_from"):
            raise PlanError(
                f"inputs_from {up.name}: its own calibration uses inputs_from too; chains of "
                "inputs_from are not supported"
            )
        per = int(opts.get("samples_per_upstream", 1))
        count = -(-samples // per)
        up_feeds = feeds_for(up.calibration, up.contract, base, {}, count, seed, held_out=held_out)
        return from_upstream(up, up_feeds, contract, samples, seed, per, store, for_calibration)
    if bundled_image_input(contract) is not None:
        from winml_recipes.bundled import bundled_images

        split = "heldout" if held_out else "calibration"
        return from_images(list(bundled_images(split)), contract, samples, seed, skip)
    if bundled_audio_input(contract) is not None:
        return _bundled_speech(contract, samples, seed, skip, held_out)
    return synthetic(contract, samples, seed)


def _bundled_speech(
    contract: IOContract, samples: int, seed: int, skip: int, held_out: bool
) -> FeedFactory:
    """The bundled spoken sentences (held-out or calibration clips) through the audio input's
    feature extractor; the other inputs seeded."""
    from winml_recipes.speech import bundled_speech, from_speech

    audio = bundled_audio_input(contract)
    files = list(bundled_speech("heldout" if held_out else "calibration"))
    others = IOContract(
        tuple(s for s in contract.inputs if s is not audio), contract.outputs, contract.dims
    )
    rest = synthetic(others, samples, seed)
    return lambda: from_speech(files, contract, rest, samples, skip)


def bundled_image_input(contract: IOContract) -> TensorSpec | None:
    """The one image input the bundled photographs feed when no data is given (None: the
    contract has no image input or several)."""
    images = [s for s in contract.inputs if s.image is not None]
    return images[0] if len(images) == 1 else None


def describe_source(options: Mapping[str, Any] | None, contract: IOContract, held_out: bool) -> str:
    """What a step's samples are: `npz: calib.npz`, `bundled photos (calibration)`, ..."""
    opts = dict(options or {})
    for key in ("npz", "images", "dataset"):
        if opts.get(key):
            return f"{key}: {opts[key]}"
    if opts.get("inputs_from"):
        prompts = f"; {PROMPT_PLAN}" if prompt_frame(contract) is not None else ""
        return f"inputs_from: {opts['inputs_from']}{prompts}"
    if bundled_image_input(contract) is not None:
        return f"bundled photos ({'heldout' if held_out else 'calibration'} set)"
    if bundled_audio_input(contract) is not None:
        return f"bundled speech ({'heldout' if held_out else 'calibration'} set)"
    if prompt_frame(contract) is not None:
        return f"synthetic (catalog I/O contract; {PROMPT_PLAN})"
    return "synthetic (catalog I/O contract)"


def data_digest(options: Mapping[str, Any] | None, base: Path) -> dict[str, str]:
    """Digests of the data files options point to (part of the cache key)."""
    from winml_recipes.onnx.io import file_sha256

    opts = dict(options or {})
    files: list[Path] = []
    if opts.get("dataset"):
        from winml_recipes.hfdata import open_split

        files = list(open_split(opts["dataset"], base).files)
    elif opts.get("npz"):
        files = npz_files(opts["npz"], base)
    elif opts.get("images"):
        files = image_files(opts["images"], base)
    return {os.path.relpath(p, base): file_sha256(p) for p in files}


def upstream_data_digest(
    options: Mapping[str, Any] | None, upstream: Mapping[str, UpstreamComponent], base: Path
) -> dict[str, Any]:
    """Data digests of these options and of the upstream component they draw inputs from."""
    from winml_recipes.bundled import bundle_digest

    opts = dict(options or {})
    # the bundled photographs feed image inputs that have no data of their own
    out: dict[str, Any] = {"own": data_digest(opts, base), "bundled": bundle_digest()}
    from winml_recipes.speech import bundle_digest as speech_digest

    out["bundled_speech"] = speech_digest()  # and the bundled speech feeds audio inputs
    source = opts.get("inputs_from")
    if source and source in upstream:
        out[source] = data_digest(upstream[source].calibration, base)
    return out


def sample_digests(read: DataRead, contract: IOContract, base: Path) -> list[str]:
    """A content digest per sample a step reads (its inputs' dtypes, shapes and bytes)."""
    import hashlib

    factory = feeds_for(dict(read.source), contract, base, {}, read.samples or 4096, 0,
                        skip=read.skip)  # fmt: skip
    out = []
    for feed in factory():
        h = hashlib.sha256()
        for name in sorted(feed):
            array = np.ascontiguousarray(feed[name])
            h.update(f"{name}|{array.dtype}|{array.shape}|".encode())
            h.update(array.tobytes())
        out.append(h.hexdigest())
    return out


def check_disjoint(
    reads: list[DataRead], contract: IOContract, base: Path, component: str, where: str
) -> None:
    """Refuse held-out samples that are also calibration samples (same content): quality
    measured on them says nothing about unseen data. `allow_overlap` lets them through."""
    calibration = [r for r in reads if r.role == "calibration"]
    held_out = [r for r in reads if r.role == "held_out" and not r.allow_overlap]
    if not calibration or not held_out:
        return
    seen = {d for r in calibration for d in sample_digests(r, contract, base)}
    for read in held_out:
        digests = sample_digests(read, contract, base)
        shared = sum(d in seen for d in digests)
        if shared:
            key = next(iter(read.source))
            raise PlanError(
                f"{component}: {shared} of {len(digests)} held-out samples ({key}: "
                f"{read.source[key]}) are calibration samples (same content); verify on "
                "other data (or skip the calibration ones), or set verify."
                "allow_calibration_overlap: true to use them anyway",
                where=where,
            )
