"""QNN HTP graph preparation of a QDQ graph whole and cut into parts (split compile): each
part's peak RSS and seconds, each in a fresh process under a memory cap.

    nice python experiments/split_prepare_memory.py QDQ.onnx --parts 2 3 [--cap-gb 4]

QDQ.onnx is a model as `quantize` writes it (e.g. experiments/htp_prepare_memory.py's
`global_504/out/.../model/model.onnx`, one SAM 3 global-attention block). The parts are the
ones `compile: {parts: N}` makes (onnx/split.py); the session is what verify and compile
create (fallback off). Prints one JSON line per row.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from experiments.htp_prepare_memory import _PREPARE, _python  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    import onnx

    from winml_recipes.onnx.footprint import largest_activation
    from winml_recipes.onnx.split import Splitter

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--parts", type=int, nargs="+", default=[2])
    parser.add_argument("--cap-gb", type=float, default=4.0)
    parser.add_argument("--work", type=Path, default=Path("/tmp/winml-bench-split"))
    args = parser.parse_args(argv)
    src, cap = args.model.resolve(), args.cap_gb * 1024
    args.work.mkdir(parents=True, exist_ok=True)
    row = {"what": "whole", "largest": largest_activation(src)}
    print(json.dumps({**row, **_python(_PREPARE, str(src), cap_mb=cap)}), flush=True)
    model = onnx.load(src)
    for n in args.parts:
        splitter = Splitter(model)
        for j, part in enumerate(splitter.parts(splitter.choose_cuts(n))):
            path = (args.work / f"{src.stem}_{n}_{j}.onnx").resolve()
            onnx.save(part.model, path)
            row = {"what": f"{n} parts: part {j}", "nodes": part.nodes,
                   "inputs": list(part.inputs), "largest": largest_activation(path)}  # fmt: skip
            print(json.dumps({**row, **_python(_PREPARE, str(path), cap_mb=cap)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
