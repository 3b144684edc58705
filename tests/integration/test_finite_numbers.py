"""Numbers in recipes are finite where the schema says `number`, the manifest is always JSON,
`algorithms: []` (documented as auto off) is accepted (issue 36, item 5)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import cli, make_mlp_project

RECIPE = """\
schema_version: 1
name: mlp
model: mlp
targets:
  - {{device: cpu, precision: uint8}}
steps:
  - normalize
  - {step}
  - verify
"""


def _recipe(root: Path, step: str) -> Path:
    recipe = make_mlp_project(root)
    recipe.write_text(RECIPE.format(step=step))
    return recipe


@pytest.mark.parametrize(
    ("step", "field", "shown"),
    [
        ("quantize: {algorithms: {budget_seconds: .nan}}", "algorithms.budget_seconds", "nan"),
        ("quantize: {algorithms: {budget_seconds: .inf}}", "algorithms.budget_seconds", "inf"),
        ("quantize: {mixed_precision: {auto: {target_sqnr_db: .NaN}}}",
         "mixed_precision.auto.target_sqnr_db", "nan"),
        ("quantize: {calibration: {method: percentile, percentile: -.inf}}",
         "calibration.percentile", "-inf"),
        ("verify: {min_sqnr_db: .Inf}", "min_sqnr_db", "inf"),
    ],
)  # fmt: skip
def test_a_non_finite_number_is_refused_at_its_line(
    tmp_path: Path, step: str, field: str, shown: str
) -> None:
    recipe = _recipe(tmp_path, step)
    result = cli("plan", recipe)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    name = step.split(":")[0]
    assert result.stderr.splitlines() == [
        f"error: {recipe}:8: $.steps[1].{name}.{field}: {shown} is not a finite number; "
        "give a finite value"
    ]


def test_algorithms_empty_list_means_auto_off(tmp_path: Path, monkeypatch) -> None:
    recipe = _recipe(tmp_path, "quantize: {algorithms: []}")
    # the random MLP at uint8 gives about 25 dB: this test is about the option, not quality
    recipe.write_text(recipe.read_text().replace("- verify", "- verify: {min_sqnr_db: 10}"))
    monkeypatch.setenv("WINML_RECIPES_CACHE", str(tmp_path / "cache"))
    result = cli("build", recipe, "-o", tmp_path / "out")
    assert result.exit_code == 0, result.stderr
    manifest = json.loads((tmp_path / "out" / "mlp" / "cpu-uint8" / "manifest.json").read_text())
    step = next(s for s in manifest["components"]["model"]["steps"] if s["pass"] == "quantize")
    assert step["options"]["algorithms"] == []
    assert "algorithms" not in step.get("metrics", {})  # nothing chosen, nothing tried


NAN_CLI = """\
import shutil

from winml_recipes.sdk.passes import Pass, model_file, register
from winml_recipes.sdk.types import StepResult


@register
class NanPass(Pass):
    name = "nanmetric"
    summary = "test pass: a metric that is NaN"
    target_dependent = False
    options_schema = {"type": "object", "additionalProperties": False, "properties": {}}

    def run(self, src, out_dir, options, ctx):
        out = model_file(out_dir)
        shutil.copyfile(src, out)
        return StepResult(out, {"score": float("nan")})


if __name__ == "__main__":
    from winml_recipes.cli import main

    main()
"""


def test_the_manifest_is_never_written_with_nan(tmp_path: Path) -> None:
    """A pass (a plugin's, say) that reports a NaN metric: Python's json would write a bare
    `NaN` no JSON reader takes; the build says which value instead (exit 1, one line)."""
    recipe = make_mlp_project(tmp_path, steps="[normalize, nanmetric]")
    script = tmp_path / "nan_cli.py"
    script.write_text(NAN_CLI)
    out = tmp_path / "out"
    env = {"WINML_RECIPES_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, script, "build", recipe, "-o", out, "--device", "cpu",
         "--precision", "fp32"],
        env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1, proc.stderr
    assert len(lines) == 1 and "manifest.json" in lines[0], proc.stderr
    assert "nanmetric" in lines[0] and "score is nan" in lines[0], lines[0]
    for written in out.rglob("*.json"):  # whatever was written parses as strict JSON
        json.loads(written.read_text(), parse_constant=_refuse)


def _refuse(constant: str) -> None:
    pytest.fail(f"a JSON file holds {constant}")


def test_depth_abs_rel_of_a_map_with_no_positive_depth_is_finite_and_fails() -> None:
    """A float depth map with no pixel above zero (a random tiny head) and a target map that
    differs: AbsRel was inf (written to the manifest as bare `Infinity`). It stays far past
    the gate, and finite."""
    import math

    from winml_recipes.metrics.depth import DepthAgreement

    ref = {"predicted_depth": -np.ones((1, 4, 4), np.float32)}
    cand = {"predicted_depth": -2 * np.ones((1, 4, 4), np.float32)}
    metric = DepthAgreement()
    values = metric.values([ref], [cand])
    assert math.isfinite(values["abs_rel_worst"]), values
    assert values["abs_rel_worst"] > metric.gates["abs_rel_worst"].threshold * 1000
    assert metric.values([ref], [ref])["abs_rel_worst"] == 0.0
