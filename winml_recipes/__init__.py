"""winml-recipes: build ONNX models for on-device inference from declarative recipes."""

__version__ = "0.1.0"
