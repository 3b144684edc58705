"""onnxruntime sessions on any execution provider: the only place that creates them.

`providers` knows which EPs exist (the EP plugins: winml_recipes/eps/) and
whether this host can load them; `sessions` opens sessions on one of them with a
placement policy, reports where each node ran, and runs feeds.
"""
