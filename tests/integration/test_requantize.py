"""Already-quantized sources: the plan decides once; [dequantize, normalize, quantize]
turns an int8 QOperator-style SAM 3 (like the published files) into QDQ for the NPU."""

from __future__ import annotations

import shutil
from pathlib import Path

import onnx
import pytest
import yaml

from tests.conftest import CATALOG, RECIPES, sqnr_against_float_sam3
from winml_recipes import api
from winml_recipes.onnx.quant import detect_quantization
from winml_recipes.sdk.errors import PlanError

COMPONENTS = ("vision_encoder", "prompt_encoder_mask_decoder")


@pytest.fixture(scope="module")
def int8_project(tmp_path_factory, tiny_build) -> Path:
    """A catalog entry like catalog/sam3.yaml, at tiny shapes, over dynamic-int8 files."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = tmp_path_factory.mktemp("int8-sam3")
    (root / "catalog").mkdir()
    entry = yaml.safe_load((CATALOG / "sam3-tiny.yaml").read_text())
    entry["name"] = "sam3-int8-tiny"
    entry.pop("family")
    for comp in COMPONENTS:
        target = root / "catalog" / f"{comp}_int8.onnx"
        quantize_dynamic(str(tiny_build.models[comp]), str(target), weight_type=QuantType.QInt8)
        entry["components"][comp]["source"] = {"ref": f"./{comp}_int8.onnx"}
    (root / "catalog" / "sam3-int8-tiny.yaml").write_text(yaml.safe_dump(entry, sort_keys=False))
    return root


def _plan(project: Path, **kwargs):
    return api.plan(
        RECIPES / "sam3.yaml",
        defines={"model": "sam3-int8-tiny"},
        catalog_dir=project / "catalog",
        **kwargs,
    )


def test_sources_are_detected_as_quantized_once(int8_project) -> None:
    for comp in COMPONENTS:
        summary = detect_quantization(
            onnx.load(str(int8_project / "catalog" / f"{comp}_int8.onnx"))
        )
        assert summary.quantized and "MatMulInteger" in summary.describe()
    plan = _plan(int8_project)
    for comp in plan.components:
        assert comp.facts.quantized
        assert comp.steps[0].name == "dequantize" and comp.steps[0].skip is None


def test_without_dequantize_a_quantized_source_is_refused_for_another_precision(
    int8_project, tmp_path
) -> None:
    """The preset steps would skip normalize and quantize and ship the int8 source (u8
    activations at run time, s8 weights) as `cpu-int8` (s8/s8 QDQ, or this build's own choice
    of dynamic quantization where static misses the task): a label that is not what was
    built. Refused instead."""
    recipe = tmp_path / "recipes" / "r.yaml"
    recipe.parent.mkdir()
    shutil.copytree(int8_project / "catalog", tmp_path / "catalog")
    recipe.write_text(
        "schema_version: 1\nname: r\nmodel: sam3-int8-tiny\n"
        "targets: [{device: cpu, precision: int8}]\n"  # steps from the presets
    )
    with pytest.raises(PlanError) as err:
        api.plan(recipe)
    text = str(err.value)
    assert "vision_encoder: the output would stay as quantized as the source (" in text
    assert "MatMulInteger x" in text and "asks for int8 activations and int8 weights" in text
    assert "add a dequantize step before quantize" in text and "\n" not in text


def test_requantize_for_npu_matches_the_original_float_model(int8_project, tiny_build, tmp_path):

    result = api.build(
        RECIPES / "sam3.yaml",
        defines={"model": "sam3-int8-tiny"},
        catalog_dir=int8_project / "catalog",
        device="npu",
        precision="w8a16",
        output_root=tmp_path,
    )
    for comp in COMPONENTS:
        steps = {s["pass"]: s for s in result.manifest["components"][comp]["steps"]}
        assert steps["dequantize"]["status"] == "ran"
        assert "replaced" in steps["dequantize"]["metrics"]["summary"]
        built = onnx.load(str(result.models[comp]))
        summary = detect_quantization(built)
        assert summary.formats == ("qdq",), summary.describe()
        assert not {"MatMulInteger", "ConvInteger", "DynamicQuantizeLinear"} & set(summary.counts)
    # Against the ORIGINAL float sam3-tiny, on inputs neither calibration nor verify used.
    sqnr = sqnr_against_float_sam3(tiny_build.models, result.models)
    print("requantized vs original float:", sqnr)
    assert min(sqnr[f"image_embeddings.{i}"] for i in range(3)) >= 28, sqnr
    assert sqnr["iou_scores"] >= 30 and sqnr["pred_masks"] >= 20, sqnr
