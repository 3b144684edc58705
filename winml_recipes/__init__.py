"""winml-recipes: build ONNX models for on-device inference from declarative recipes."""

import os

__version__ = "0.1.0"

# onnxruntime 1.31 keeps a telemetry store with a persistent device id in the user's home
# (~/.cache/Microsoft/DeveloperTools/.onnxruntime/) from every session; this switch, read
# when onnxruntime is imported, stops it (and is inherited by the tool's child processes).
# Nothing the tool runs writes outside its output and its cache. A user who sets it keeps
# their own value.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
