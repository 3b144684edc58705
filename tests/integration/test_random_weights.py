"""A build from seeded random weights (a catalog `config:` source: sam3-tiny, the `-tiny`
twins) says so in its console summary and its report.html; a build of real weights does not."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.conftest import CATALOG, cli, make_mlp_project
from winml_recipes import pictures
from winml_recipes.buildfolder import open_build
from winml_recipes.presenter import summary_lines
from winml_recipes.sdk.records import Manifest
from winml_recipes.standin import random_weight_components


def test_the_catalog_tells_random_weight_stand_ins_from_real_models() -> None:
    def entry(name: str) -> dict:
        return yaml.safe_load((CATALOG / f"{name}.yaml").read_text(encoding="utf-8"))

    both = ["vision_encoder", "prompt_encoder_mask_decoder"]
    assert random_weight_components(entry("sam3-tiny"), None) == both
    assert random_weight_components(entry("sam3-mid"), None) == both
    assert random_weight_components(entry("bge-small-tiny"), None) == ["model"]
    for real in ("sam3", "bge-small", "whisper-tiny-encoder"):
        assert random_weight_components(entry(real), None) == [], real
    assert random_weight_components(entry("sam3"), "int8") == []


def test_a_random_weight_build_says_so_in_its_summary_and_report(tiny_build) -> None:
    out = tiny_build.output_dir
    manifest = Manifest.from_json(json.loads((out / "manifest.json").read_text()))
    lines = summary_lines(manifest, out)
    notes = [line for line in lines if "random weights" in line]
    assert len(notes) == 1 and notes[0].startswith("  note: random weights: vision_encoder, ")
    assert "pictures (masks, labels) are meaningless" in notes[0]
    assert pictures._random_weights(open_build(out)) == [
        "random weights (a stand-in): this shows agreement with float, not a real result"
    ]  # the run picture's caption line
    html = (out / "report.html").read_text(encoding="utf-8")
    assert '<p class="random"><strong>Random weights: vision_encoder, ' in html
    assert html.index('class="random"') < html.index("<h2>Verdicts")  # on top, seen first


def test_a_real_weight_build_does_not(tmp_path: Path) -> None:
    recipe = make_mlp_project(tmp_path)
    done = cli("build", recipe, "--device", "cpu", "--precision", "fp32", "-o", tmp_path / "b")
    assert done.exit_code == 0, done.stderr
    assert "built mlp for cpu/fp32" in done.output and "random weights" not in done.output
    html = (tmp_path / "b" / "mlp" / "cpu-fp32" / "report.html").read_text(encoding="utf-8")
    assert 'class="random"' not in html and "random weights" not in html.lower()
    assert pictures._random_weights(open_build(tmp_path / "b" / "mlp" / "cpu-fp32")) == []
