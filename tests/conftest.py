"""Shared fixtures: an isolated cache per session, the repo paths, a CLI runner."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"
CATALOG = REPO / "catalog"


@pytest.fixture(scope="session", autouse=True)
def session_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One step cache for the whole session (exports are reused), never the user's."""
    cache = tmp_path_factory.mktemp("cache")
    os.environ["WINML_RECIPES_CACHE"] = str(cache)
    os.environ.pop("WINML_RECIPES_CATALOG", None)
    return cache


def cli(*args: str | Path) -> Result:
    """Run the CLI in-process; stderr is kept apart from stdout."""
    from winml_recipes.cli import main

    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def cli_subprocess(
    *args: str | Path, cwd: Path | None = None, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run `python -m winml_recipes` in a real process (exit codes, signals, imports)."""
    return subprocess.run(
        [sys.executable, "-m", "winml_recipes", *map(str, args)],
        cwd=cwd or REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="session")
def tiny_build(tmp_path_factory: pytest.TempPathFactory):
    """sam3-tiny built once for cpu/fp32 (export included); shared by read-only tests."""
    from winml_recipes import api

    out = tmp_path_factory.mktemp("tiny-build")
    return api.build(RECIPES / "sam3-tiny.yaml", output_root=out)
