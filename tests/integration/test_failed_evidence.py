"""A failed build keeps its evidence in `<target>.failed/`: the models made so far, a
manifest with status failed (the steps that ran, the failed one with its error and the
gates it measured), named in the error; the previous output stays as it was, `compare`
works on the failed candidate, and the next good build removes the evidence."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from tests.conftest import MLP_CATALOG, REPO, cli, make_mlp_onnx
from tests.integration.test_matrix_cli import valid_report


def _project(root: Path, gate: float) -> Path:
    """The MLP quantized for the NPU (w8a16), verified on QNN HTP with an SQNR gate."""
    (root / "catalog").mkdir(parents=True, exist_ok=True)
    (root / "recipes").mkdir(exist_ok=True)
    make_mlp_onnx(root / "catalog" / "mlp.onnx", hidden=16)
    (root / "catalog" / "mlp.yaml").write_text(MLP_CATALOG.format(ref="./mlp.onnx"))
    recipe = root / "recipes" / "mlp.yaml"
    recipe.write_text(
        "schema_version: 1\nname: mlp\nmodel: mlp\n"
        "targets:\n  - {device: npu, precision: w8a16}\n"
        f"steps: [normalize, fix_shapes, quantize, {{verify: {{min_sqnr_db: {gate}}}}}]\n"
    )
    return recipe


def _schema(name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(
        json.loads((REPO / "schemas" / f"{name}.schema.json").read_text())
    )


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_a_failed_gate_keeps_the_candidate_and_compare_reads_it(tmp_path: Path) -> None:
    out = tmp_path / "build"
    recipe = _project(tmp_path, gate=20)
    good = cli("build", recipe, "-o", out)
    assert good.exit_code == 0, good.output
    target, failed = out / "mlp" / "npu-w8a16", out / "mlp" / "npu-w8a16.failed"
    before = _tree(target)
    assert not failed.exists()

    _project(tmp_path, gate=250)  # nothing reaches 250 dB
    bad = cli("build", recipe, "-o", out, "--report", tmp_path / "report.json")
    assert bad.exit_code == 3, bad.output
    (line,) = bad.stderr.splitlines()
    assert "model/verify [npu/w8a16]: verification on qnn-htp failed: y: SQNR" in line
    assert line.endswith(f"; evidence kept in {failed}/")
    assert _tree(target) == before  # the previous output is untouched

    # the evidence: the quantized candidate and the partial manifest
    assert (failed / "model" / "model.onnx").is_file()
    manifest = json.loads((failed / "manifest.json").read_text())
    _schema("manifest").validate(manifest)
    assert (manifest["status"], manifest["failing_step"]) == ("failed", "model/verify")
    assert "verification on qnn-htp failed" in manifest["error"]
    steps = manifest["components"]["model"]["steps"]
    assert [(s["pass"], s["status"]) for s in steps][-2:] == [
        ("quantize", "cached"),
        ("verify", "failed"),
    ]
    verify = steps[-1]
    assert verify["error"] == manifest["error"]
    assert verify["metrics"]["verified_on"] == "qnn-htp"
    assert verify["metrics"]["passed"] is False
    sqnr = next(g for g in verify["metrics"]["gates"] if g["metric"] == "sqnr_db")
    assert (sqnr["threshold"], sqnr["passed"]) == (250, False)
    # the shipped candidate is the model the failed step verified
    assert manifest["components"]["model"]["artifact"]["sha256"] == verify["input_sha256"]
    # and its page says what failed
    page = (failed / "report.html").read_text(encoding="utf-8")
    assert "250" in page and "FAIL" in page.upper()
    report = valid_report(tmp_path / "report.json")
    (outcome,) = report["targets"]
    assert outcome["evidence_dir"] == str(failed) and outcome["manifest_path"] is None

    # compare on the failed candidate: no reference, no data options
    done = cli("compare", failed / "model", "--json")
    assert done.exit_code == 0, done.output
    compared = json.loads(done.stdout)
    assert compared["build_status"] == "failed"
    # the float model the evidence ships beside the candidate
    assert compared["reference"] == str(failed / "float-reference" / "model" / "model.onnx")
    assert compared["verified_on"] == "qnn-htp"
    assert {r["op_type"] for r in compared["tensors"]} >= {"MatMul", "Relu"}
    assert "the candidate is a failed build's evidence" in cli("compare", failed / "model").stdout

    # the next good build removes the evidence
    _project(tmp_path, gate=20)
    again = cli("build", recipe, "-o", out)
    assert again.exit_code == 0, again.output
    assert not failed.exists() and (target / "manifest.json").is_file()


def test_a_failed_build_through_the_api_keeps_its_evidence(tmp_path: Path) -> None:
    """The single-process engine (api.build, build --onnx) keeps it the same way."""
    from winml_recipes import api
    from winml_recipes.sdk.errors import QualityGateError

    recipe = _project(tmp_path, gate=250)
    with pytest.raises(QualityGateError) as caught:
        api.build(recipe, output_root=tmp_path / "b", use_cache=False)
    failed = tmp_path / "b" / "mlp" / "npu-w8a16.failed"
    assert str(caught.value).endswith(f"; evidence kept in {failed}/")
    assert not (tmp_path / "b" / "mlp" / "npu-w8a16").exists()  # no good output to keep
    manifest = json.loads((failed / "manifest.json").read_text())
    _schema("manifest").validate(manifest)
    assert [s["status"] for s in manifest["components"]["model"]["steps"]] == [
        "ran", "ran", "ran", "failed",
    ]  # fmt: skip
    # with --no-cache the models lived in the staging folder: the evidence holds a copy
    model = failed / "model" / "model.onnx"
    assert model.is_file() and model.stat().st_size > 0
    assert not list((tmp_path / "b" / "mlp").glob(".staging-*"))


def test_a_pool_worker_failure_keeps_its_evidence(tmp_path: Path) -> None:
    """Steps run in a pool process; the driver keeps the failed target's evidence."""
    recipe = _project(tmp_path, gate=250)
    out, report_path = tmp_path / "build", tmp_path / "report.json"
    result = cli(
        "matrix", recipe, "--executor", "pool", "--jobs", "1", "-o", out, "--report", report_path
    )
    assert result.exit_code == 3, result.output
    (outcome,) = valid_report(report_path)["targets"]
    failed = out / "mlp" / "npu-w8a16.failed"
    assert outcome["evidence_dir"] == str(failed)
    assert outcome["error"].endswith(f"; evidence kept in {failed}/")
    assert 0 < outcome["metrics"]["min_sqnr_db"] < 250  # the summary shows what it measured
    manifest = json.loads((failed / "manifest.json").read_text())
    assert manifest["failing_step"] == "model/verify"
    assert (failed / "model" / "model.onnx").is_file()
