"""The two quantizers the corpus compares, and the task metric of a candidate on QNN HTP.

- `tool`: `winml-recipes build --onnx MODEL --device npu --precision P --calibration-data
  calib.npz --eval-data heldout.npz` (and `--task T` where the model's task has a metric
  plugin, as its user would name it), in a child process;
- `ort`: onnxruntime's QNN recipe on the same data: inputs fixed to the data's shapes,
  `qnn_preprocess_model` where it works, `get_qnn_qdq_config` + `quantize`;
- `static`: plain onnxruntime `quantize_static` (QDQ, MinMax) on the same data;
- `init_build`: `init` on a save_pretrained folder, then `build` of its recipe;
- `measure`: the task metric against the float model on the held-out samples, on QNN HTP
  with CPU fallback off (and, when that fails, where the nodes would run with fallback).

Used by bench/corpus.py and tests/integration/test_corpus.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Where the tool under test is imported from (default: this checkout); the bench can point
# it at another checkout to measure that one on the same corpus.
TOOL_ROOT = Path(os.environ.get("WINML_RECIPES_TOOL_ROOT") or REPO)

PRECISIONS = ("w8a16", "uint8")
CELL_TIMEOUT = 1800


def first_line(text: str) -> str:
    """The line of a tool's output that says what failed (the last error-like line)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if "rror" in ln or "fail" in ln or "refused" in ln]
    return (errors or lines or ["no output"])[-1][:300]


class _Reader:
    """onnxruntime's CalibrationDataReader over the calibration npz."""

    def __init__(self, path: Path) -> None:
        import numpy as np

        with np.load(path) as data:
            arrays = {k: data[k] for k in data.files}
        count = next(iter(arrays.values())).shape[0]
        self.feeds = [{k: np.asarray(v[i]) for k, v in arrays.items()} for i in range(count)]
        self.it = iter(self.feeds)

    def get_next(self):
        return next(self.it, None)

    def rewind(self) -> None:
        self.it = iter(self.feeds)


class GateFailed(RuntimeError):
    """The build ran but a quality gate withheld the model (exit 3); `candidate` is the
    model the build kept as evidence, for inspection."""

    def __init__(self, message: str, candidate: Path) -> None:
        super().__init__(message)
        self.candidate = candidate


def tool(p, precision: str, work: Path) -> Path:
    """This tool's npu build of `p`, as a user runs it; raises with the failure's line
    (GateFailed, with the kept candidate, when a quality gate withheld the model)."""
    done = subprocess.run(
        [sys.executable, "-m", "winml_recipes", "build", "--onnx", str(p.model), "--device",
         "npu", "--precision", precision, "--calibration-data", str(p.calib),
         "--eval-data", str(p.heldout), "-o", str(work / "out"),
         *(["--task", p.entry.task] if p.entry.task else [])],
        cwd=TOOL_ROOT, capture_output=True, text=True, timeout=CELL_TIMEOUT,
        env={**os.environ, "WINML_RECIPES_CACHE": str(work / "cache")},
    )  # fmt: skip
    if done.returncode != 0:
        message = f"exit {done.returncode}: {first_line(done.stderr + done.stdout)}"
        kept = sorted((work / "out").glob(f"*/npu-{precision}.failed/*/model.onnx"))
        if done.returncode == 3 and kept:
            raise GateFailed(message, kept[0])
        raise RuntimeError(message)
    found = sorted((work / "out").glob(f"*/npu-{precision}/*/model.onnx"))
    if not found:
        raise RuntimeError("build succeeded but wrote no model.onnx")
    return found[0]


def _fixed(p, work: Path) -> Path:
    """The model with its inputs fixed to the data's shapes."""
    import onnx
    from onnxruntime.tools.onnx_model_utils import make_input_shape_fixed

    from tests.corpus import models

    proto = onnx.load(str(p.model))
    for name, value in models.heldout_feeds(p)[0].items():
        try:
            make_input_shape_fixed(proto.graph, name, list(value.shape))
        except ValueError:  # two anonymous dims share one name ('?'): set them by position
            (graph_input,) = [i for i in proto.graph.input if i.name == name]
            for dim, size in zip(graph_input.type.tensor_type.shape.dim, value.shape, strict=True):
                dim.Clear()
                dim.dim_value = size
    fixed = work / "fixed.onnx"
    onnx.save(proto, str(fixed))
    return fixed


def static(p, precision: str, work: Path) -> Path:
    """Plain `onnxruntime.quantization.quantize_static` (QDQ, MinMax, per tensor; QUInt8
    weights, QUInt8 activations for uint8, QUInt16 for w8a16) on the same data."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    act = QuantType.QUInt16 if precision == "w8a16" else QuantType.QUInt8
    out = work / "static.onnx"
    quantize_static(str(_fixed(p, work)), str(out), _Reader(p.calib),
                    quant_format=QuantFormat.QDQ, activation_type=act,
                    weight_type=QuantType.QUInt8)  # fmt: skip
    return out


def ort(p, precision: str, work: Path) -> Path:
    """onnxruntime's own QNN recipe for `p` on the same calibration data."""
    from onnxruntime.quantization import QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import (
        get_qnn_qdq_config,
        qnn_preprocess_model,
    )

    fixed = _fixed(p, work)
    pre = work / "preprocessed.onnx"
    try:
        if not qnn_preprocess_model(str(fixed), str(pre)):
            pre = fixed
    except Exception:  # e.g. TypeError on models with metadata_props (see FACTS)
        pre = fixed
    act = QuantType.QUInt16 if precision == "w8a16" else QuantType.QUInt8
    config = get_qnn_qdq_config(str(pre), _Reader(p.calib), activation_type=act,
                                weight_type=QuantType.QUInt8)  # fmt: skip
    out = work / "ort.onnx"
    quantize(str(pre), str(out), config)
    return out


def init_build(arch: str, precision: str, work: Path) -> dict:
    """`init` on the tiny model's save_pretrained folder, then `build` of the recipe it
    wrote for npu/PRECISION (synthetic data, as a user gets it): the verify step's worst
    output cosine on the target and its placement, or the failure's first line."""
    from tests.corpus import hf

    env = {**os.environ, "WINML_RECIPES_CACHE": str(work / "cache"), "PYTHONPATH": str(TOOL_ROOT)}
    run = lambda *a: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "winml_recipes", *map(str, a)], cwd=work, capture_output=True,
        text=True, timeout=CELL_TIMEOUT, env=env,
    )  # fmt: skip
    done = run("init", hf.saved(arch), "--name", arch)
    if done.returncode != 0:
        return {"error": f"init: {first_line(done.stderr + done.stdout)}"}
    recipe = work / "recipes" / f"{arch}.yaml"
    text, target = recipe.read_text(), f"- device: npu\n  precision: {precision}\n"
    if target not in text:  # init lists the presets' npu default only; a user adds the other
        recipe.write_text(text.replace("targets:\n", "targets:\n" + target, 1))  # as build says
    done = run("build", f"recipes/{arch}.yaml", "--device", "npu", "--precision", precision,
               "-o", work / "out", "--json")  # fmt: skip
    if done.returncode != 0:
        return {"error": f"exit {done.returncode}: {first_line(done.stderr)}"}
    manifest = json.loads(done.stdout)
    (component,) = manifest["components"].values()
    verify = next(s for s in component["steps"] if s["pass"] == "verify")
    if verify.get("status") != "ran":
        return {"error": f"verify {verify.get('status')}: {verify.get('reason', '')}"[:200]}
    m = verify["metrics"]
    cos = min(o["cosine"] for o in m["outputs"].values())
    return {"task": round(cos, 4), "ran_on": m["verified_on"], "placement": _placement(m),
            "real": _real_cosine(arch, work / "out" / arch / f"npu-{precision}")}  # fmt: skip


def _real_cosine(arch: str, folder: Path) -> float:
    """The init build's output cosine on real held-out samples (the user export's: speech
    log-mels, photographs, token sequences), HTP candidate vs the build's float reference."""
    import numpy as np

    from tests.corpus import hf, metrics
    from winml_recipes.runtime.sessions import open_session
    from winml_recipes.runtime.target import run_on_target

    _, _, heldout = hf.user_export(arch)
    with np.load(heldout) as data:
        arrays = {k: data[k] for k in data.files}
    reference = open_session(folder / "float-reference" / "model" / "model.onnx")
    names = [i.name for i in reference.session.get_inputs()]  # init's inputs, by name
    feeds = [{n: arrays[n][i] for n in names} for i in range(len(arrays[names[0]]))]
    want = [reference.run(f, i) for i, f in enumerate(feeds)]
    got = run_on_target(folder / "model" / "model.onnx", feeds, "npu").outputs
    return round(metrics.cosine(0)(want, got), 4)


def _placement(record: dict) -> str:
    nodes = record.get("placement", {}).get("nodes", {})
    return ", ".join(f"{ep.replace('ExecutionProvider', '')} {n}" for ep, n in nodes.items())


def measure(p, candidate: Path) -> dict:
    """Task metric on QNN HTP (fallback off), or the failure and where nodes would run."""
    from tests.corpus import models
    from winml_recipes.runtime.target import run_on_target

    feeds = models.heldout_feeds(p)
    reference = models.float_outputs(p, feeds)
    try:
        run = run_on_target(candidate, feeds, "npu")
    except Exception as exc:
        out = {"fails": first_line(getattr(exc, "message", str(exc)))}
        try:
            run = run_on_target(candidate, feeds, "npu", {"allow_cpu_fallback": True})
            out["placement"] = _placement(run.record) + " (fallback)"
            out["with_fallback"] = round(p.entry.metric(reference, run.outputs), 4)
        except Exception as again:
            out["placement"] = f"fails with fallback too: {first_line(str(again))[:80]}"
        return out
    return {"task": round(p.entry.metric(reference, run.outputs), 4), "ran_on": run.verified_on,
            "placement": _placement(run.record)}  # fmt: skip
