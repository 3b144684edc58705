"""Per-tensor 8-bit quantization SQNR of the tiny EfficientNet's activations (issue 33).

Reads the QDQ model's activation encodings (QuantizeLinear scale/zero point), taps the same
tensors in the float model, runs the bundled held-out photos and reports, per tensor, the SQNR
of quantize-dequantize(float tensor) against the float tensor alone (the encoding's own loss),
the share of the range the values use (p99.9 |x| / max|x|) and the producing op.

    python experiments/effnet_tensor_steps.py QDQ.onnx FLOAT.onnx
"""

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper
from PIL import Image

qdq, flt = onnx.load(sys.argv[1]), onnx.load(sys.argv[2])
init = {i.name: numpy_helper.to_array(i) for i in qdq.graph.initializer}
enc = {}
for n in qdq.graph.node:
    if n.op_type == "QuantizeLinear" and n.input[0] not in init:
        enc[n.input[0]] = (float(init[n.input[1]]), int(init[n.input[2]]), init[n.input[2]].dtype)
prod = {o: n for n in flt.graph.node for o in n.output}
names = [t for t in enc if t in prod or t in {i.name for i in flt.graph.input}]
have = {o.name for o in flt.graph.output}
for t in names:
    if t not in have:
        flt.graph.output.append(onnx.ValueInfoProto(name=t))
sess = ort.InferenceSession(flt.SerializeToString(), providers=["CPUExecutionProvider"])
mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
photos = sorted(Path("winml_recipes/data/images/heldout").glob("*.jpg"))
x = np.stack(
    [
        (
            (np.asarray(Image.open(p).convert("RGB").resize((64, 64)), np.float32) / 255 - mean)
            / std
        ).transpose(2, 0, 1)
        for p in photos
    ]
).astype(np.float32)
runs = [sess.run(None, {"pixel_values": x[i : i + 1]}) for i in range(len(x))]  # batch 1 graph
outs = {o.name: np.concatenate([r[k] for r in runs]) for k, o in enumerate(sess.get_outputs())}
rows = []
for t in names:
    v = outs[t].astype(np.float64)
    s, z, dt = enc[t]
    info = np.iinfo(dt)
    q = (np.clip(np.round(v / s) + z, info.min, info.max) - z) * s
    sq = 10 * np.log10((v**2).mean() / max(((v - q) ** 2).mean(), 1e-30))
    a = np.abs(v).ravel()
    rows.append(
        (
            sq,
            t,
            prod[t].op_type if t in prod else "input",
            float(np.percentile(a, 99.9) / max(a.max(), 1e-30)),
            float(np.sqrt((v**2).mean()) / s),
        )
    )
for r in sorted(rows)[: int(sys.argv[3]) if len(sys.argv) > 3 else 25]:
    print(f"{r[0]:6.1f} dB  {r[2]:12s} rms/step {r[4]:7.2f}  p99.9/max {r[3]:.3f}  {r[1]}")
print("median", np.median([r[0] for r in rows]), "n", len(rows))
print("clipping (held-out values outside the calibrated encoding):")
for t in names:
    v = outs[t]
    s, z, dt = enc[t]
    info = np.iinfo(dt)
    lo, hi = (info.min - z) * s, (info.max - z) * s
    frac = float(((v < lo - s / 2) | (v > hi + s / 2)).mean())
    if frac > 0:
        print(
            f"  {t:20s} {prod[t].op_type if t in prod else 'input':10s} "
            f"range [{lo:.3g},{hi:.3g}] held-out [{v.min():.3g},{v.max():.3g}] "
            f"clipped {frac:.4f} shape {v.shape}"
        )
