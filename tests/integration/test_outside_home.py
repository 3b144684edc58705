"""Nothing outside the output folder and the cache (issue 36, item 6): a build and a `run`
in a fresh HOME (and a fresh temp folder) leave files only in the tool's cache there, not
onnxruntime's telemetry store (~/.cache/Microsoft/DeveloperTools/.onnxruntime) nor a shared
lock folder in the temp folder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import make_mlp_project

NPU_RECIPE = """\
schema_version: 1
name: npu
model: mlp
targets:
  - {device: npu, precision: uint8}
steps: [normalize, fix_shapes, {quantize: {repair_divergence: false}},
        {verify: {min_sqnr_db: 10}}, compile]
"""


def _fresh(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """A HOME and a TMPDIR of their own; no XDG or cache variables (the defaults decide)."""
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    tmp.mkdir()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "TMPDIR": str(tmp), "LANG": "C.UTF-8"}
    return home, tmp, env


def _cli(env: dict[str, str], cwd: Path, *args: str | Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "winml_recipes", *map(str, args)],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr


def _outside_cache(home: Path) -> list[str]:
    cache = home / ".cache" / "winml-recipes"
    return sorted(
        str(p.relative_to(home))
        for p in home.rglob("*")
        if not p.is_dir() and not p.is_relative_to(cache)
    )


def test_a_build_and_a_run_leave_nothing_in_home_but_the_cache(tmp_path: Path) -> None:
    home, tmp, env = _fresh(tmp_path)
    recipe = make_mlp_project(tmp_path / "proj")
    out = tmp_path / "out"
    _cli(env, tmp_path / "proj", "build", recipe, "-o", out, "--device", "cpu",
         "--precision", "fp32")  # fmt: skip
    inputs = tmp_path / "inputs.npz"
    np.savez(inputs, x=np.ones((2, 4), np.float32))
    _cli(env, tmp_path, "run", out / "mlp" / "cpu-fp32", "--npz", inputs)
    assert (home / ".cache" / "winml-recipes").is_dir()  # the cache went where HOME says
    assert _outside_cache(home) == []
    assert sorted(p.name for p in tmp.iterdir()) == []  # no lock folder, no leftovers


@pytest.mark.slow  # an HTP session, a calibration and a compile: about 25 s on a busy host
def test_an_npu_build_leaves_nothing_in_home_but_the_cache(tmp_path: Path) -> None:
    home, tmp, env = _fresh(tmp_path)
    make_mlp_project(tmp_path / "proj")
    recipe = tmp_path / "proj" / "recipes" / "npu.yaml"
    recipe.write_text(NPU_RECIPE)
    _cli(env, tmp_path / "proj", "build", recipe, "-o", tmp_path / "out")
    assert _outside_cache(home) == []
    assert sorted(p.name for p in tmp.iterdir()) == []
