"""QNN HTP graph preparation of growing prefixes of a transformer's QDQ graph, cut at block
boundaries: what grows with depth (peak RSS and seconds per prefix, each in a fresh process
under a memory cap).

    nice python experiments/htp_prefix_memory.py QDQ.onnx --blocks 2 4 8 [--cap-gb 5] [--parallel]

The prefix "after k blocks" is part 0 of the split `compile: {cut_after: [...]}` makes at
the k-th block boundary (onnx/split.py `block_boundaries`: the residual stream's one-tensor
cuts between transformer blocks), so it is exactly what split compilation would prepare.
Prints one JSON line per prefix.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from experiments.htp_prepare_memory import _PREPARE, _python  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    import onnx

    from winml_recipes.onnx.footprint import weight_bytes
    from winml_recipes.onnx.split import Splitter

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--blocks", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--cap-gb", type=float, nargs="+", default=[5.0],
                        help="one cap, or one per prefix")  # fmt: skip
    parser.add_argument("--parallel", action="store_true", help="prepare the prefixes at once")
    parser.add_argument("--work", type=Path, default=Path("/tmp/winml-bench-prefix"))
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    model = onnx.load(args.model)
    splitter = Splitter(model)
    bounds = splitter.block_boundaries()
    jobs = []
    for k in args.blocks:
        part = splitter.parts([bounds[k]])[0]
        path = (args.work / f"{args.model.stem}_blocks{k}.onnx").resolve()
        onnx.save(part.model, path)
        row = {"blocks": k, "ends_at": part.outputs, "nodes": len(part.model.graph.node),
               "core_nodes": part.nodes,
               "weights_mb": round(weight_bytes(part.model) / 2**20, 1)}  # fmt: skip
        jobs.append((row, path))
    del model, splitter
    caps = args.cap_gb * len(args.blocks) if len(args.cap_gb) == 1 else args.cap_gb

    def run(job: tuple[dict, Path], cap: float) -> dict:
        row, path = job
        return {**row, **_python(_PREPARE, str(path), cap_mb=cap * 1024)}

    with ThreadPoolExecutor(len(jobs) if args.parallel else 1) as pool:
        for row in pool.map(run, jobs, caps):
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
