"""Writes tests/data/hf_split: a DatasetDict saved by the real `datasets` library.

The project reads saved splits with pyarrow alone (winml_recipes/hfdata.py), so `datasets`
is not installed for the tests; this fixture, written once by `datasets` 5.2.0
(`python tests/data/make_hf_split.py tests/data/hf_split` in a venv with datasets and
pillow), keeps the reader honest about the layout `save_to_disk` really writes.
"""

import io
import sys

import numpy as np
from datasets import Dataset, DatasetDict, Features, Image, List, Value
from PIL import Image as PILImage

rng = np.random.default_rng(3)


def rows(n: int) -> dict:
    images = []
    for _ in range(n):
        buf = io.BytesIO()
        PILImage.fromarray(rng.integers(0, 255, (6, 6, 3), dtype=np.uint8)).save(buf, "PNG")
        images.append({"bytes": buf.getvalue(), "path": None})
    x = rng.uniform(100, 200, (n, 8)).astype(np.float32).tolist()
    return {"x": x, "label": rng.integers(0, 3, n).tolist(), "image": images}


features = Features({"x": List(Value("float32")), "label": Value("int64"), "image": Image()})
splits = {
    name: Dataset.from_dict(rows(n), features=features) for name, n in [("train", 16), ("test", 4)]
}
DatasetDict(splits).save_to_disk(sys.argv[1])
