"""Which EPContext nodes of a stitched model_ctx.onnx load together on QNN HTP: writes a
model holding the chosen nodes (wired by the tensors between them) and loads it with CPU
fallback off in a fresh process, per subset. How the 32-layer encoder's load limit (about
375 MB of context binaries per process) was found.

    nice python experiments/epcontext_subsets.py model_ctx.onnx "[[0,1,2,3,4],[1,3,5]]"
"""

import json
import subprocess
import sys
from pathlib import Path

import onnx
from onnx import helper

src = Path(sys.argv[1])
spans = json.loads(sys.argv[2])
m = onnx.load(src)
types = {v.name: v for v in [*m.graph.input, *m.graph.output, *m.graph.value_info]}
for idx in spans:
    nodes = [m.graph.node[i] for i in idx]
    made = {o for n in nodes for o in n.output}
    ins = [x for n in nodes for x in n.input if x not in made]
    later = {x for i, n in enumerate(m.graph.node) if i not in idx for x in n.input} | {
        o.name for o in m.graph.output
    }
    outs = [o for o in made if o in later]
    g = helper.make_graph(
        nodes,
        "sub",
        [types[x] for x in dict.fromkeys(ins)],
        [types[x] for x in outs],
        value_info=[types[x] for x in made if x not in outs and x in types],
    )
    sub = helper.make_model(g, opset_imports=m.opset_import, ir_version=m.ir_version)
    path = src.parent / ("sub_" + "_".join(map(str, idx)) + ".onnx")
    onnx.save(sub, path)
    r = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("_load_ctx.py")), str(path)],
        capture_output=True,
        text=True,
    )
    print(idx, (r.stdout.strip() or r.stderr.strip().splitlines()[-1])[-160:], flush=True)
