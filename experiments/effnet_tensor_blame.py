"""Which activation encodings cost the tiny EfficientNet's cpu/int8 logits (issue 33).

In the QDQ model, an activation's QuantizeLinear -> DequantizeLinear pair is replaced by
Identity ops to keep it float. Reports the logits' SQNR and top-1 agreement against the float
model on the held-out photos for: the QDQ model; every activation float (weights 8-bit);
each activation alone at 8 bit (the others float); each activation alone float; the
activations whose own 8-bit SQNR on 16 calibration photos is below T dB kept float, per T.

    python experiments/effnet_tensor_blame.py QDQ.onnx FLOAT.onnx [N]
"""

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from PIL import Image

qdq, flt = onnx.load(sys.argv[1]), onnx.load(sys.argv[2])
N = int(sys.argv[3]) if len(sys.argv) > 3 else 15
init = {i.name for i in qdq.graph.initializer}
acts = [
    n.input[0] for n in qdq.graph.node if n.op_type == "QuantizeLinear" and n.input[0] not in init
]
prod = {o: n.op_type for n in flt.graph.node for o in n.output}
mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
photos = sorted(
    Path(sys.argv[4] if len(sys.argv) > 4 else "winml_recipes/data/images/heldout").glob("*.jpg")
)
x = np.stack(
    [
        (
            (np.asarray(Image.open(p).convert("RGB").resize((64, 64)), np.float32) / 255 - mean)
            / std
        ).transpose(2, 0, 1)
        for p in photos
    ]
).astype(np.float32)


def run(m):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    )  # as the build runs it
    s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    # one photo per run: the exported graph has batch 1
    return np.concatenate(
        [s.run(None, {"pixel_values": x[i : i + 1]})[0] for i in range(len(x))]
    ).astype(np.float64)


ref = run(flt)


def score(float_acts):
    m = onnx.ModelProto()
    m.CopyFrom(qdq)
    del m.graph.value_info[:]
    qout = {}
    for n in m.graph.node:
        if n.op_type == "QuantizeLinear" and n.input[0] in float_acts:
            qout[n.output[0]] = True
            del n.input[1:]
            n.op_type, n.domain = "Identity", ""
            del n.attribute[:]
    for n in m.graph.node:
        if n.op_type == "DequantizeLinear" and n.input[0] in qout:
            del n.input[1:]
            n.op_type, n.domain = "Identity", ""
            del n.attribute[:]
    y = run(m)
    db = 10 * np.log10((ref**2).mean() / ((ref - y) ** 2).mean())
    return db, float((y.argmax(-1) == ref.argmax(-1)).mean())


print("QDQ model: {:.1f} dB top-1 {:.3f}".format(*score(set())))
print("all activations float (8-bit weights): {:.1f} dB top-1 {:.3f}".format(*score(set(acts))))
alone = sorted((score(set(acts) - {t}), t) for t in acts)
print("each activation alone at 8 bit (worst first):")
for (db, a), t in alone[:N]:
    print(f"  {db:6.1f} dB top-1 {a:.3f}  {prod.get(t, 'input'):10s} {t}")
kept = sorted(((score({t}), t) for t in acts), reverse=True)
print("each activation alone float (best first):")
for (db, a), t in kept[:N]:
    print(f"  {db:6.1f} dB top-1 {a:.3f}  {prod.get(t, 'input'):10s} {t}")


# the activations whose own 8-bit encoding keeps < T dB on 16 calibration photos, kept float
from onnx import numpy_helper  # noqa: E402

ini = {i.name: numpy_helper.to_array(i) for i in qdq.graph.initializer}
enc = {
    n.input[0]: (float(ini[n.input[1]]), int(ini[n.input[2]]), ini[n.input[2]].dtype)
    for n in qdq.graph.node
    if n.op_type == "QuantizeLinear" and n.input[0] not in ini
}
tapped = onnx.ModelProto()
tapped.CopyFrom(flt)
names = [t for t in acts if t in prod]
for t in names:
    tapped.graph.output.append(onnx.ValueInfoProto(name=t))
opts = ort.SessionOptions()
opts.log_severity_level = 3
session = ort.InferenceSession(tapped.SerializeToString(), opts, providers=["CPUExecutionProvider"])
cal = sorted(Path("winml_recipes/data/images/calibration").glob("*.jpg"))[:16]
xc = np.stack([
    ((np.asarray(Image.open(p).convert("RGB").resize((64, 64)), np.float32) / 255 - mean) / std)
    .transpose(2, 0, 1) for p in cal
]).astype(np.float32)  # fmt: skip
runs = [session.run(None, {"pixel_values": xc[i : i + 1]}) for i in range(len(xc))]
outs = {o.name: np.concatenate([r[k] for r in runs]) for k, o in enumerate(session.get_outputs())}
own = {}
for t in names:
    v = outs[t].astype(np.float64)
    scale, zero, dtype = enc[t]
    info = np.iinfo(dtype)
    q = (np.clip(np.round(v / scale) + zero, info.min, info.max) - zero) * scale
    own[t] = 10 * np.log10((v**2).mean() / max(((v - q) ** 2).mean(), 1e-30))
for threshold in (24, 26, 28, 30, 32, 34):
    keep = {t for t in names if own[t] < threshold}
    db, a = score(keep)
    print(f"own 8-bit SQNR < {threshold} dB: {len(keep)} of {len(names)} float -> "
          f"logits {db:.1f} dB top-1 {a:.3f}")  # fmt: skip
