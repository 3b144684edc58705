"""`compare` out of the box on a catalog build: sam3-tiny's npu/w8a16 decoder with no data
options (inputs as its build verified it, the float reference found from the build), the
layers ranked by the precision they lose on the target, the first divergence marked."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import RECIPES, cli

DECODER = "prompt_encoder_mask_decoder"
ROW = re.compile(r"^\s+(\d+)\s{2}(\S.{15}) (\S+)\s")


@pytest.fixture(scope="module")
def npu_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from winml_recipes import api

    out = tmp_path_factory.mktemp("compare")
    return api.build(
        RECIPES / "sam3-tiny.yaml", device="npu", precision="w8a16", output_root=out
    ).output_dir


def _rows(text: str) -> list[tuple[int, str]]:
    return [(int(m.group(1)), m.group(3)) for line in text.splitlines() if (m := ROW.match(line))]


def test_compare_the_npu_decoder_with_no_data_options(npu_build: Path) -> None:
    decoder = npu_build / DECODER
    done = cli("compare", decoder / "model.onnx", "--json")
    assert done.exit_code == 0, done.output
    report = json.loads(done.stdout)
    assert report["verified_on"] == "qnn-htp"
    # fed as the build verified it: the contract's fixed shapes, real embeddings
    assert "the build's input contract" in report["inputs_from"]
    assert "vision_encoder's float outputs" in report["inputs_from"]
    rows = {r["tensor"]: r for r in report["tensors"]}
    # on real embeddings the masks keep what verify measured (25 dB), not synthetic noise
    assert rows["pred_masks"]["target_vs_float_db"] > 20
    ranked = [rows[t] for t in report["ranking"]]
    assert sorted(report["ranking"]) == sorted(rows)
    noise = [r["noise_added"] for r in ranked]
    assert noise == sorted(noise, reverse=True) and noise[0] > noise[-1]

    # the component folder, no reference, no data
    text = cli("compare", decoder).stdout
    listed = _rows(text)
    assert [rank for rank, _ in listed[:15]] == list(range(1, 16))
    assert [name for _, name in listed[:15]] == [
        n if len(n) <= 21 else "~" + n[-20:] for n in report["ranking"][:15]
    ]
    assert f"top 15 of {len(rows)}; --all for every one" in text
    # the last line says where the target first departs from the simulation, or that it
    # does not (test_qnn's scatter graph is the case where HTP does)
    first = report["first_divergence"]
    if first is None:
        assert text.splitlines()[-1].startswith("no tensor departs from the simulation")
        assert "<- first divergence" not in text
    else:
        assert text.splitlines()[-1] == (
            f"first divergence: {first['tensor']} ({first['op_type']} {first['node']}): "
            f"{first['target_vs_float_db']:.1f} dB on the target vs "
            f"{first['simulation_vs_float_db']:.1f} dB simulated"
        )
        assert sum("<- first divergence" in line for line in text.splitlines()) == 1

    every = cli("compare", npu_build, "--component", DECODER, "--all").stdout
    assert [rank for rank, _ in _rows(every)] == list(range(1, len(rows) + 1))


def test_compare_a_build_model_with_an_explicit_float_reference(npu_build: Path) -> None:
    """The README's form, CANDIDATE REFERENCE, still works with no data options."""
    from winml_recipes.buildfolder import find_component, float_reference

    reference = float_reference(find_component(npu_build / DECODER))
    done = cli("compare", npu_build / DECODER / "model.onnx", reference, "--top", "3")
    assert done.exit_code == 0, done.output
    assert [rank for rank, _ in _rows(done.stdout)][:3] == [1, 2, 3]


@pytest.mark.ep_device("openvino")
def test_compare_on_another_ep(npu_build: Path) -> None:
    """--ep runs the candidate on another EP plugin serving the device (OpenVINO here, the
    CPU standing in for its NPU). Without its device: test_openvino_no_device.py."""
    done = cli("compare", npu_build / DECODER, "--ep", "openvino", "--json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["verified_on"] == "openvino"


def test_compare_on_an_ep_that_does_not_serve_the_device(npu_build: Path) -> None:
    """An EP that does not serve the build's device is one line, exit 2."""
    wrong = cli("compare", npu_build / DECODER, "--ep", "dml")
    assert wrong.exit_code == 2
    assert "execution provider 'dml' does not serve device 'npu'" in wrong.output
