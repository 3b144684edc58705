"""Broken and impostor plugins (issue 36): real distributions in a temporary site dir (a
dist-info with entry_points.txt beside its module), on PYTHONPATH of the real CLI.

A plugin that raises on import or lacks its attribute is skipped with one warning line
naming its distribution and entry point; only a command naming it fails. A plugin claiming
a built-in's name (EP key, task metric task, pass name, exporter family) is refused by name.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import MLP_CATALOG, REPO, make_mlp_onnx
from tests.integration.test_task_metrics import _classifier_project

BROKEN_ENTRIES = """\
[winml_recipes.eps]
boom = broken_import:PLUGIN
[winml_recipes.metrics]
lost-metric = broken_empty:Missing
[winml_recipes.passes]
boom_pass = broken_import:BoomPass
[winml_recipes.exporters]
lost_family = broken_empty:FAMILY
"""

# Each claims a built-in under an entry-point name of its own (or the built-in's own name).
CLASH_ENTRIES = """\
[winml_recipes.eps]
fastcpu = clash_plugins:CPU_AGAIN
[winml_recipes.metrics]
top-k-agreement = clash_plugins:Perfect
perfect = clash_plugins:Perfect
[winml_recipes.passes]
better_quantize = clash_plugins:Quantize
[winml_recipes.exporters]
auto = clash_plugins:AUTO
"""

CLASH_MODULE = """
from winml_recipes.eps.cpu import PLUGIN as CPU_AGAIN  # key 'cpu'
from winml_recipes.exporters.auto import FAMILY as AUTO  # family 'auto'
from winml_recipes.passes.quantize import QuantizePass as Quantize  # pass 'quantize'
from winml_recipes.sdk.metrics import DefaultGate, TaskMetric


class Perfect(TaskMetric):
    '''Says every classifier is perfect: it must never replace the built-in metric.'''
    name = "perfect"
    tasks = frozenset({"image-classification"})
    gates = {"top1_agreement": DefaultGate(0.8)}

    def outputs_used(self, contract):
        return tuple(s.name for s in contract.outputs)

    def values(self, reference, candidate):
        return {"top1_agreement": 1.0}
"""


def _dist(site: Path, name: str, entries: str) -> None:
    info = site / f"{name.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entries)


def _site(root: Path, broken: bool, clash: bool) -> Path:
    site = root / "site"
    site.mkdir(parents=True)
    if broken:
        _dist(site, "broken-plugins", BROKEN_ENTRIES)
        (site / "broken_import.py").write_text("raise RuntimeError('plugin import exploded')\n")
        (site / "broken_empty.py").write_text("# declares nothing the entry points name\n")
    if clash:
        _dist(site, "clash-plugins", CLASH_ENTRIES)
        (site / "clash_plugins.py").write_text(CLASH_MODULE)
    return site


def _cli(site: Path, *args: str | Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    return subprocess.run(
        [sys.executable, "-m", "winml_recipes", *map(str, args)],
        env=env, capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip


def _recipe(root: Path, target: str) -> Path:
    (root / "catalog").mkdir(parents=True)
    make_mlp_onnx(root / "catalog" / "mlp.onnx")
    (root / "catalog" / "mlp.yaml").write_text(MLP_CATALOG.format(ref="./mlp.onnx"))
    (root / "recipes").mkdir()
    recipe = root / "recipes" / "mlp.yaml"
    recipe.write_text(
        f"schema_version: 1\nname: mlp\nmodel: mlp\ntargets: [{target}]\nsteps: [normalize]\n"
    )
    return recipe


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("warning: plugin ")]


def test_broken_plugins_are_skipped_with_one_line_each(tmp_path: Path) -> None:
    site = _site(tmp_path, broken=True, clash=False)
    model = make_mlp_onnx(tmp_path / "mlp.onnx")
    done = _cli(site, "build", "--onnx", model, "--device", "cpu", "--precision", "fp32",
                "-o", tmp_path / "o")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    lines = _warnings(done.stderr)
    # one line per broken entry point the build looked at, each naming its distribution
    for entry in ("boom", "lost-metric", "boom_pass"):
        hits = [line for line in lines if f"plugin '{entry}' " in line]
        assert len(hits) == 1, (entry, done.stderr[-3000:])
        assert "distribution 'broken-plugins 0.1'" in hits[0] and "failed to load" in hits[0]
    assert "plugin import exploded" in next(x for x in lines if "'boom'" in x)
    assert "AttributeError" in next(x for x in lines if "'lost-metric'" in x)
    # only a command that needs the broken plugin fails, in one line
    needs = _cli(site, "build", _recipe(tmp_path / "p", "{device: cpu, precision: fp32, ep: boom}"),
                 "-o", tmp_path / "o2")  # fmt: skip
    assert needs.returncode != 0 and "Traceback" not in needs.stderr, needs.stderr[-3000:]
    errors = [x for x in needs.stderr.splitlines() if x.strip() and not x.startswith("warning:")]
    assert len(errors) == 1, needs.stderr
    assert "execution provider 'boom' is not available" in errors[0]
    assert "broken-plugins 0.1" in errors[0] and "plugin import exploded" in errors[0]


def test_a_plugin_claiming_a_built_in_name_is_refused_by_name(tmp_path: Path) -> None:
    """The impostor metric would call the damaged classifier perfect: the built-in
    top-k-agreement still judges it, and its failing gate holds the build (exit 3)."""
    site = _site(tmp_path, broken=False, clash=True)
    recipe = _classifier_project(
        tmp_path / "p", "image-classification", "{min_sqnr_db: -100, min_cosine: -1}"
    )
    done = _cli(site, "build", recipe, "-o", tmp_path / "o")
    assert done.returncode == 3, done.stderr[-3000:]
    assert "task: top1_agreement " in done.stderr and ") FAIL" in done.stderr
    lines = _warnings(done.stderr)
    clashes = {
        "fastcpu": "'cpu'",
        "top-k-agreement": "'top-k-agreement'",
        "perfect": "'image-classification'",
        "better_quantize": "'quantize'",
        "auto": "'auto'",
    }
    for entry, builtin in clashes.items():
        hits = [line for line in lines if f"plugin '{entry}' " in line]
        assert len(hits) == 1, (entry, done.stderr[-3000:])
        assert "distribution 'clash-plugins 0.1'" in hits[0] and builtin in hits[0], hits
        assert "built-in" in hits[0], hits
