"""Hugging Face `datasets` splits saved with `Dataset.save_to_disk`, read with pyarrow alone.

A saved split is a folder with `dataset_info.json` (the features), `state.json` (the data
files, in order) and `data-*.arrow` files (Arrow IPC streams); a `DatasetDict` folder has
`dataset_dict.json` and one such folder per split. The `datasets` library itself is not
used: it brings pandas, dill, multiprocess and xxhash (~270 MB installed with pyarrow) to
read what pyarrow reads alone, and nothing here may download or run code (no loading
scripts). pyarrow is the `datasets` extra: `pip install 'winml-recipes[datasets]'`.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from winml_recipes.datafiles import regular_file_inside
from winml_recipes.sdk.contract import IOContract, TensorSpec, resolve_shape
from winml_recipes.sdk.errors import PlanError

WHAT = "calibration.dataset"
MARKERS = ("dataset_info.json", "dataset_dict.json")
_SPLIT = re.compile(r"^[A-Za-z0-9_.-]+$")
_DATA_FILE = re.compile(r"^[A-Za-z0-9_.-]+\.arrow$")


@dataclass(frozen=True)
class SavedSplit:
    """One split on disk: its folder, its metadata files and its Arrow files in order."""

    spec: str
    folder: Path
    metadata: tuple[Path, ...]
    arrow_files: tuple[Path, ...]
    features: dict[str, Any]

    @property
    def files(self) -> tuple[Path, ...]:
        return (*self.metadata, *self.arrow_files)


def is_dataset_dir(path: Path) -> bool:
    """A folder written by `save_to_disk` (a Dataset or a DatasetDict)."""
    return path.is_dir() and any((path / m).is_file() for m in MARKERS)


def split_spec(spec: str, base: Path) -> tuple[Path, str | None]:
    """`PATH[:split]` relative to `base`: the folder and the split (None: none given).

    The split is the part after the last colon when it is a plain name and the part before
    is a folder, so a Windows drive (`C:\\data`) is never taken for a split.
    """
    path = Path(spec) if Path(spec).is_absolute() else base / spec
    head, sep, tail = spec.rpartition(":")
    if sep and head and _SPLIT.match(tail) and not path.is_dir():
        folder = Path(head) if Path(head).is_absolute() else base / head
        if folder.is_dir():
            return folder, tail
    return path, None


def open_split(spec: str, base: Path, what: str = WHAT) -> SavedSplit:
    """The saved split `spec` names, checked: every file regular and inside the folder."""
    folder, split = split_spec(spec, base)
    if not is_dataset_dir(folder):
        raise PlanError(
            f"{what}: {folder} is not a folder saved with datasets' save_to_disk (it has no "
            "dataset_info.json or dataset_dict.json)"
        )
    metadata: list[Path] = []
    if (folder / "dataset_dict.json").is_file():
        index = regular_file_inside(folder, "dataset_dict.json", what)
        listed = _json(index, what).get("splits")
        if not isinstance(listed, list):
            raise PlanError(f"{what}: {index} has no list of splits")
        splits = [str(s) for s in listed]
        metadata.append(index)
        if split is None or split not in splits:
            given = "no split was given" if split is None else f"it has no split '{split}'"
            raise PlanError(
                f"{what}: {folder} is a DatasetDict and {given}; name one as "
                f"{folder}:SPLIT with SPLIT one of: {', '.join(splits) or 'none'}"
            )
        if not _SPLIT.match(split):
            raise PlanError(f"{what}: {folder}: '{split}' is not a plain split name")
        if not (folder / split).resolve().is_relative_to(folder.resolve()):
            raise PlanError(f"{what}: {folder / split} points outside {folder}")
        folder = folder / split
    elif split is not None:
        raise PlanError(f"{what}: {folder} is a single split; remove ':{split}'")
    info = regular_file_inside(folder, "dataset_info.json", what)
    state = regular_file_inside(folder, "state.json", what)
    names = [str(f.get("filename", "")) for f in _json(state, what).get("_data_files", [])]
    if not names:
        raise PlanError(f"{what}: {state} lists no data files")
    arrows = []
    for name in names:
        if not _DATA_FILE.match(name):
            raise PlanError(f"{what}: {state} lists '{name}', not a plain .arrow file name")
        arrows.append(regular_file_inside(folder, name, what))
    features = _json(info, what).get("features") or {}
    return SavedSplit(spec, folder, (*metadata, info, state), tuple(arrows), features)


def _json(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PlanError(f"{what}: cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise PlanError(f"{what}: {path} is not a JSON object")
    return data


def _pyarrow(what: str):
    try:
        import pyarrow as pa
        import pyarrow.ipc
    except ImportError:
        raise PlanError(
            f"{what}: reading a saved datasets split needs pyarrow: "
            "pip install 'winml-recipes[datasets]'"
        ) from None
    return pa


def _batches(split: SavedSplit, what: str) -> Iterator[Any]:
    pa = _pyarrow(what)
    for path in split.arrow_files:
        try:
            with pa.memory_map(str(path)) as source:
                yield from pa.ipc.open_stream(source)
        except (pa.ArrowInvalid, OSError) as exc:
            raise PlanError(f"{what}: cannot read {path}: {exc}") from None


def columns(split: SavedSplit, what: str = WHAT) -> list[str]:
    pa = _pyarrow(what)
    path = split.arrow_files[0]
    try:
        with pa.memory_map(str(path)) as source:
            return list(pa.ipc.open_stream(source).schema.names)
    except (pa.ArrowInvalid, OSError) as exc:
        raise PlanError(f"{what}: cannot read {path}: {exc}") from None


def check_split(split: SavedSplit, contract: IOContract, what: str = WHAT) -> int:
    """Every input has a column (by name); returns the number of rows (one sample each)."""
    have = columns(split, what)
    for spec in contract.inputs:
        if spec.name not in have:
            raise PlanError(
                f"{what}: {split.spec} has no column '{spec.name}' for the model input of that "
                f"name; its columns: {', '.join(have) or 'none'}"
            )
    return sum(batch.num_rows for batch in _batches(split, what))


def samples(
    split: SavedSplit, contract: IOContract, count: int, skip: int = 0, what: str = WHAT
) -> Iterator[dict[str, np.ndarray]]:
    """Rows `skip` .. `skip + count` as feeds: each column converted to its input's dtype and
    shape (batch axis included); image columns preprocessed as the contract's input says."""
    index = 0
    produced = 0
    for batch in _batches(split, what):
        if index + batch.num_rows <= skip:
            index += batch.num_rows
            continue
        cols = {s.name: batch.column(s.name) for s in contract.inputs}
        for row in range(batch.num_rows):
            if index >= skip:
                if produced >= count:
                    return
                yield {
                    s.name: _value(cols[s.name][row], s, contract, split, index, what)
                    for s in contract.inputs
                }
                produced += 1
            index += 1


def _value(
    scalar: Any, spec: TensorSpec, contract: IOContract, split: SavedSplit, row: int, what: str
) -> np.ndarray:
    """One cell as the input's array. Lists are flattened and counted in Arrow before any
    copy, so a row of another size (or a huge one) is refused without materializing it."""
    import pyarrow as pa

    where = f"{what}: {split.spec} row {row} column '{spec.name}'"
    if not scalar.is_valid:
        raise PlanError(f"{where} is empty (null)")
    feature = split.features.get(spec.name) or {}
    if feature.get("_type") == "Image" or pa.types.is_struct(scalar.type):
        return _image(scalar.as_py(), spec, where)
    values = scalar.values if _is_list(scalar.type) else pa.array([scalar.as_py()], scalar.type)
    while _is_list(values.type):
        values = values.flatten()
    target = np.dtype(spec.dtype)
    kind = values.type
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)):
        raise PlanError(f"{where} holds {kind} values; the input needs {target}")
    if pa.types.is_floating(kind) and target.kind in "biu":
        raise PlanError(f"{where} holds floats; the input needs {target}")
    shape = resolve_shape(spec, contract.dims)
    size = int(np.prod(shape, dtype=np.int64))
    if len(values) != size:
        raise PlanError(
            f"{where} has {len(values)} values; input '{spec.name}' {spec.dtype}{list(shape)} "
            f"needs {size}"
        )
    if values.null_count:
        raise PlanError(f"{where} has {values.null_count} empty (null) values")
    return values.to_numpy(zero_copy_only=False).astype(target).reshape(shape)


def _is_list(kind: Any) -> bool:
    import pyarrow as pa

    return bool(
        pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)
    )


def _image(value: Any, spec: TensorSpec, where: str) -> np.ndarray:
    """An `Image` cell ({bytes, path}) through the catalog input's image preprocessing."""
    if spec.image is None:
        raise PlanError(
            f"{where} holds images but the catalog input '{spec.name}' has no 'image' "
            "preprocessing block"
        )
    data = value.get("bytes") if isinstance(value, dict) else None
    if not data:
        raise PlanError(f"{where}: the image is stored by path only; save it with its bytes")
    from winml_recipes.images import preprocess_image

    return preprocess_image(io.BytesIO(data), spec)
