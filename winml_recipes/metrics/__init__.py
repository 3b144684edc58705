"""Built-in task metrics (plugins of the `winml_recipes.metrics` entry-point group)."""
