"""`winml-recipes init`: a starting catalog entry and recipe that validate as written."""

from __future__ import annotations

import onnx
import yaml
from onnx import TensorProto, helper

from tests.conftest import CATALOG, cli, make_mlp_onnx
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
    assert ("cpu", "fp32", None) in targets and ("npu", "w8a16", None) in targets
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


def test_init_refuses_a_catalog_name_and_a_dir_without_config(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = cli("init", "sam3")
    assert result.exit_code == 2 and "is a catalog name" in result.stderr
    (tmp_path / "empty").mkdir()
    result = cli("init", "./empty")
    assert result.exit_code == 2 and "has no config.json" in result.stderr
    assert not (tmp_path / "catalog").exists()


def _tiny_sam3_config_dir(path):
    from transformers import Sam3TrackerConfig

    fields = dict(
        yaml.safe_load((CATALOG / "sam3-tiny.yaml").read_text())["components"]["vision_encoder"][
            "source"
        ]["config"]
    )
    fields.pop("model_type")
    Sam3TrackerConfig(**fields).save_pretrained(str(path))
    return path


def test_init_from_a_sam3_config_matches_the_curated_contract(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    _tiny_sam3_config_dir(tmp_path / "sam3dir")
    assert cli("init", "./sam3dir", "--name", "s3").exit_code == 0
    made = yaml.safe_load((tmp_path / "catalog" / "s3.yaml").read_text())
    curated = yaml.safe_load((CATALOG / "sam3-tiny.yaml").read_text())
    assert made["family"] == "sam3_tracker"
    for comp, spec in curated["components"].items():
        for kind in ("inputs", "outputs"):
            got = {n: t["shape"] for n, t in made["components"][comp][kind].items()}
            want = {n: t["shape"] for n, t in spec[kind].items()}
            assert got == want, (comp, kind)
        assert made["components"][comp]["source"] == {"ref": "../sam3dir"}
    assert cli("validate", "recipes/s3.yaml").exit_code == 0


def test_init_from_a_local_hf_dir_builds(tmp_path, monkeypatch) -> None:
    import torch
    from transformers import BertConfig, BertModel

    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    config = BertConfig(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        vocab_size=100,
    )
    BertModel(config).save_pretrained(str(tmp_path / "tiny-bert"))
    assert cli("init", "./tiny-bert").exit_code == 0
    entry = yaml.safe_load((tmp_path / "catalog" / "tiny-bert.yaml").read_text())
    model = entry["components"]["model"]
    assert entry["family"] == "auto" and model["task"] == "feature-extraction"
    assert model["outputs"]["last_hidden_state"]["shape"] == ["batch", "sequence", 32]
    assert "sequence: 16  # TODO" in (tmp_path / "catalog" / "tiny-bert.yaml").read_text()
    built = api.build(tmp_path / "recipes" / "tiny-bert.yaml", output_root=tmp_path / "out")
    steps = {s["pass"]: s for s in built.manifest["components"]["model"]["steps"]}
    assert steps["export"]["metrics"]["torch_parity"]["last_hidden_state"]["sqnr_db"] > 60
    # cpu/fp32: nothing after the export changed the model, so there is nothing to verify
    assert steps["verify"]["status"] == "skipped"
    assert "no step changed it" in steps["verify"]["reason"]


def test_init_keeps_the_head_the_config_names(tmp_path, monkeypatch) -> None:
    """A BertForSequenceClassification directory is a text classifier, not features."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    config = BertConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        vocab_size=100, num_labels=3,
    )  # fmt: skip
    BertForSequenceClassification(config).save_pretrained(str(tmp_path / "clf"))
    assert cli("init", "./clf").exit_code == 0
    model = yaml.safe_load((tmp_path / "catalog" / "clf.yaml").read_text())["components"]["model"]
    assert model["task"] == "text-classification"
    assert model["outputs"] == {"logits": {"dtype": "float32", "shape": ["batch", 3]}}
    built = api.build(
        tmp_path / "recipes" / "clf.yaml",
        device="cpu",
        precision="int8",
        output_root=tmp_path / "out",
    )
    graph = onnx.load(str(built.models["model"])).graph
    assert [o.name for o in graph.output] == ["logits"]


def test_init_reads_the_image_preprocessing(tmp_path, monkeypatch) -> None:
    import json

    import torch
    from transformers import ConvNextConfig, ConvNextForImageClassification

    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    config = ConvNextConfig(
        hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1], image_size=64, num_labels=5
    )
    ConvNextForImageClassification(config).save_pretrained(str(tmp_path / "cls"))
    (tmp_path / "cls" / "preprocessor_config.json").write_text(
        json.dumps(
            {"size": {"shortest_edge": 64}, "image_mean": [0.5, 0.4, 0.3],
             "image_std": [0.25, 0.2, 0.1]}
        )
    )  # fmt: skip
    assert cli("init", "./cls").exit_code == 0
    entry = yaml.safe_load((tmp_path / "catalog" / "cls.yaml").read_text())
    pixels = entry["components"]["model"]["inputs"]["pixel_values"]
    assert pixels["shape"] == ["batch", 3, 64, 64]
    assert pixels["image"] == {
        "size": 64, "mean": [0.5, 0.4, 0.3], "std": [0.25, 0.2, 0.1], "layout": "NCHW"
    }  # fmt: skip
    # (0 - 0.3) / 0.1 = -3 is the lowest, (1 - 0.3) / 0.1 = 7 the highest normalized value
    assert pixels["range"] == [-3.0, 7.0]
    assert cli("validate", tmp_path / "recipes" / "cls.yaml").exit_code == 0


def test_init_from_an_hf_id_reads_its_config_from_the_hub(local_hub, tmp_path, monkeypatch):  # noqa: F811
    config = tmp_path / "cfg"
    _tiny_sam3_config_dir(config)
    local_hub.add_file("acme/sam3-tiny", "config.json", (config / "config.json").read_bytes())
    point_hf_at(local_hub, tmp_path / "hf", monkeypatch)
    monkeypatch.chdir(tmp_path)
    assert cli("init", "acme/sam3-tiny").exit_code == 0
    entry = yaml.safe_load((tmp_path / "catalog" / "sam3-tiny.yaml").read_text())
    source = entry["components"]["vision_encoder"]["source"]
    assert source == {"ref": "acme/sam3-tiny", "revision": local_hub.commit("acme/sam3-tiny")}
    assert cli("validate", "recipes/sam3-tiny.yaml").exit_code == 0


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


def test_init_outside_the_repo_writes_a_project_that_resolves(tmp_path, monkeypatch) -> None:
    """From any folder: the `$schema` comments point at files that exist, and the printed
    next command works as printed (it names the catalog folder when it is not the default)."""
    import re
    import shlex

    monkeypatch.chdir(tmp_path)
    model = make_mlp_onnx(tmp_path / "m.onnx")
    result = cli("init", str(model), "--name", "m", "--catalog", "entries", "--recipes", "r")
    assert result.exit_code == 0, result.stderr
    for written in (tmp_path / "entries" / "m.yaml", tmp_path / "r" / "m.yaml"):
        ref = re.search(r"\$schema=(\S+)", written.read_text()).group(1)
        assert (written.parent / ref).is_file(), ref
    printed = result.stdout.strip().splitlines()[-2:]
    assert printed == [
        "next: winml-recipes validate r/m.yaml --catalog entries",
        "next: winml-recipes build r/m.yaml --catalog entries",
    ]
    for line in printed:
        ran = cli(*shlex.split(line.removeprefix("next: winml-recipes ")))
        assert ran.exit_code == 0, ran.stderr
    assert (tmp_path / "build" / "m" / "cpu-fp32" / "model" / "model.onnx").is_file()
