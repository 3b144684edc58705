"""Post-training algorithms beyond min/max ranges, as options of `quantize`
(`algorithms: [cle, smoothquant, seqmse, bias_correction]` or `auto`).

- float rewrites before calibration, exact in float (checked on calibration samples):
  cross-layer equalization (cle.py), SmoothQuant (smoothquant.py);
- weight changes after a first quantization, which they read back (what onnxruntime's
  quantizer did): SeqMSE weight ranges (seqmse.py), bias correction (bias_correction.py).
  Their calibration inputs are streamed a group of layers at a time (layers.py).
Each returns a record of what it changed, for the manifest.
"""

from __future__ import annotations

ALGORITHMS = ("cle", "smoothquant", "seqmse", "bias_correction")
FLOAT_REWRITES = ("cle", "smoothquant")
WEIGHT_TUNING = ("seqmse", "bias_correction")
