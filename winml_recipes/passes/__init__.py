"""Built-in passes; importing this package registers them."""

from winml_recipes.passes import export, fix_shapes, normalize, verify  # noqa: F401
