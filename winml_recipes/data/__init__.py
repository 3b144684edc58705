"""Data that ships inside the package: the built-in catalog, recipe partials and JSON schemas.

Read through importlib.resources, so an installed wheel (or a zipped install) carries them
and every command works from any folder; a project's own `catalog/` and
`recipes/_partials/` add to them (see winml_recipes.catalog and winml_recipes.recipe).

    catalog/   built-in catalog entries (NAME.yaml)
    partials/  built-in recipe partials ({% include "verify-float.yaml" %})
    schemas/   recipe/catalog/manifest JSON Schemas, written by `make schema`
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable  # Python 3.11+; only for the annotation

CATALOG = "catalog"
PARTIALS = "partials"
SCHEMAS = "schemas"


@cache
def builtin_dir(name: str) -> Path:
    """The package's `name` folder as a directory on disk.

    A regular or editable install keeps it on disk; a zipped install (zipimport) has no
    paths, so the folder is copied out once per process: the catalog's link checks and
    jinja's loader read real paths.
    """
    root = resources.files(__name__).joinpath(name)
    if isinstance(root, Path):
        return root
    target = Path(tempfile.mkdtemp(prefix="winml-recipes-data-"))
    atexit.register(shutil.rmtree, target, True)
    _copy_tree(root, target)
    return target


def _copy_tree(source: Traversable, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.is_dir():
            _copy_tree(item, target / item.name)
        elif item.is_file():
            (target / item.name).write_bytes(item.read_bytes())
