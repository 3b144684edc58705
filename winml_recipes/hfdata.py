"""Hugging Face `datasets` splits saved with `Dataset.save_to_disk`, read with pyarrow alone.

A saved split is a folder with `dataset_info.json` (the features), `state.json` (the data
files, in order) and `data-*.arrow` files (Arrow IPC streams); a `DatasetDict` folder has
`dataset_dict.json` and one such folder per split. The `datasets` library itself is not
used: it brings pandas, dill, multiprocess and xxhash (~270 MB installed with pyarrow) to
read what pyarrow reads alone, and nothing here may download or run code (no loading
scripts). pyarrow is the `datasets` extra: `pip install 'winml-recipes[datasets]'`.

A split is data from outside: its JSON files are read bounded (untrusted.py) and checked field
by field, each Arrow file is listed once and bounded in size, every record batch is checked
by pyarrow (`validate()`) when read and fully (`validate(full=True)`: offsets, UTF-8) before
its cells are used, so lying offsets are an error, never a read out of bounds.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from winml_recipes.datafiles import regular_file_inside, require_size_at_most
from winml_recipes.images import MAX_IMAGE_BYTES
from winml_recipes.sdk.contract import IOContract, TensorSpec, resolve_shape
from winml_recipes.sdk.errors import PlanError
from winml_recipes.untrusted import UntrustedInputError, printable, read_json_bounded

WHAT = "calibration.dataset"
MARKERS = ("dataset_info.json", "dataset_dict.json")
_SPLIT = re.compile(r"^[A-Za-z0-9_.-]+$")
_DATA_FILE = re.compile(r"^[A-Za-z0-9_.-]+\.arrow$")
# save_to_disk writes 500 MB shards by default; a larger one was written by hand or lies.
MAX_ARROW_FILE_BYTES = 4 << 30
# 10,000 default shards are 5 TB: far more than calibration or verification reads.
MAX_DATA_FILES = 10_000


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
        if not isinstance(listed, list) or not all(isinstance(s, str) for s in listed):
            raise PlanError(f"{what}: {printable(index)}: 'splits' is not a list of names")
        splits = [printable(s) for s in listed]
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
    arrows = _data_files(folder, state, what)
    features = _features(info, what)
    return SavedSplit(spec, folder, (*metadata, info, state), arrows, features)


def _data_files(folder: Path, state: Path, what: str) -> tuple[Path, ...]:
    """The Arrow files `state.json` lists: plain names, each a file inside `folder`, each
    listed once (a file listed 20,000 times would be read 20,000 times), bounded in size."""
    listed = _json(state, what).get("_data_files")
    where = f"{what}: {printable(state)}: '_data_files'"
    if not isinstance(listed, list):
        raise PlanError(f'{where} is {_kind(listed)}, not a list of {{"filename": ...}}')
    if not listed:
        raise PlanError(f"{what}: {printable(state)} lists no data files")
    arrows: list[Path] = []
    seen: dict[tuple[int, int], str] = {}
    for i, entry in enumerate(listed):
        if i == MAX_DATA_FILES:  # after the duplicate check of the first ones
            raise PlanError(
                f"{where} lists {len(listed):,} files, more than the {MAX_DATA_FILES:,} this "
                "tool reads; save the split with larger shards"
            )
        name = entry.get("filename") if isinstance(entry, dict) else None
        if not isinstance(name, str):
            raise PlanError(f'{where}[{i}] is {_kind(entry)}, not {{"filename": NAME}}')
        if not _DATA_FILE.match(name):
            raise PlanError(
                f"{what}: {printable(state)} lists '{printable(name)}', not a plain .arrow "
                "file name"
            )
        path = regular_file_inside(folder, name, what)
        require_size_at_most(
            path, MAX_ARROW_FILE_BYTES, what, "save the split with smaller shards (max_shard_size)"
        )
        st = os.stat(path)  # (device, inode): the same file under two names is a duplicate too
        key = (st.st_dev, st.st_ino)
        if key in seen:
            raise PlanError(
                f"{where}[{i}] lists {name}, the file already listed as {seen[key]}; "
                "each data file may be listed once"
            )
        seen[key] = name
        arrows.append(path)
    return tuple(arrows)


def _features(info: Path, what: str) -> dict[str, Any]:
    """`dataset_info.json`'s features: an object of column name -> feature (object or list)."""
    features = _json(info, what).get("features")
    if features is None:
        return {}
    where = f"{what}: {printable(info)}: 'features'"
    if not isinstance(features, dict):
        raise PlanError(f"{where} is {_kind(features)}, not an object of column features")
    for name, feature in features.items():
        if not isinstance(feature, (dict, list)):
            raise PlanError(f"{where}.{printable(name)} is {_kind(feature)}, not a feature object")
    return features


def _json(path: Path, what: str) -> dict[str, Any]:
    try:
        return read_json_bounded(path, expect=dict)
    except UntrustedInputError as exc:
        raise PlanError(f"{what}: {exc}") from None


def _kind(value: Any) -> str:
    """What a JSON value is, for errors (`a list`, `a string`, `null`)."""
    if value is None:
        return "null"
    kind = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    return kind.get(type(value), "a number")


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


def _batches(split: SavedSplit, what: str) -> Iterator[tuple[Path, int, Any]]:
    """(file, index in the file, record batch) for every batch, in order; each batch's
    structure (buffer sizes against its lengths) checked by pyarrow before it is returned."""
    pa = _pyarrow(what)
    for path in split.arrow_files:
        try:
            with pa.memory_map(str(path)) as source:
                for index, batch in enumerate(pa.ipc.open_stream(source)):
                    try:
                        batch.validate()
                    except pa.ArrowException as exc:
                        raise PlanError(
                            f"{what}: {printable(path)} record batch {index} is corrupt "
                            f"({_arrow_error(exc)}); write the split again with save_to_disk"
                        ) from None
                    yield path, index, batch
        except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
            raise PlanError(f"{what}: cannot read {printable(path)}: {_arrow_error(exc)}") from None


def _checked(batch: Any, names: list[str], path: Path, index: int, what: str) -> Any:
    """The columns `names` of `batch`, each validated in full (offsets within their buffers,
    list offsets within the child array, UTF-8) before any cell is read."""
    pa = _pyarrow(what)
    for name in names:
        try:
            batch.column(name).validate(full=True)
        except pa.ArrowException as exc:
            raise PlanError(
                f"{what}: {printable(path)} record batch {index} column '{printable(name)}' is "
                f"corrupt ({_arrow_error(exc)}); write the split again with save_to_disk"
            ) from None
    return batch


def _arrow_error(exc: Exception) -> str:
    """pyarrow's message on one line, bounded (it may quote file content)."""
    return printable(" ".join(str(exc).split()))[:300]


def columns(split: SavedSplit, what: str = WHAT) -> list[str]:
    pa = _pyarrow(what)
    path = split.arrow_files[0]
    try:
        with pa.memory_map(str(path)) as source:
            return list(pa.ipc.open_stream(source).schema.names)
    except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
        raise PlanError(f"{what}: cannot read {printable(path)}: {_arrow_error(exc)}") from None


def check_split(split: SavedSplit, contract: IOContract, what: str = WHAT) -> int:
    """Every input has a column (by name); returns the number of rows (one sample each)."""
    have = columns(split, what)
    for spec in contract.inputs:
        if spec.name not in have:
            raise PlanError(
                f"{what}: {printable(split.spec)} has no column '{spec.name}' for the model "
                f"input of that name; its columns: {printable(', '.join(have)) or 'none'}"
            )
    return sum(batch.num_rows for _, _, batch in _batches(split, what))


def samples(
    split: SavedSplit, contract: IOContract, count: int, skip: int = 0, what: str = WHAT
) -> Iterator[dict[str, np.ndarray]]:
    """Rows `skip` .. `skip + count` as feeds: each column converted to its input's dtype and
    shape (batch axis included); image columns preprocessed as the contract's input says."""
    index = 0
    produced = 0
    names = [s.name for s in contract.inputs]
    for path, number, batch in _batches(split, what):
        if index + batch.num_rows <= skip:
            index += batch.num_rows
            continue
        if produced >= count:
            return
        part = _checked(batch, names, path, number, what)
        cols = {name: part.column(name) for name in names}
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

    where = f"{what}: {printable(split.spec)} row {row} column '{spec.name}'"
    if not scalar.is_valid:
        raise PlanError(f"{where} is empty (null)")
    feature = split.features.get(spec.name)
    is_image = isinstance(feature, dict) and feature.get("_type") == "Image"
    if is_image or pa.types.is_struct(scalar.type):
        return _image(scalar, spec, where)
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


def _image(scalar: Any, spec: TensorSpec, where: str) -> np.ndarray:
    """An `Image` cell ({bytes, path}) through the catalog input's image preprocessing; its
    byte count is read from the (validated) offsets and bounded before anything is copied."""
    import pyarrow as pa

    if spec.image is None:
        raise PlanError(
            f"{where} holds images but the catalog input '{spec.name}' has no 'image' "
            "preprocessing block"
        )
    kind = scalar.type
    if not pa.types.is_struct(kind) or kind.get_field_index("bytes") < 0:
        raise PlanError(f"{where} is {kind}, not an Image column ({{bytes, path}})")
    cell = scalar["bytes"]
    if not (pa.types.is_binary(cell.type) or pa.types.is_large_binary(cell.type)):
        raise PlanError(f"{where}: the image bytes are {cell.type}, not binary")
    if not cell.is_valid or cell.as_buffer().size == 0:
        raise PlanError(f"{where}: the image is stored by path only; save it with its bytes")
    size = cell.as_buffer().size
    if size > MAX_IMAGE_BYTES:
        raise PlanError(
            f"{where}: an image of {size:,} bytes, more than the {MAX_IMAGE_BYTES:,} this tool "
            "decodes; store smaller images"
        )
    from winml_recipes.images import preprocess_image

    return preprocess_image(io.BytesIO(cell.as_buffer().to_pybytes()), spec, where)
