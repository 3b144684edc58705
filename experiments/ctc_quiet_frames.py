"""Where a Wav2Vec2ForCTC w8a16 build departs on QNN HTP: the quiet frames of the feature
projection's LayerNormalization (docs/families.md, speech CTC).

    python experiments/ctc_quiet_frames.py BUILD_DIR [WORK_DIR]

BUILD_DIR is an npu-w8a16 build folder of the tiny CTC model (model/model.onnx, the QDQ
model, and float-reference/model/model.onnx), e.g. from `python -m bench.audio_families OUT
wav2vec2-ctc`. On the 4 held-out sentences (2 s each), prefixes of the QDQ model
(quant/prefixes.py: no taps) are run on HTP (fallback off) and on the CPU EP:

1. the LayerNorm's input (the conv stack's output): HTP vs simulation per frame, in steps
   of its 16-bit encoding and against each frame's own spread;
2. the LayerNorm's output against the float model: the share of the error held by frames
   whose input variance is below the LayerNorm's epsilon.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

from winml_recipes.onnx.io import save_model
from winml_recipes.quant.prefixes import PrefixModels
from winml_recipes.runtime.sessions import run_model
from winml_recipes.speech import bundled_speech, read_wav


def _feeds(name: str) -> list[dict[str, np.ndarray]]:
    out = []
    for path in bundled_speech("heldout"):
        w = read_wav(path)[0][:32000]
        w = ((w - w.mean()) / np.sqrt(w.var() + 1e-7)).astype(np.float32)
        out.append({name: w[None]})
    return out


def _rows(x: np.ndarray) -> np.ndarray:
    return x.reshape(-1, x.shape[-1])


def main(build: Path, work: Path) -> None:
    qdq = onnx.load(str(build / "model" / "model.onnx"))
    flt = onnx.load(str(build / "float-reference" / "model" / "model.onnx"))
    feeds = _feeds(qdq.graph.input[0].name)
    ln = next(n for n in qdq.graph.node if n.op_type == "LayerNormalization")
    eps = next((a.f for a in ln.attribute if a.name == "epsilon"), 1e-5)
    dq_of = {n.input[0]: n.output[0] for n in qdq.graph.node if n.op_type == "DequantizeLinear"}
    q_of = {n.input[0]: n.output[0] for n in qdq.graph.node if n.op_type == "QuantizeLinear"}
    producer = {n.output[0]: n for n in qdq.graph.node}
    scale = next(i for i in qdq.graph.initializer if i.name == producer[ln.input[0]].input[1])
    step = float(onnx.numpy_helper.to_array(scale))
    prefixes = PrefixModels(qdq)

    def on(tensor: str, ep: str) -> list[np.ndarray]:
        path = save_model(prefixes.prefix(tensor), work / tensor / "model.onnx")
        return [r[tensor] for r in run_model(path, feeds, ep, fallback=ep == "cpu")]

    fln = next(n for n in flt.graph.node if n.op_type == "LayerNormalization")
    fprefix = PrefixModels(flt)
    fin = fprefix.prefix(fln.input[0])
    fout = fprefix.prefix(fln.output[0])
    f_in = [r[fln.input[0]] for r in run_model(save_model(fin, work / "f_in/model.onnx"), feeds)]
    f_out_path = save_model(fout, work / "f_out/model.onnx")
    f_out = [r[fln.output[0]] for r in run_model(f_out_path, feeds)]
    out_t = dq_of[q_of[ln.output[0]]]
    sim_in, htp_in = on(ln.input[0], "cpu"), on(ln.input[0], "qnn-htp")
    sim_out, htp_out = on(out_t, "cpu"), on(out_t, "qnn-htp")
    print(f"LayerNorm {ln.name}: epsilon {eps:.0e}, input step {step:.3g} (16-bit)")
    for i in range(len(feeds)):
        a, s, h = _rows(f_in[i]), _rows(sim_in[i]), _rows(htp_in[i])
        var = a.var(-1)
        quiet = var < eps
        d = np.abs(s - h)
        gain_q = 1 / np.sqrt(np.median(var[quiet]) + eps)
        gain_o = 1 / np.sqrt(np.median(var[~quiet]) + eps)
        print(
            f"sentence {i}: {quiet.sum()} of {len(a)} frames below epsilon (median std "
            f"{np.sqrt(np.median(var[quiet])):.2g}); input HTP vs simulation: max "
            f"{d.max() / step:.0f} steps, on quiet frames max {d[quiet].max():.2g}; the "
            f"LayerNorm multiplies a quiet frame's error by {gain_q:.0f}, others' by "
            f"{gain_o:.1f}"
        )
        f = _rows(f_out[i])
        for name, got in (("HTP", _rows(htp_out[i])), ("simulation", _rows(sim_out[i]))):
            err = ((f - got) ** 2).sum(-1)
            total = 10 * np.log10((f**2).sum() / err.sum())
            print(
                f"  LayerNorm output, {name} vs float: {total:.1f} dB; quiet frames hold "
                f"{err[quiet].sum() / err.sum():.2f} of the error"
            )


if __name__ == "__main__":
    work = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(tempfile.mkdtemp())
    main(Path(sys.argv[1]), work)
