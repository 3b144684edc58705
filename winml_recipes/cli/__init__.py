"""Command line: one thin module per command group over winml_recipes.api. `main` is the
entry point (winml-recipes = winml_recipes.cli:main); importing a command module registers
its commands on it."""

from winml_recipes.cli import build, cache, catalog, compare, init, models, perf, plan, run  # noqa: F401
from winml_recipes.cli.app import main

__all__ = ["main"]
