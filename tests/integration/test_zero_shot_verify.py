"""Zero-shot image classification judged inside verify (issue 33, stop 39): a CLIP two-tower
build from `init` of a tiny `save_pretrained` folder; the image tower's verify runs the
text tower on the label prompts (float, and the text tower's judged candidate where its own
candidate ran) and gates the top-1 agreement of the image-text similarities of the bundled
held-out photos. Before: each tower was judged alone (embedding cosine); zero-shot only in
bench/text_families.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from tests import text_families
from tests.conftest import cli


def _init_clip(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    done = cli("init", text_families.saved("clip", tmp_path / "models"), "--name", "clip")
    assert done.exit_code == 0, done.stderr


def _vision_verify(out, target: str) -> dict:
    folder = out / "clip" / target
    folder = folder if folder.is_dir() else folder.with_name(f"{target}.failed")
    manifest = json.loads((folder / "manifest.json").read_text())
    steps = manifest["components"]["vision_model"]["steps"]
    return next(s for s in steps if s["pass"] == "verify")["metrics"]


def _independent(out, target: str, device: str) -> dict:
    """The same agreement computed outside the build: the shipped float references and the
    built towers run here on the held-out photos and the prompts (tests/text_families.py)."""
    folder = out / "clip" / target
    return text_families.zero_shot(folder, device, folder.parents[2] / "catalog" / "clip.yaml")


def test_cpu_int8_build_gates_zero_shot_agreement(tmp_path, monkeypatch) -> None:
    """cpu/int8 from the presets: the vision tower's verify records the towers' zero-shot
    top-1 agreement with its gate and margin; the number is the one the built towers give
    when run outside the build; a threshold above it fails the build naming the gate."""
    _init_clip(tmp_path, monkeypatch)
    recipe = tmp_path / "recipes" / "clip.yaml"
    done = cli("build", recipe, "--device", "cpu", "--precision", "int8", "-o", tmp_path / "out")
    assert done.exit_code == 0, done.stderr[-1500:]
    record = _vision_verify(tmp_path / "out", "cpu-int8")
    zero_shot = record["zero_shot"]
    assert zero_shot["with"] == "text_model" and len(zero_shot["prompts"]) == 8
    values = zero_shot["values"]
    assert values["images"] == 8 and values["labels"] == 8  # the bundled held-out photos
    gate = next(g for g in record["gates"] if g["output"] == "zero-shot")
    assert gate["metric"] == "top1_agreement_decisive"
    assert gate["value"] == values["top1_agreement_decisive"]
    assert gate["margin"] == pytest.approx(gate["value"] - gate["threshold"])
    again = _independent(tmp_path / "out", "cpu-int8", "cpu")
    assert again["top1_agreement"] == values["top1_agreement"]
    assert again["top1_agreement_decisive"] == values["top1_agreement_decisive"]
    assert np.isclose(again["similarity_max_abs"], values["similarity_max_abs"], atol=1e-6)

    # the same build held to every decided label agreeing (the threshold's maximum):
    # fails on that gate where one flipped
    data = yaml.safe_load(recipe.read_text())
    data["components"] = {
        "vision_model": {
            "steps": [
                "export",
                "normalize",
                "quantize",
                {"verify": {"zero_shot_with": "text_model", "zero_shot_min_top1": 1.0,
                            "min_sqnr_db": 0, "min_cosine": 0}},
            ]
        }
    }  # fmt: skip
    recipe.write_text(yaml.safe_dump(data))
    done = cli("build", recipe, "--device", "cpu", "--precision", "int8", "-o", tmp_path / "o2")
    if values["top1_agreement_decisive"] == 1.0:
        assert done.exit_code == 0, done.stderr[-1500:]
    else:
        assert done.exit_code == 3, done.stderr[-1500:]
        assert "zero-shot: top1_agreement_decisive" in done.stderr, done.stderr[-1500:]


@pytest.mark.slow
def test_npu_w8a16_judges_zero_shot_on_htp(tmp_path, monkeypatch) -> None:
    """npu/w8a16 from the presets: the zero-shot agreement is measured on HTP (text tower's
    QDQ model on HTP too), with the CPU simulation's beside it, and gates the build."""
    _init_clip(tmp_path, monkeypatch)
    recipe = tmp_path / "recipes" / "clip.yaml"
    done = cli("build", recipe, "--device", "npu", "--precision", "w8a16", "-o", tmp_path / "out")
    record = _vision_verify(tmp_path / "out", "npu-w8a16")
    assert record["verified_on"] == "qnn-htp"
    values = record["zero_shot"]["values"]
    assert set(record["cpu_simulation"]["zero_shot"]) == set(values)
    gate = next(g for g in record["gates"] if g["output"] == "zero-shot")
    assert gate["passed"] == (values["top1_agreement_decisive"] >= gate["threshold"])
    assert done.exit_code == (0 if gate["passed"] else 3), done.stderr[-1500:]
    again = _independent(tmp_path / "out", "npu-w8a16", "npu")  # the compiled towers on HTP
    assert again["top1_agreement"] == values["top1_agreement"]
    assert again["top1_agreement_decisive"] == values["top1_agreement_decisive"]
