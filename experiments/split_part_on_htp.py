"""One compiled part of a split compile on (emulated) HTP against the same uncompiled QDQ
part on the CPU EP: SQNR of its output (dequantized with its Q's scale), on one seeded
input.

    nice python experiments/split_part_on_htp.py model_ctx_part0.onnx parts/part0.onnx

model_ctx_part0.onnx is the part's own EPContext model (compile_parts writes it beside
model_ctx.onnx before stitching; copy it before the stitch removes it). The input is
`pixel_values` [1, 3, 1008, 1008] (SAM 3's encoder, part 0). Prints one JSON line.
"""

import json
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from winml_recipes.runtime.memory import peak_rss_mb
from winml_recipes.runtime.sessions import open_session

ctx, part = Path(sys.argv[1]), Path(sys.argv[2])
m = onnx.load(part, load_external_data=False)
out = m.graph.output[0].name
# the Q output's scale / zero point, to compare in float
q = next(n for n in m.graph.node if out in n.output)
inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
scale, zp = inits[q.input[1]].astype(np.float64), inits[q.input[2]].astype(np.float64)
rng = np.random.default_rng(0)
x = rng.normal(0, 1, (1, 3, 1008, 1008)).astype(np.float32).clip(-2.1, 2.6)
row = {}
t = time.perf_counter()
cpu = open_session(part, "cpu")
row["cpu_open_s"] = round(time.perf_counter() - t, 1)
t = time.perf_counter()
ref = next(iter(cpu.run({"pixel_values": x}, 0).values()))
row["cpu_run_s"] = round(time.perf_counter() - t, 1)
del cpu
t = time.perf_counter()
htp = open_session(ctx, "qnn-htp", fallback=False)
row["htp_load_s"] = round(time.perf_counter() - t, 1)
t = time.perf_counter()
got = next(iter(htp.run({"pixel_values": x}, 0).values()))
row["htp_run_s"] = round(time.perf_counter() - t, 1)
a = (ref.astype(np.float64) - zp) * scale
b = (got.astype(np.float64) - zp) * scale
row["sqnr_db"] = round(float(10 * np.log10((a**2).sum() / max(((a - b) ** 2).sum(), 1e-30))), 2)
row["max_abs"] = float(np.abs(a - b).max())
row["ref_max"] = float(np.abs(a).max())
row["equal_codes"] = float((ref == got).mean())
row["peak_rss_mb"] = peak_rss_mb()
print(json.dumps(row))
