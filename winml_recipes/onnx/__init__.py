"""Shared ONNX helpers: safe load/save, digests, synthetic inputs, quantization facts."""
