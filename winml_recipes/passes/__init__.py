"""Built-in passes, registered through the `winml_recipes.passes` entry points
(pyproject.toml), like any third-party pass."""
