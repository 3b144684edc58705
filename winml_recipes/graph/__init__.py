"""Graph rewrites that prepare a float model for a target's execution provider.

One module per rule family, each an onnx_ir pass working on an `ir.Model` in place and
recording what it replaced in a `RewriteLog`:

- `fold`: constant folding once shapes are static (onnxscript's folder), which also inlines
  `If` nodes whose condition became a constant;
- `gathernd`: GatherND with constant indices as Gather or Slice (+ Reshape);
- `recurrent`: LSTM and GRU unrolled over their static sequence length;
- `pooling`: an AveragePool whose window covers the whole map as GlobalAveragePool (used by
  `quantize` on the float model before calibration, every target; a walk of the ModelProto
  it holds, with onnx shape inference).

Every rewrite is exact in float; the `prepare` pass checks it on sample inputs.
"""
