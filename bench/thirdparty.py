"""Ours against onnxruntime's own quantizers, on the real architectures the tests build.

For each model class (tests/realmodels.py: a BERT sentence embedder at opset 11 with its
attention mask, a CNN with ReLU6/HardSwish, a text recognizer at opset 12, a ResNet
classifier) and the same calibration (16 samples) and held-out data:

- ours: `winml-recipes build --onnx MODEL --device npu --precision w8a16
  --calibration-data calib.npz --eval-data heldout.npz` (no other flag);
- ort-a16w8: onnxruntime's recipe for QNN, as its documentation gives it: the dims fixed
  to the data's shape (`make_input_shape_fixed`), `qnn_preprocess_model`, then
  `get_qnn_qdq_config(activation_type=QUInt16, weight_type=QUInt8)` + `quantize`;
- ort-u8: `quantize_static(QDQ, QUInt8 activations and weights)`, MinMax, per-tensor.

Each candidate's task metric (embedding cosine, top-1 agreement, character agreement of
greedy-decoded lines) and output cosine / SQNR against the float model on the held-out
samples, on the CPU EP and on QNN HTP (no CPU fallback; "fails" with the EP's reason where
the graph does not load). Run: `python bench/thirdparty.py [--models bert,cnn] [--json F]`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests import realmodels  # noqa: E402

CANDIDATES = ("ours", "ort-a16w8", "ort-u8")


class _Reader:
    """onnxruntime's CalibrationDataReader over the calibration npz."""

    def __init__(self, path: Path) -> None:
        with np.load(path) as data:
            arrays = {k: data[k] for k in data.files}
        count = next(iter(arrays.values())).shape[0]
        self.feeds = iter([{k: v[i] for k, v in arrays.items()} for i in range(count)])

    def get_next(self):
        return next(self.feeds, None)

    def rewind(self) -> None:  # not needed: one pass
        pass


def _fixed(model: realmodels.RealModel, out: Path) -> Path:
    """The float model with its inputs fixed to one sample's shape (QNN needs static shapes)."""
    import onnx
    from onnxruntime.tools.onnx_model_utils import make_input_shape_fixed

    proto = onnx.load(str(model.model))
    sample = realmodels.heldout_feeds(model)[0]
    for name, value in sample.items():
        make_input_shape_fixed(proto.graph, name, list(value.shape))
    onnx.save(proto, str(out))
    return out


def ours(model: realmodels.RealModel, work: Path) -> tuple[Path, float]:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "winml_recipes", "build", "--onnx", str(model.model),
         "--device", "npu", "--precision", "w8a16", "--calibration-data", str(model.calib),
         "--eval-data", str(model.heldout), "-o", str(work / "out"), "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=1800,
        env={**os.environ, "WINML_RECIPES_CACHE": str(work / "cache")},
    )  # fmt: skip
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1])
    return work / "out" / "model" / "npu-w8a16" / "model" / "model.onnx", seconds


def ort_a16w8(model: realmodels.RealModel, work: Path) -> tuple[Path, float]:
    from onnxruntime.quantization import QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import (
        get_qnn_qdq_config,
        qnn_preprocess_model,
    )

    started = time.perf_counter()
    fixed = _fixed(model, work / "fixed.onnx")
    pre = work / "preprocessed.onnx"
    if not qnn_preprocess_model(str(fixed), str(pre)):
        pre = fixed
    config = get_qnn_qdq_config(
        str(pre), _Reader(model.calib),
        activation_type=QuantType.QUInt16, weight_type=QuantType.QUInt8,
    )  # fmt: skip
    out = work / "ort_a16w8.onnx"
    quantize(str(pre), str(out), config)
    return out, time.perf_counter() - started


def ort_u8(model: realmodels.RealModel, work: Path) -> tuple[Path, float]:
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    started = time.perf_counter()
    fixed = _fixed(model, work / "fixed-u8.onnx")
    out = work / "ort_u8.onnx"
    quantize_static(
        str(fixed), str(out), _Reader(model.calib), quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QUInt8, weight_type=QuantType.QUInt8,
    )  # fmt: skip
    return out, time.perf_counter() - started


QUANTIZERS = {"ours": ours, "ort-a16w8": ort_a16w8, "ort-u8": ort_u8}


def _measure(model: realmodels.RealModel, candidate: Path, device: str) -> dict:
    from winml_recipes.onnx.metrics import compare_runs
    from winml_recipes.runtime.target import run_on_target

    feeds = realmodels.heldout_feeds(model)
    reference = realmodels.float_outputs(model, feeds)
    try:
        run = run_on_target(candidate, feeds, device)
    except Exception as exc:  # the EP refuses or cannot finalize the graph
        message = getattr(exc, "message", str(exc))
        return {"fails": message.split(": ", 1)[-1][:160]}
    metrics = compare_runs(reference, run.outputs)
    return {
        "task": round(model.score(reference, run.outputs), 4),
        "cosine": round(min(m["cosine"] for m in metrics.values()), 5),
        "sqnr_db": round(min(m["sqnr_db"] for m in metrics.values()), 1),
        "ran_on": run.verified_on,
    }


def run(names: list[str]) -> list[dict]:
    rows = []
    for name in names:
        with tempfile.TemporaryDirectory(prefix=f"thirdparty-{name}-") as tmp:
            root = Path(tmp)
            model = realmodels.BUILDERS[name](root / "model")
            for cand in CANDIDATES:
                work = root / cand
                work.mkdir()
                row = {"model": name, "metric": model.metric, "candidate": cand}
                try:
                    path, seconds = QUANTIZERS[cand](model, work)
                except Exception as exc:
                    rows.append(row | {"error": str(exc).strip().splitlines()[-1][:160]})
                    print(_line(rows[-1]), flush=True)
                    continue
                row["seconds"] = round(seconds, 1)
                row["cpu"] = _measure(model, path, "cpu")
                row["htp"] = _measure(model, path, "npu")
                rows.append(row)
                print(_line(row), flush=True)
    return rows


def _cell(m: dict | None) -> str:
    if not m:
        return "-"
    if "fails" in m:
        return f"fails ({m['fails'][:50]})"
    where = "" if m["ran_on"] in ("cpu", "qnn-htp") else f" [{m['ran_on']}]"
    return f"{m['task']:.4f} / {m['cosine']:.4f} / {m['sqnr_db']:.1f} dB{where}"


def _line(row: dict) -> str:
    if "error" in row:
        return f"| {row['model']} | {row['candidate']} | error: {row['error']} | |"
    return f"| {row['model']} | {row['candidate']} | {_cell(row['cpu'])} | {_cell(row['htp'])} |"


HEADER = (
    "| model (task metric) | quantizer | CPU EP: task / cosine / SQNR "
    "| QNN HTP: task / cosine / SQNR |\n|---|---|---|---|"
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(realmodels.BUILDERS))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    names = [n for n in args.models.split(",") if n]
    print(HEADER, flush=True)
    rows = run(names)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
