"""`winml-recipes init`: a starting catalog entry and recipe that validate as written."""

from __future__ import annotations

import onnx
import yaml
from onnx import TensorProto, helper

from tests.conftest import cli, make_mlp_onnx
from tests.hubserver import LocalHub, local_hub, point_hf_at  # noqa: F401  (fixture)
from winml_recipes import api


def _image_model(path):
    """Conv over [batch, 3, height, width]: `height`/`width` have no obvious default."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [2, 3, 1, 1], [0.1] * 6)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["pixels", "w"], ["features"], name="conv")],
        "img",
        [
            helper.make_tensor_value_info(
                "pixels", TensorProto.FLOAT, ["batch", 3, "height", "width"]
            )
        ],
        [
            helper.make_tensor_value_info(
                "features", TensorProto.FLOAT, ["batch", 2, "height", "width"]
            )
        ],
        initializer=[w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, str(path))
    return path


def test_init_local_file_validates_and_builds(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    make_mlp_onnx(tmp_path / "mlp.onnx")
    result = cli("init", "./mlp.onnx")
    assert result.exit_code == 0, result.stderr
    entry = yaml.safe_load((tmp_path / "catalog" / "mlp.yaml").read_text())
    component = entry["components"]["model"]
    assert component["source"] == {"ref": "../mlp.onnx"}
    assert component["inputs"]["x"]["shape"] == ["batch", 4]
    assert component["dims"] == {"batch": 1}
    assert cli("validate", "recipes/mlp.yaml").exit_code == 0
    targets = api.targets_of(tmp_path / "recipes" / "mlp.yaml")
    assert ("cpu", "fp32") in targets and ("npu", "w8a16") in targets
    built = api.build(tmp_path / "recipes" / "mlp.yaml", output_root=tmp_path / "out")
    assert built.models["model"].is_file()


def test_init_marks_guessed_dims_with_todo(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    _image_model(tmp_path / "enc.onnx")
    assert cli("init", "./enc.onnx", "--name", "enc").exit_code == 0
    text = (tmp_path / "catalog" / "enc.yaml").read_text()
    assert "height: 1  # TODO" in text and "width: 1  # TODO" in text
    assert "batch: 1\n" in text  # an obvious default needs no TODO
    assert cli("validate", "recipes/enc.yaml").exit_code == 0


def test_init_never_overwrites(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    make_mlp_onnx(tmp_path / "mlp.onnx")
    assert cli("init", "./mlp.onnx").exit_code == 0
    before = (tmp_path / "recipes" / "mlp.yaml").read_text()
    again = cli("init", "./mlp.onnx")
    assert again.exit_code == 2 and "never overwrites" in again.stderr
    assert (tmp_path / "recipes" / "mlp.yaml").read_text() == before


def test_init_refuses_what_is_not_an_onnx_file(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = cli("init", "google-bert/bert-base-uncased")
    assert result.exit_code == 2 and "not an ONNX file" in result.stderr
    assert not (tmp_path / "catalog").exists()


def test_init_from_a_hub_ref_pins_the_commit(local_hub, tmp_path, monkeypatch) -> None:  # noqa: F811
    make_mlp_onnx(tmp_path / "m.onnx")
    local_hub.add_file("acme/tiny-mlp", "onnx/model.ONNX", (tmp_path / "m.onnx").read_bytes())
    point_hf_at(local_hub, tmp_path / "hf", monkeypatch)
    monkeypatch.chdir(tmp_path)
    result = cli("init", "acme/tiny-mlp/onnx/model.ONNX", "--name", "tiny-mlp")
    assert result.exit_code == 0, result.stderr
    source = yaml.safe_load((tmp_path / "catalog" / "tiny-mlp.yaml").read_text())["components"][
        "model"
    ]["source"]
    assert source == {
        "ref": "acme/tiny-mlp/onnx/model.ONNX",
        "revision": local_hub.commit("acme/tiny-mlp"),
    }
    plan = api.plan(tmp_path / "recipes" / "tiny-mlp.yaml")
    assert plan.components[0].source.revision == local_hub.commit("acme/tiny-mlp")
