"""What the tiny RT-DETR lost at cpu/int8: tapped float activations and top-k agreement.

Builds the tiny RT-DETR (tests/vision_models.py; `--unconditioned`: without INNER_HEADS,
the stop-39 fixture) through `init` and `build --device cpu --precision int8`, then runs the
float model and the QDQ model on the bundled photos and prints JSON lines: each Concat
input's magnitude (the encoder's memory per level), each TopK input's spread (the anchor
scores), and how many of the top-k indices the QDQ model picks as float does.

    python experiments/rtdetr_int8_cause.py [--unconditioned] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests import vision_models

ARCH = "RTDetrForObjectDetection"


def _tapped(path: Path, names: list[str]) -> ort.InferenceSession:
    model = onnx.load(str(path))
    inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(model).graph.value_info}
    model.graph.output.extend(inferred[n] for n in names if n in inferred)
    return ort.InferenceSession(model.SerializeToString())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--unconditioned", action="store_true")
    parser.add_argument("--keep")
    args = parser.parse_args()
    if args.unconditioned:
        vision_models.INNER_HEADS.clear()
    root = Path(args.keep or tempfile.mkdtemp(prefix="rtdetr-int8-"))
    os.environ.setdefault("WINML_RECIPES_CACHE", str(root / "cache"))
    from winml_recipes import api
    from winml_recipes.sdk.errors import QualityGateError

    root.mkdir(parents=True, exist_ok=True)
    os.chdir(root)
    vision_models.save_tiny(ARCH, root / "model")
    init = [sys.executable, "-m", "winml_recipes", "init", "./model", "--name", "m"]
    subprocess.run(init, check=True, capture_output=True)
    try:
        api.build(root / "recipes" / "m.yaml", device="cpu", precision="int8",
                  output_root=root / "out")  # fmt: skip
    except QualityGateError as exc:
        print(json.dumps({"build": str(exc)[:300]}))
    build = next((root / "out" / "m").glob("cpu-int8*"))
    float_path = build / "float-reference" / "model" / "model.onnx"
    graph = onnx.load(str(float_path)).graph
    topk = [n for n in graph.node if n.op_type == "TopK"]
    concat = [i for n in graph.node if n.op_type == "Concat" and len(n.input) == 3
              for i in n.input]  # fmt: skip
    keys, picks = [n.input[0] for n in topk], [n.output[1] for n in topk]
    ref = _tapped(float_path, [*concat, *keys, *picks])
    qdq = _tapped(build / "model" / "model.onnx", picks)
    x = vision_models.photos((64, 64), {"do_rescale": True}).numpy()  # the fixture's size
    names = [o.name for o in ref.get_outputs()]
    agree = []
    for i in range(len(x)):
        got = dict(zip(names, ref.run(None, {"pixel_values": x[i : i + 1]}), strict=True))
        out = dict(zip([o.name for o in qdq.get_outputs()],
                       qdq.run(None, {"pixel_values": x[i : i + 1]}), strict=True))  # fmt: skip
        if i == 0:
            for n in (n for n in concat if got[n].ndim == 3):  # [1, tokens, channels]
                print(json.dumps({"concat_input": n, "abs_mean": float(np.abs(got[n]).mean())}))
            for n in keys:
                print(json.dumps({"topk_keys": n, "spread": float(np.ptp(got[n]))}))
        for p in picks:
            a, b = set(got[p].ravel()), set(out[p].ravel())
            agree.append(len(a & b) / len(a))
    print(json.dumps({"topk_agreement": round(float(np.mean(agree)), 3)}))


if __name__ == "__main__":
    main()
