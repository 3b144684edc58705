"""QNN HTP graph preparation of ONE SAM 3 global-attention ViT block: peak memory and time
against the image side (the cause of the 1008 px encoder's > 24 GB, measured not assumed).

Per side S (tokens = (S/14)^2): the block (transformers' `Sam3ViTLayer`, the full-size
widths: hidden 1024, 16 heads, MLP 4736; seeded random weights, window 0 = global
attention) is exported with `torch.onnx.export(dynamo=True)` at input [1, S/14, S/14, 1024]
and built by this tool for npu/w8a16 (normalize, fix_shapes, prepare without the EP stage,
quantize on 1 seeded sample). Then, in a fresh process under a memory cap, a QNN HTP
session is created on the QDQ model with CPU fallback off (what `verify`/`compile` do):
its wall time and the process's peak RSS are what the table shows, beside the largest
activation of the graph. `--chunk ELEMENTS` first applies the QNN plugin's query-chunked
attention rewrite with that bound (score tensor elements per chunk) to the float block.

    nice python experiments/htp_prepare_memory.py --sides 336 504 672 --cap-gb 16 [--chunk N]
    nice python experiments/htp_prepare_memory.py --part mid --sides 1008   # this tool's export
    nice python experiments/htp_prepare_memory.py --bisect QDQ.onnx --cap-gb 4

A side whose preparation crosses the cap is stopped and reported as such (the cap is a
watchdog on the process's RSS, plus RLIMIT_AS where the OS has it, so the machine is never
pushed into swap or the OOM killer). One measurement at a time: they are memory-bound.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.capped import capped_python as _python  # noqa: E402
from tests.sam3_blocks import PARTS, PATCH, export_block  # noqa: E402

# Runs in the measured process: one HTP session, fallback off; prints seconds and peak.
_PREPARE = """
import json, sys, time
from winml_recipes.runtime.memory import peak_rss_mb
from winml_recipes.runtime.sessions import open_session
started = time.perf_counter()
error = None
try:
    open_session(sys.argv[1], "qnn-htp", fallback=False)
except Exception as exc:
    error = " ".join(str(exc).split())[:300]
print(json.dumps({"seconds": round(time.perf_counter() - started, 1),
                  "peak_rss_mb": peak_rss_mb(), "error": error}))
"""


def _chunk(src: Path, out: Path, bound: int) -> dict:
    """The QNN plugin's query-chunked attention rewrite at `bound`, on the float block."""
    import onnx_ir as ir

    from winml_recipes.eps.qnn.rules.attention import ChunkedAttentionPass
    from winml_recipes.graph.log import RewriteLog

    model = ir.load(src)
    log = RewriteLog()
    ChunkedAttentionPass(log, bound)(model)
    ir.save(model, out, external_data=f"{out.name}.data")
    return log.to_metrics()


def _quantize(src: Path, work: Path, shapes: dict | None = None, ep: bool = False) -> Path:
    """npu/w8a16 QDQ of `src` by this tool (1 sample; the prepare stages before the EP's,
    and the qnn-htp plugin's rewrites too with `ep`, as a build's defaults run them)."""
    import yaml

    from winml_recipes import api
    from winml_recipes.authoring import write_adhoc_project

    recipe, _ = write_adhoc_project(src, work / "project", "npu", "w8a16", shapes or {})
    body = yaml.safe_load(recipe.read_text())
    body["steps"] = [
        "normalize",
        "fix_shapes",
        {
            "prepare": {
                "stages": ["fold", "gathernd", "recurrent", *(["ep"] if ep else [])],
                "check_samples": 0,
            }
        },
        {"quantize": {"calibration": {"samples": 1}}},
    ]
    recipe.write_text(yaml.safe_dump(body, sort_keys=False))
    result = api.build(recipe, device="npu", precision="w8a16", output_root=work / "out",
                       catalog_dir=work / "project" / "catalog",
                       cache_dir=work / "cache")  # fmt: skip
    return Path(result.models["model"])


def _sizes(path: Path) -> dict:
    """The QDQ graph's largest activation, all activations' elements and its node count."""
    import onnx

    from winml_recipes.onnx.footprint import activation_elements, largest_activation

    name, elements = largest_activation(path)
    nodes = len(onnx.load(path, load_external_data=False).graph.node)
    return {"largest_tensor": name, "largest_elements": elements,
            "activation_elements": activation_elements(path), "nodes": nodes}  # fmt: skip


def measure(
    side: int, part: str, work: Path, cap_mb: float, chunk: int | None, ep: bool = False
) -> dict:
    tag = f"{part}_{side}" + (f"-chunk{chunk}" if chunk else "") + ("-ep" if ep else "")
    folder = work / tag
    folder.mkdir(parents=True, exist_ok=True)
    float_model = work / f"{part}_{side}.onnx"
    if not float_model.is_file():
        export_block(side, part, float_model)
    row: dict = {"part": part, "side": side, "tokens": (side // PATCH) ** 2,
                 "chunk_bound": chunk}  # fmt: skip
    src = float_model
    if chunk:
        src = folder / "chunked.onnx"
        row["rewrites"] = _chunk(float_model, src, chunk)
    g = side // PATCH
    shapes = {"mid": {"pixel_values": (1, 3, side, side)},
              "mlp4d": {"x": (1, g, g, 1024)}}.get(part)  # fmt: skip
    qdq = _quantize(src, folder, shapes, ep)
    row["ep_stage"] = ep
    row.update(_sizes(qdq))
    row["prepare"] = _python(_PREPARE, str(qdq), cap_mb=cap_mb)
    return row


def bisect(model: Path, cap_mb: float) -> dict:
    """The shortest prefix of a QDQ graph (cut at an activation's DequantizeLinear) whose
    HTP preparation passes `cap_mb`, by binary search (the whole graph is assumed to)."""
    import onnx
    import onnx.utils

    proto = onnx.load(model, load_external_data=False)
    nodes, inits = proto.graph.node, {t.name for t in proto.graph.initializer}
    cuts = [i for i, n in enumerate(nodes)
            if n.op_type == "DequantizeLinear" and n.input[0] not in inits]  # fmt: skip
    prefix = model.parent / "prefix.onnx"

    def grows(i: int) -> bool:
        onnx.utils.extract_model(str(model), str(prefix), [proto.graph.input[0].name],
                                 [nodes[i].output[0]])  # fmt: skip
        row = _python(_PREPARE, str(prefix), cap_mb=cap_mb)
        print(json.dumps({"prefix_ends_at": nodes[i].name, **row}), flush=True)
        return "stopped" in row

    lo, hi = 0, len(cuts) - 1
    if grows(cuts[lo]):
        return {"first_growing": nodes[cuts[lo]].name}
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if grows(cuts[mid]) else (mid, hi)
    return {"last_fine": nodes[cuts[lo]].name, "first_growing": nodes[cuts[hi]].name}


def main(argv: list[str] | None = None) -> int:
    # No report.html: its picture section runs the built model on the target in this
    # process (an HTP preparation of the whole graph, unmeasured and uncapped: sam3-mid's
    # encoder passed 10 GB there), and its per-layer plot compares every layer at full size.
    import winml_recipes.engine.run as engine_run

    engine_run._write_report = lambda *args, **kwargs: None
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sides", type=int, nargs="+", default=[336, 504, 672])
    parser.add_argument(
        "--part",
        choices=PARTS,
        default="global",
        help="global / window: one ViT block; encoder2: sam3-mid's encoder",
    )
    parser.add_argument("--cap-gb", type=float, default=16.0)
    parser.add_argument("--chunk", type=int, default=None, help="score elements per chunk")
    parser.add_argument(
        "--ep",
        action="store_true",
        help="prepare runs its ep stage too (the qnn-htp plugin's rewrites, as builds do)",
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/winml-bench-htp-prepare"))
    parser.add_argument(
        "--bisect",
        type=Path,
        default=None,
        help="a QDQ model: find the prefix whose preparation passes --cap-gb",
    )
    args = parser.parse_args(argv)
    if args.bisect:
        print(json.dumps(bisect(args.bisect, args.cap_gb * 1024)))
        return 0
    rows = []
    for side in args.sides:
        row = measure(side, args.part, args.work, args.cap_gb * 1024, args.chunk, args.ep)
        print(json.dumps(row), flush=True)
        rows.append(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
