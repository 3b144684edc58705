"""The SAM 3 recipe end to end against a local Hub serving the published layout: float32
files (the encoder's weights in an .onnx_data sidecar) and int8 QOperator files, under the
real repo and paths, built for the NPU from either source."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
import yaml

from tests.conftest import CATALOG, RECIPES, cli, sqnr_against_float_sam3
from tests.hubserver import LocalHub, local_hub, point_hf_at  # noqa: F401  (fixture)
from winml_recipes import api

REPO_ID = "onnx-community/sam3-tracker-ONNX"
FLOAT = {
    "vision_encoder": "onnx/vision_encoder.onnx",
    "prompt_encoder_mask_decoder": "onnx/prompt_encoder_mask_decoder.onnx",
}
FILES = {
    "vision_encoder": "onnx/vision_encoder_int8.onnx",
    "prompt_encoder_mask_decoder": "onnx/prompt_encoder_mask_decoder_int8.onnx",
}


def _with_sidecar(model: onnx.ModelProto, target: Path, out: dict[str, bytes], path: str) -> None:
    onnx.save_model(
        model,
        str(target),
        save_as_external_data=True,
        location=target.name + "_data",
        size_threshold=1024,
    )
    out[path + "_data"] = (target.parent / (target.name + "_data")).read_bytes()
    out[path] = target.read_bytes()


@pytest.fixture(scope="module")
def int8_files(tmp_path_factory, tiny_build) -> dict[str, bytes]:
    """sam3-tiny as published: float32 and quantized; the encoders' weights in sidecars."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = tmp_path_factory.mktemp("int8")
    out: dict[str, bytes] = {}
    for comp, path in FILES.items():
        target = root / Path(path).name
        quantize_dynamic(str(tiny_build.models[comp]), str(target), weight_type=QuantType.QInt8)
        if comp == "vision_encoder":
            model = onnx.load(str(target))
            target.unlink()
            _with_sidecar(model, target, out, path)
        else:
            out[path] = target.read_bytes()
        float_path = FLOAT[comp]
        model = onnx.load(str(tiny_build.models[comp]))
        if comp == "vision_encoder":
            _with_sidecar(model, root / Path(float_path).name, out, float_path)
        else:
            out[float_path] = model.SerializeToString()
    return out


@pytest.fixture
def hub(local_hub: LocalHub, int8_files, tmp_path: Path, monkeypatch) -> LocalHub:  # noqa: F811
    for path, data in int8_files.items():
        local_hub.add_file(REPO_ID, path, data)
    point_hf_at(local_hub, tmp_path / "hf", monkeypatch)
    return local_hub


@pytest.fixture
def tiny_hub_catalog(tmp_path: Path) -> Path:
    """catalog/sam3.yaml with its Hub refs, at the tiny model's shapes."""
    real = yaml.safe_load((CATALOG / "sam3.yaml").read_text())
    tiny = yaml.safe_load((CATALOG / "sam3-tiny.yaml").read_text())
    real["name"] = "sam3-hub-tiny"
    for comp, spec in real["components"].items():
        for key in ("dims", "inputs", "outputs"):
            spec[key] = tiny["components"][comp][key]
    directory = tmp_path / "catalog"
    directory.mkdir()
    (directory / "sam3-hub-tiny.yaml").write_text(yaml.safe_dump(real, sort_keys=False))
    return directory


def _build(catalog: Path, out: Path, source: str | None = "int8"):
    return api.build(
        RECIPES / "sam3.yaml",
        # At 112 px the emulated HTP prepares the encoder too: verify and compile it there.
        defines={"model": "sam3-hub-tiny", "htp_encoder": True},
        catalog_dir=catalog,
        device="npu",
        precision="w8a16",
        output_root=out,
        source=source,
    )


def test_hub_ls_lists_both_files_and_the_sidecar(hub: LocalHub) -> None:
    result = cli("hub", "ls", REPO_ID, "--json")
    assert result.exit_code == 0, result.stderr
    rows = {r["path"]: r for r in json.loads(result.stdout)}
    assert set(rows) == set(FILES.values()) | set(FLOAT.values())
    vision = rows[FILES["vision_encoder"]]
    assert list(vision["sidecars"]) == [FILES["vision_encoder"] + "_data"]
    assert vision["commit"] == hub.commit(REPO_ID)
    text = cli("hub", "ls", REPO_ID).stdout
    assert FILES["prompt_encoder_mask_decoder"] in text and "+ onnx/vision_encoder_int8" in text


def test_sam3_recipe_builds_from_the_hub_and_rebuilds_from_cache(
    hub: LocalHub, tiny_hub_catalog: Path, tiny_build, tmp_path: Path
) -> None:
    first = _build(tiny_hub_catalog, tmp_path / "a")
    commit = hub.commit(REPO_ID)
    for comp, path in FILES.items():
        record = first.manifest["components"][comp]
        assert record["source"]["kind"] == "hub_onnx"
        assert record["source"]["revision"] == commit
        assert record["source"]["ref"] == f"{REPO_ID}@main/{path}"
        statuses = {s["pass"]: s["status"] for s in record["steps"]}
        # The quantize step may come from the cache: its input (the dequantized graph) can
        # be byte-identical to one another test built from a local file.
        assert statuses["dequantize"] in ("ran", "cached"), statuses
        assert statuses["quantize"] in ("ran", "cached"), statuses
    sqnr = sqnr_against_float_sam3(tiny_build.models, first.models)
    print("hub-built w8a16 vs float sam3-tiny:", sqnr)
    assert min(sqnr[f"image_embeddings.{i}"] for i in range(3)) >= 28, sqnr
    assert sqnr["iou_scores"] >= 30 and sqnr["pred_masks"] >= 20, sqnr

    model_gets = len([r for r in hub.requests if r[0] == "GET" and ".onnx" in r[1]])
    second = _build(tiny_hub_catalog, tmp_path / "b")
    assert len([r for r in hub.requests if r[0] == "GET" and ".onnx" in r[1]]) == model_gets
    for comp in FILES:
        steps = second.manifest["components"][comp]["steps"]
        assert {s["status"] for s in steps} <= {"cached", "skipped"}
        assert second.models[comp].read_bytes() == first.models[comp].read_bytes()


def test_hub_down_is_one_line_and_writes_nothing(
    hub: LocalHub, tiny_hub_catalog: Path, tmp_path: Path
) -> None:
    hub.stop()
    result = cli(
        "build",
        RECIPES / "sam3.yaml",
        "-D",
        "model=sam3-hub-tiny",
        "--catalog",
        tiny_hub_catalog,
        "-o",
        tmp_path / "out",
    )
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot reach" in lines[0] and REPO_ID in lines[0], lines
    assert not (tmp_path / "out").exists()


def test_sam3_builds_from_the_float_source_by_default(
    hub: LocalHub, tiny_hub_catalog: Path, tiny_build, tmp_path: Path
) -> None:
    """Requantized from the published float32 graphs; verified against them, not against
    a dequantized int8 graph."""
    built = _build(tiny_hub_catalog, tmp_path / "a", source=None)
    assert built.manifest["source"] == "fp32"
    for comp, path in FLOAT.items():
        record = built.manifest["components"][comp]
        assert record["source"]["ref"] == f"{REPO_ID}@main/{path}"
        steps = {s["pass"]: s for s in record["steps"]}
        assert steps["dequantize"]["status"] == "skipped"
        assert steps["verify"]["status"] in ("ran", "cached")
    sqnr = sqnr_against_float_sam3(tiny_build.models, built.models)
    print("hub-built (fp32 source) w8a16 vs float sam3-tiny:", sqnr)
    assert min(sqnr[f"image_embeddings.{i}"] for i in range(3)) >= 28, sqnr
    assert sqnr["iou_scores"] >= 30 and sqnr["pred_masks"] >= 20, sqnr


def test_unknown_source_is_one_line(hub: LocalHub, tiny_hub_catalog: Path, tmp_path) -> None:
    result = cli(
        "build", RECIPES / "sam3.yaml", "-D", "model=sam3-hub-tiny", "--catalog",
        tiny_hub_catalog, "--source", "fp16", "-o", tmp_path / "out",
    )  # fmt: skip
    assert result.exit_code == 2
    assert result.stderr.strip() == ("error: --source: unknown source 'fp16'; known: fp32, int8")
