"""Quantization: one config, real calibration, mixed precision."""
