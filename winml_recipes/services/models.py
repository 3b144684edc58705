"""Model I/O and model facts for passes: load and save (external data past 2 GB, our
layout), provenance stamps, node names, graph digests, input specs and sample tensors,
a weight-light view of a large model.

A facade over the package's implementations (onnx/*.py): passes import these names from
here, never the modules behind them (tests/unit/test_architecture.py), so the modules
can move without breaking a pass. Each name is imported on first use (`__getattr__`), so a
pass that imports one loads only its module: planning loads no onnxruntime.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names, for type checkers and editors
    from winml_recipes import __version__ as TOOL_VERSION
    from winml_recipes.onnx.digest import graph_digest
    from winml_recipes.onnx.inputs import make_inputs, names_one_dim, specs_from_model
    from winml_recipes.onnx.io import load_model, save_model
    from winml_recipes.onnx.lightview import light_view, with_weights
    from winml_recipes.onnx.names import name_nodes
    from winml_recipes.onnx.stamp import write_stamp

__all__ = [
    "TOOL_VERSION",
    "graph_digest",
    "light_view",
    "load_model",
    "make_inputs",
    "name_nodes",
    "names_one_dim",
    "save_model",
    "specs_from_model",
    "with_weights",
    "write_stamp",
]


def __getattr__(name: str) -> Any:
    """The implementation of `name`, imported when first asked for."""
    if name == "TOOL_VERSION":
        from winml_recipes import __version__

        return __version__
    if name == "graph_digest":
        from winml_recipes.onnx import digest as module

        return getattr(module, name)
    if name in ("make_inputs", "names_one_dim", "specs_from_model"):
        from winml_recipes.onnx import inputs as module

        return getattr(module, name)
    if name in ("load_model", "save_model"):
        from winml_recipes.onnx import io as module

        return getattr(module, name)
    if name in ("light_view", "with_weights"):
        from winml_recipes.onnx import lightview as module

        return getattr(module, name)
    if name == "name_nodes":
        from winml_recipes.onnx import names as module

        return getattr(module, name)
    if name == "write_stamp":
        from winml_recipes.onnx import stamp as module

        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
