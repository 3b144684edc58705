"""The matrix report: exit-code precedence, the summary table, --targets parsing."""

from __future__ import annotations

import json

import pytest

from winml_recipes.exec.matrix import MatrixReport, expand, parse_targets
from winml_recipes.exec.task import TargetOutcome, TargetTask
from winml_recipes.sdk.errors import RecipeError


def _outcome(status: str, code: int = 0, **kw) -> TargetOutcome:
    return TargetOutcome("recipes/r.yaml", "cpu", "int8", status, exit_code=code, **kw)


@pytest.mark.parametrize(
    ("codes", "expected"),
    [
        ([], 0),
        ([3], 3),
        ([3, 2], 2),  # bad input outranks a quality gate: the gate may not have been reached
        ([3, 2, 1], 1),  # an internal fault outranks both
    ],
)
def test_exit_code_is_the_worst_failure(codes: list[int], expected: int) -> None:
    outcomes = [_outcome("ok")] + [_outcome("failed", c, error="x") for c in codes]
    assert MatrixReport("local", outcomes).exit_code == expected


def test_interrupted_is_130_and_says_so(tmp_path) -> None:
    report = MatrixReport("pool", [_outcome("ok"), _outcome("not run")], interrupted=True)
    report.write(tmp_path / "r.json")
    data = json.loads((tmp_path / "r.json").read_text())
    assert (data["status"], data["exit_code"]) == ("interrupted", 130)
    assert [t["status"] for t in data["targets"]] == ["ok", "not run"]
    assert list(tmp_path.iterdir()) == [tmp_path / "r.json"]  # no temporary left behind


def test_table_has_a_row_per_target_and_a_total() -> None:
    ok = _outcome("ok", metrics={"size_mb": 1.5, "min_sqnr_db": 31.25}, wall_seconds=2.0)
    bad = _outcome("failed", 3, error="e", failing_step="enc/verify", wall_seconds=1.0)
    lines = MatrixReport("ray", [ok, bad], wall_seconds=3.0, startup_seconds=2.5).table()
    lines = lines.splitlines()
    assert lines[0].split() == ["recipe", "target", "status", "wall", "s", "size", "MB", "min",
                                "SQNR", "dB", "step"]  # fmt: skip
    assert lines[1].split() == ["r", "cpu/int8", "ok", "2.0", "1.50", "31.2", "-"]
    assert lines[2].split() == ["r", "cpu/int8", "failed", "1.0", "-", "-", "enc/verify"]
    assert lines[3] == "1/2 built with ray in 3.0 s (start-up 2.5 s)"


def test_parse_targets() -> None:
    assert parse_targets("all") is None
    assert parse_targets(" cpu/int8, npu/w8a16") == [("cpu", "int8", None), ("npu", "w8a16", None)]
    assert parse_targets("npu/uint8/openvino") == [("npu", "uint8", "openvino")]
    with pytest.raises(RecipeError, match="expected all or DEVICE/PRECISION"):
        parse_targets("cpu-int8")
    with pytest.raises(RecipeError, match="expected all or DEVICE/PRECISION"):
        parse_targets("npu/uint8/openvino/x")


def test_targets_without_an_ep_name_the_default_eps_target() -> None:
    """npu/uint8 names the target built for the device's default EP, npu/uint8/openvino the
    one the recipe builds for OpenVINO; a recipe that builds npu/uint8 only for OpenVINO is
    named by either."""
    both = [("npu", "uint8", None), ("npu", "uint8", "openvino"), ("cpu", "fp32", None)]
    ov_only = [("npu", "uint8", "openvino")]
    base = TargetTask("")
    tasks, _ = expand(["r"], [("npu", "uint8", None)], base, lambda r: both)
    assert [(t.device, t.precision, t.ep) for t in tasks] == [("npu", "uint8", None)]
    tasks, _ = expand(["r"], [("npu", "uint8", "openvino")], base, lambda r: both)
    assert [t.target for t in tasks] == ["npu/uint8/openvino"]
    tasks, _ = expand(["r"], None, base, lambda r: both)
    assert [t.target for t in tasks] == ["npu/uint8", "npu/uint8/openvino", "cpu/fp32"]
    tasks, _ = expand(["r"], [("npu", "uint8", None)], base, lambda r: ov_only)
    assert [t.target for t in tasks] == ["npu/uint8/openvino"]
    with pytest.raises(RecipeError, match="no recipe declares npu/uint8/qnn"):
        expand(["r"], [("npu", "uint8", "qnn")], base, lambda r: ov_only)
