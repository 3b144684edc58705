"""onnxruntime sessions on any execution provider: the only place that creates them.

`providers` knows which EPs exist (CPU, the QNN plugin EP with its HTP backend, ...) and
whether this host can load them; `sessions` opens sessions on one of them with a
placement policy, reports where each node ran, and runs feeds.
"""
