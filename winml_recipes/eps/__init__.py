"""Execution-provider plugins shipped with the package (entry-point group `winml_recipes.eps`).

Each module (or package) here is the one place that knows its runtime; the interface is
winml_recipes.sdk.ep. A third party adds an EP with its own module and an entry point.
"""
