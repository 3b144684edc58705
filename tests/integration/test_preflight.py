"""Fail fast: a component QNN HTP cannot finalize stops the build in its `preflight`, before
any component's calibration, whatever executor runs it (real HTP sessions, no mocks).

The pair: `enc` (a Conv chain, calibrated on 64 samples of its npz) feeds `dec` (the chain of
test_bisect with its channel Gather left in float by `quantize.exclude`: HTP fails to
finalize it, QNN_COMMON_ERROR_MEM_ALLOC, naming no node). `dec` calibrates on `enc`'s
outputs, so without the preflight `enc` is quantized and verified before `dec` fails.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.conftest import cli
from tests.integration.test_bisect import chain
from tests.integration.test_qnn import QNN_WHEELS
from winml_recipes import api
from winml_recipes.sdk.errors import PassError

pytestmark = pytest.mark.skipif(not QNN_WHEELS, reason="no onnxruntime-qnn wheel here")

CATALOG = """\
schema_version: 1
name: pair
task: feature-extraction
license: mit
components:
  enc:
    source: {ref: ./enc.onnx}
    inputs:
      pixels: {dtype: float32, shape: [1, 16, 8, 8], range: [-1.0, 1.0]}
    outputs:
      x: {shape: [1, 16, 8, 8]}
  dec:
    source: {ref: ./dec.onnx}
    inputs:
      x: {dtype: float32, shape: [1, 16, 8, 8], range: [0.0, 4.0]}
    outputs:
      y: {shape: [1, 16, 8, 8]}
"""

RECIPE = """\
schema_version: 1
name: pair
model: pair
targets:
  - {device: npu, precision: w8a16}
components:
  enc:
    steps:
      - normalize
      - fix_shapes
      - preflight
      - quantize: {calibration: {npz: enc.npz, samples: 64}}
      - verify
  dec:
    steps:
      - normalize
      - fix_shapes
      - preflight
      - quantize: {exclude: [pick_channels], calibration: {inputs_from: enc, samples: 8}}
      - verify: {inputs_from: enc, min_sqnr_db: 20, allow_cpu_fallback: FALLBACK}
"""

FAILS = (
    "dec/preflight [npu/w8a16]: the model (quantized on 2 synthetic sample(s)) cannot be "
    "opened on the target, checked before any calibration: QNNExecutionProvider (htp) failed "
    "to finalize the graph (QNN_COMMON_ERROR_MEM_ALLOC); the smallest failing region is "
    "pick_channels (Gather)"
)


def _pair(root: Path, fallback: bool = False) -> tuple[Path, Path]:
    """catalog/pair.yaml (enc -> dec) and recipes/pair.yaml; returns (recipe, catalog)."""
    catalog, recipes = root / "catalog", root / "recipes"
    catalog.mkdir(parents=True, exist_ok=True)
    recipes.mkdir(exist_ok=True)
    enc = onnx.load(str(chain(catalog / "enc.onnx", gather_at=-1)))  # Conv/Relu only
    enc.graph.input[0].name = "pixels"
    enc.graph.node[0].input[0] = "pixels"
    enc.graph.node[-1].output[0] = "x"
    enc.graph.output[0].name = "x"
    onnx.save(enc, str(catalog / "enc.onnx"))
    chain(catalog / "dec.onnx")
    (catalog / "pair.yaml").write_text(CATALOG)
    rng = np.random.default_rng(3)
    np.savez(recipes / "enc.npz", pixels=rng.uniform(-1, 1, (64, 1, 16, 8, 8)).astype(np.float32))
    recipe = recipes / "pair.yaml"
    recipe.write_text(RECIPE.replace("FALLBACK", str(fallback).lower()))
    return recipe, catalog


def _ran(manifest: dict) -> dict[str, list[tuple[str, str]]]:
    return {
        name: [(s["pass"], s["status"]) for s in comp["steps"]]
        for name, comp in manifest["components"].items()
    }


def _check_evidence(failed: Path) -> None:
    """What the failed build kept: every component's steps up to its preflight, no
    calibration, and the region bisection named."""
    manifest = json.loads((failed / "manifest.json").read_text())
    assert (manifest["status"], manifest["failing_step"]) == ("failed", "dec/preflight")
    ran = _ran(manifest)
    assert [p for p, _ in ran["enc"]] == ["normalize", "fix_shapes", "preflight"]
    assert ran["enc"][-1][1] in ("ran", "cached")  # the session cache is shared
    assert [p for p, _ in ran["dec"]] == ["normalize", "fix_shapes", "preflight"]
    assert ran["dec"][-1] == ("preflight", "failed")
    enc_check = manifest["components"]["enc"]["steps"][-1]["metrics"]
    assert enc_check["placement"]["nodes"] == {"QNNExecutionProvider": enc_check["placement"]
                                               ["nodes"]["QNNExecutionProvider"]}  # fmt: skip
    # the encoder's check calibrates on its own data, the decoder's (whose data is the
    # encoder's outputs) on synthetic samples
    assert enc_check["quantized"]["samples"] == 2
    assert enc_check["quantized"]["source"].startswith("npz"), enc_check["quantized"]
    dec_check = manifest["components"]["dec"]["steps"][-1]
    assert dec_check["metrics"]["bisection"]["culprit"] == {
        "name": "pick_channels",
        "op_type": "Gather",
    }
    assert FAILS in dec_check["error"]


def test_a_graph_htp_cannot_finalize_stops_the_build_before_any_calibration(
    tmp_path: Path,
) -> None:
    recipe, catalog = _pair(tmp_path)
    out = tmp_path / "out"
    result = cli("build", recipe, "--catalog", catalog, "-o", out)
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert FAILS in line, line
    assert "next: " in line  # what to do, as verify says it
    failed = out / "pair" / "npu-w8a16.failed"
    assert line.endswith(f"; evidence kept in {failed}/")
    _check_evidence(failed)


def test_the_api_build_checks_every_component_first(tmp_path: Path) -> None:
    """api.build (engine.run.run_plan): the same order, seen by its reporter."""
    from winml_recipes.engine.run import Reporter

    class Order(Reporter):
        started: list[str] = []

        def step_started(self, component, step) -> None:
            self.started.append(f"{component}/{step.name}")

    recipe, catalog = _pair(tmp_path)
    order = Order()
    with pytest.raises(PassError) as err:
        api.build(recipe, catalog_dir=catalog, output_root=tmp_path / "out", reporter=order)
    assert FAILS in str(err.value)
    assert err.value.exit_code == 2
    assert order.started == [
        "enc/normalize", "enc/fix_shapes", "enc/preflight",
        "dec/normalize", "dec/fix_shapes", "dec/preflight",
    ]  # fmt: skip
    _check_evidence(tmp_path / "out" / "pair" / "npu-w8a16.failed")


@pytest.mark.slow  # suite wall time: the local executor runs the same preflight in CI
def test_the_pool_executor_fails_in_the_preflight_too(tmp_path: Path) -> None:
    recipe, catalog = _pair(tmp_path)
    out, report = tmp_path / "out", tmp_path / "report.json"
    result = cli("build", recipe, "--catalog", catalog, "-o", out, "--all-targets",
                 "--executor", "pool", "--jobs", "2", "--report", report)  # fmt: skip
    assert result.exit_code == 2, result.output
    data = json.loads(report.read_text())
    (target,) = data["targets"]
    assert target["failing_step"] == "dec/preflight"
    assert FAILS in target["error"]
    _check_evidence(out / "pair" / "npu-w8a16.failed")
    # the tasks after the checks never started
    later = [t for t in data["tasks"] if "quantize" in t["label"]]
    assert len(later) == 2 and all(t["status"] == "not run" for t in later), later


def test_with_cpu_fallback_the_preflight_keeps_the_region_on_the_cpu(tmp_path: Path) -> None:
    """verify allows CPU fallback: the preflight does too, keeps the bisected op type on
    the CPU (QNN's op_affinity), records the placement, and the build goes on."""
    recipe, catalog = _pair(tmp_path, fallback=True)
    result = api.build(recipe, catalog_dir=catalog, output_root=tmp_path / "out")
    steps = {s["pass"]: s for s in result.manifest["components"]["dec"]["steps"]}
    check = steps["preflight"]
    assert check["options"]["allow_cpu_fallback"] is True
    assert check["options"]["quantize"]["exclude"] == ["pick_channels"]
    assert check["metrics"]["cpu_op_affinity"]["op_types"] == ["Gather"]
    # the Gather, with the Q/DQ nodes around it, placed on the CPU EP
    fallback = check["metrics"]["placement"]["fallback_nodes"]
    assert {"name": "pick_channels", "op_type": "Gather"} in fallback
    assert {n["op_type"] for n in fallback} <= {"Gather", "QuantizeLinear", "DequantizeLinear"}
    assert check["metrics"]["refused_nodes"] == len(fallback)
    assert steps["verify"]["metrics"]["verified_on"] == "qnn-htp"


@pytest.mark.slow
def test_the_ray_executor_fails_in_the_preflight_too(tmp_path: Path) -> None:
    """A local Ray cluster (about 20 s to start and reach workers here)."""
    recipe, catalog = _pair(tmp_path)
    out = tmp_path / "out"
    report = api.matrix([recipe], executor="ray", jobs=2, catalog_dir=catalog, output_root=out)
    (target,) = report.outcomes
    assert (report.exit_code, target.failing_step) == (2, "dec/preflight")
    assert FAILS in (target.error or "")
    _check_evidence(out / "pair" / "npu-w8a16.failed")
    later = [t for t in report.tasks if "quantize" in t["label"]]
    assert len(later) == 2 and all(t["status"] == "not run" for t in later), later
