"""SAM (v1, `SamModel`) and SAM 2.1 (`Sam2Model`) through the machinery that serves SAM 3:
`init FOLDER` on a `save_pretrained` folder writes a two-component mask-generation entry and
a recipe; the builds are judged by mask IoU against the float model on the bundled photos,
on QNN HTP (CPU fallback off) for npu/w8a16."""

from __future__ import annotations

import re

import numpy as np
import pytest
import yaml

from tests.conftest import CATALOG, RECIPES, cli
from tests.sam_tiny import save_tiny, tiny_sam2_config
from winml_recipes import api

pytest.importorskip("transformers")

DECODER = "prompt_encoder_mask_decoder"


def _shapes(component: dict) -> dict[str, dict[str, list]]:
    return {
        kind: {n: t["shape"] for n, t in component[kind].items()} for kind in ("inputs", "outputs")
    }


def _init(tmp_path, monkeypatch, kind: str) -> dict:
    monkeypatch.chdir(tmp_path)
    save_tiny(kind, tmp_path / f"{kind}-dir")
    result = cli("init", f"./{kind}-dir", "--name", kind)
    assert result.exit_code == 0, result.stderr
    return yaml.safe_load((tmp_path / "catalog" / f"{kind}.yaml").read_text())


def test_init_a_sam2_folder_gives_the_curated_two_component_entry(tmp_path, monkeypatch):
    """Today's `init` read SAM 2.1's nested configs as one flat config: `d_model is 0`."""
    made = _init(tmp_path, monkeypatch, "sam2")
    curated = yaml.safe_load((CATALOG / "sam2.1-tiny.yaml").read_text())
    assert (made["family"], made["task"]) == ("sam2", "mask-generation")
    assert list(made["components"]) == ["vision_encoder", DECODER]
    for name, spec in curated["components"].items():
        assert _shapes(made["components"][name]) == _shapes(spec), name
        assert made["components"][name]["source"] == {"ref": "../sam2-dir"}
    pixels = made["components"]["vision_encoder"]["inputs"]["pixel_values"]
    assert pixels["image"] == {"size": 128, "mean": [0.485, 0.456, 0.406],
                               "std": [0.229, 0.224, 0.225], "layout": "NCHW"}  # fmt: skip
    recipe = (tmp_path / "recipes" / "sam2.yaml").read_text()
    assert '{% include "sam-components.yaml" %}' in recipe
    assert cli("validate", "recipes/sam2.yaml").exit_code == 0
    targets = api.targets_of(tmp_path / "recipes" / "sam2.yaml")
    assert {(d, p) for d, p, _ in targets} == {("cpu", "fp32"), ("npu", "w8a16"), ("cpu", "int8")}


def test_init_a_sam_folder_gives_one_embedding_and_no_object_score(tmp_path, monkeypatch):
    """SAM (v1): one embedding [B, output_channels, S/patch, S/patch], masks 4x its side."""
    made = _init(tmp_path, monkeypatch, "sam")
    assert (made["family"], made["task"]) == ("sam", "mask-generation")
    vision, decoder = (_shapes(made["components"][c]) for c in ("vision_encoder", DECODER))
    assert vision == {
        "inputs": {"pixel_values": ["batch", 3, 128, 128]},
        "outputs": {"image_embeddings": ["batch", 32, 8, 8]},
    }
    assert decoder == {
        "inputs": {
            "input_points": ["batch", 1, "points", 2],
            "input_labels": ["batch", 1, "points"],
            "input_boxes": ["batch", 1, 4],
            "image_embeddings": ["batch", 32, 8, 8],
        },
        "outputs": {"iou_scores": ["batch", 1, 3], "pred_masks": ["batch", 1, 3, 32, 32]},
    }
    assert cli("validate", "recipes/sam.yaml").exit_code == 0


def test_sam2_entries_match_transformers_configs() -> None:
    """The full-size entry's contract is what the exporter derives from Sam2Config's defaults
    (transformers ships facebook/sam2.1-hiera-tiny's sizes as them), its revision a pinned
    commit; the tiny entry's is its own config's."""
    from transformers import Sam2Config

    from winml_recipes.exporters import sam

    full = yaml.safe_load((CATALOG / "sam2.1-hiera-tiny.yaml").read_text())
    derived = sam.catalog_components(Sam2Config())
    for name, spec in full["components"].items():
        assert _shapes(derived[name]) == _shapes(spec), name
        assert spec["source"]["ref"] == "facebook/sam2.1-hiera-tiny"
        assert re.fullmatch(r"[0-9a-f]{40}", spec["source"]["revision"])
    fields = tiny_sam2_config()
    fields.pop("model_type")
    tiny = yaml.safe_load((CATALOG / "sam2.1-tiny.yaml").read_text())
    derived = sam.catalog_components(Sam2Config(**fields))
    for name, spec in tiny["components"].items():
        assert _shapes(derived[name]) == _shapes(spec), name
        assert derived[name]["inputs"].get("pixel_values", {}).get("range") == (
            spec["inputs"].get("pixel_values", {}).get("range")
        )


# --------------------------------------------------------------------------- builds (slow)


def _task(result, component: str = DECODER) -> dict:
    steps = {s["pass"]: s for s in result.manifest["components"][component]["steps"]}
    return steps["verify"]["metrics"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("sam-family")
    for kind in ("sam", "sam2"):
        save_tiny(kind, root / f"{kind}-dir")
        result = cli("init", str(root / f"{kind}-dir"), "--name", kind,
                     "--catalog", root / "catalog", "--recipes", root / "recipes")  # fmt: skip
        assert result.exit_code == 0, result.stderr
    return root


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sam", "sam2"])
def test_init_folder_builds_npu_w8a16_on_htp_judged_by_mask_iou(folders, kind) -> None:
    result = api.build(folders / "recipes" / f"{kind}.yaml", device="npu", precision="w8a16",
                       output_root=folders / "out")  # fmt: skip
    for comp in ("vision_encoder", DECODER):
        verify = _task(result, comp)
        assert verify["verified_on"] == "qnn-htp" and verify["cpu_fallback_allowed"] is False
        assert set(verify["placement"]["nodes"]) == {"QNNExecutionProvider"}
    task = _task(result)["task_metric"]
    assert task["metric"] == "mask-agreement"
    assert task["values"]["mask_iou"] >= 0.9, task
    assert task["values"]["chosen_mask_agreement"] >= 0.9, task
    # the decoder saw the float encoder's embeddings of the bundled photos, not noise
    steps = {s["pass"]: s for s in result.manifest["components"][DECODER]["steps"]}
    assert steps["quantize"]["metrics"]["calibration_source"].startswith("inputs_from: vision")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sam", "sam2"])
def test_init_folder_builds_cpu_int8_judged_by_mask_iou(folders, kind) -> None:
    result = api.build(folders / "recipes" / f"{kind}.yaml", device="cpu", precision="int8",
                       output_root=folders / "out")  # fmt: skip
    task = _task(result)["task_metric"]
    assert task["values"]["mask_iou"] >= 0.85, task  # the partial's int8 gate
    assert _task(result, "vision_encoder")["verified_on"] == "cpu"


@pytest.mark.slow
def test_sam2_tiny_recipe_builds_on_htp_and_runs_on_a_photo_with_a_point(tmp_path) -> None:
    """`make build MODEL=sam2.1-tiny`, then `run --image --point` as for SAM 3."""
    from tests.conftest import cli_subprocess
    from winml_recipes.runbuild import sample_photo

    result = api.build(RECIPES / "sam2.1-tiny.yaml", device="npu", precision="w8a16",
                       output_root=tmp_path / "out")  # fmt: skip
    assert _task(result)["task_metric"]["values"]["mask_iou"] >= 0.9
    run = cli_subprocess("run", result.output_dir, "--image", sample_photo(),
                         "--point", "40,60", "--json")  # fmt: skip
    assert run.returncode == 0, run.stderr
    import json

    summary = json.loads(run.stdout)
    assert summary["task_metric"]["metric"] == "mask-agreement"
    assert summary["task_metric"]["values"]["mask_iou"] >= 0.8
    assert summary["points"][0]["x"] == 40.0
    outputs = np.load(summary["outputs"])
    assert any("pred_masks" in k for k in outputs.files)
