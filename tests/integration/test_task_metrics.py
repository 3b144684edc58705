"""Task metrics (sdk/metrics.py): chosen by the catalog task, computed in verify on every
held-out sample, gated with verdicts; third-party metrics come from entry points."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import REPO, cli
from winml_recipes.metrics.masks import MaskAgreement, mask_iou_dice
from winml_recipes.sdk.contract import IOContract, TensorSpec

F = TensorProto.FLOAT


def _classifier_project(root: Path, task: str, verify: str) -> Path:
    """A linear classifier x[batch, 8] -> logits[batch, 8] whose weight has a row of 1000
    that never reaches the output (its input column is zeroed): 8-bit weights lose every
    other row, so the quantized model's top-1 is noise."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((8, 8)).astype(np.float32)
    w[0, :] = 1000.0
    mask = np.ones((1, 8), np.float32)
    mask[0, 0] = 0.0
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "mask"], ["h"], name="gate"),
            helper.make_node("MatMul", ["h", "w"], ["logits"], name="mm"),
        ],
        "g",
        [helper.make_tensor_value_info("x", F, ["batch", 8])],
        [helper.make_tensor_value_info("logits", F, ["batch", 8])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(mask, "mask")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    (root / "catalog").mkdir(parents=True)
    (root / "recipes").mkdir()
    onnx.save(model, str(root / "catalog" / "clf.onnx"))
    (root / "catalog" / "clf.yaml").write_text(
        f"schema_version: 1\nname: clf\ntask: {task}\nlicense: mit\ncomponents:\n  model:\n"
        "    source: {ref: ./clf.onnx}\n    dims: {batch: 16}\n    inputs:\n"
        "      x: {dtype: float32, shape: [batch, 8], range: [-1.0, 1.0]}\n"
        "    outputs:\n      logits: {shape: [batch, 8]}\n"
    )
    recipe = root / "recipes" / "clf.yaml"
    recipe.write_text(
        "schema_version: 1\nname: clf\nmodel: clf\ntargets: [{device: cpu, precision: uint8}]\n"
        f"steps: [normalize, quantize, {{verify: {verify}}}]\n"
    )
    return recipe


def test_a_failing_task_gate_exits_3_with_its_verdict(tmp_path: Path) -> None:
    """SQNR and cosine gates off: only the task metric can fail the build."""
    recipe = _classifier_project(
        tmp_path, "image-classification", "{min_sqnr_db: -100, min_cosine: -1}"
    )
    done = cli("build", recipe, "-o", tmp_path / "o")
    assert done.exit_code == 3, done.stderr
    assert "task: top1_agreement " in done.stderr
    assert "(gate >= 0.8, margin -" in done.stderr and ") FAIL" in done.stderr
    assert "; evidence kept in" in done.stderr  # after where the error comes from, if found


def test_task_gates_from_the_recipe_and_the_manifest_record(tmp_path: Path) -> None:
    recipe = _classifier_project(
        tmp_path,
        "image-classification",
        "{min_sqnr_db: -100, min_cosine: -1, task: {top1_agreement: 0.0, kl_mean: 1000}}",
    )
    done = cli("build", recipe, "-o", tmp_path / "o", "--json")
    assert done.exit_code == 0, done.stderr
    verify = next(
        s for s in json.loads(done.stdout)["components"]["model"]["steps"] if s["pass"] == "verify"
    )["metrics"]
    task = verify["task_metric"]
    assert task["task"] == "image-classification" and task["metric"] == "top-k-agreement"
    assert task["values"]["samples"] == 2 * 16  # two seeded batches of 16 rows
    assert task["values"]["top1_agreement"] < 0.8  # the damaged weights
    gates = {g["metric"]: g for g in verify["gates"] if g["output"] == "task"}
    assert gates["kl_mean"]["comparison"] == "<=" and gates["kl_mean"]["passed"] is True
    assert verify["passed"] is True


def test_mask_agreement_on_known_masks() -> None:
    """IoU/Dice by hand: 4 pixels vs 2 of them -> IoU 0.5, Dice 2*2/6; the float model's
    best mask is index 1; the candidate ranks index 2 best in one of the two prompts."""
    a = np.zeros((4, 4), bool)
    a[0, :4] = True
    b = np.zeros((4, 4), bool)
    b[0, :2] = True
    assert mask_iou_dice(a, b) == (0.5, 4 / 6)
    assert mask_iou_dice(np.zeros((2, 2), bool), np.zeros((2, 2), bool)) == (1.0, 1.0)
    masks = np.full((2, 1, 3, 4, 4), -1.0, np.float32)  # [batch 2, 1, 3 masks, 4, 4]
    masks[:, 0, 1] = np.where(a, 5.0, -5.0)
    cand = masks.copy()
    cand[0, 0, 1] = np.where(b, 5.0, -5.0)  # prompt 0: half the mask
    ref_scores = np.array([[[0.1, 0.9, 0.2]], [[0.1, 0.9, 0.2]]], np.float32)
    cand_scores = np.array([[[0.1, 0.9, 0.2]], [[0.1, 0.3, 0.8]]], np.float32)
    values = MaskAgreement().values(
        [{"iou_scores": ref_scores, "pred_masks": masks}],
        [{"iou_scores": cand_scores, "pred_masks": cand}],
    )
    assert values["mask_iou"] == (0.5 + 1.0) / 2 and values["mask_iou_worst"] == 0.5
    assert values["chosen_mask_agreement"] == 0.5 and values["prompts"] == 2
    contract = IOContract(outputs=(TensorSpec("iou_scores", "float32", (1, 3)),))
    assert MaskAgreement().outputs_used(contract) is None  # no pred_masks: not this metric


PLUGIN = """
from winml_recipes.sdk.metrics import DefaultGate, TaskMetric


class Spread(TaskMetric):
    name = "spread"
    tasks = frozenset({"my-task"})
    gates = {"same_sign": DefaultGate(0.5)}

    def outputs_used(self, contract):
        return tuple(s.name for s in contract.outputs)

    def values(self, reference, candidate):
        import numpy as np
        pairs = [(r[n], c[n]) for r, c in zip(reference, candidate) for n in r]
        return {"same_sign": float(np.mean([np.mean(np.sign(a) == np.sign(b)) for a, b in pairs]))}
"""


def test_a_third_party_metric_from_an_entry_point_is_used(tmp_path: Path) -> None:
    """A distribution on the path declares `winml_recipes.metrics: spread`; a catalog whose
    task is its task gets it in verify (a real process: entry points are read from the
    installed distributions' metadata)."""
    site = tmp_path / "site"
    (site / "spread_metric-0.1.dist-info").mkdir(parents=True)
    (site / "spread_metric.py").write_text(PLUGIN)
    (site / "spread_metric-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: spread-metric\nVersion: 0.1\n"
    )
    (site / "spread_metric-0.1.dist-info" / "entry_points.txt").write_text(
        "[winml_recipes.metrics]\nspread = spread_metric:Spread\n"
    )
    recipe = _classifier_project(tmp_path / "p", "my-task", "{min_sqnr_db: -100, min_cosine: -1}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    done = subprocess.run(
        [sys.executable, "-m", "winml_recipes", "build", recipe, "-o", tmp_path / "o", "--json"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    # its default gate held the build: the damaged classifier's uint8 logits lose their signs
    assert done.returncode == 3, done.stderr
    assert "task: same_sign 0 (gate >= 0.5, margin -0.5) FAIL" in done.stderr


def _image_classifier(path: Path) -> Path:
    """x[1, 3, 32, 32] -> Conv -> Relu -> GlobalAveragePool -> Flatten -> MatMul -> [1, 10]."""
    rng = np.random.default_rng(7)
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "cw"),
        numpy_helper.from_array(rng.standard_normal((8, 10)).astype(np.float32), "fw"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "cw"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("GlobalAveragePool", ["r"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flat"),
        helper.make_node("MatMul", ["f", "fw"], ["logits"], name="fc"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", F, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("logits", F, [1, 10])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.save(model, str(path))
    return path


def test_build_onnx_guesses_the_task_and_says_which_metric(tmp_path: Path) -> None:
    """An image in, [batch, classes] out: image-classification, judged by top-1/top-5
    agreement on the 8 held-out photographs; --task picks another."""
    path = _image_classifier(tmp_path / "clf.onnx")
    base = ("build", "--onnx", path, "--device", "cpu", "--precision", "int8")
    done = cli(*base, "-o", tmp_path / "o")
    assert done.exit_code == 0, done.stderr
    assert (
        "task: image-classification (image input x, one [batch, classes] output); verify "
        "judges model by top-k-agreement; --task to change" in done.stdout
    )
    manifest = json.loads((tmp_path / "o" / "clf" / "cpu-int8" / "manifest.json").read_text())
    steps = manifest["components"]["model"]["steps"]
    task = next(s for s in steps if s["pass"] == "verify")["metrics"]["task_metric"]
    assert task["metric"] == "top-k-agreement" and task["values"]["samples"] == 8
    done = cli(*base, "-o", tmp_path / "p", "--task", "feature-extraction")
    assert done.exit_code == 0, done.stderr
    assert (
        "task: feature-extraction (as given); verify judges model by embedding-cosine"
        in done.stdout
    )
