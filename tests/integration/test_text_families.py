"""Text, two-tower and image-embedding families (issue 33): a tiny `save_pretrained` folder
(random weights) through `init` and `build`, judged by the family's task metric on QNN HTP
(CPU fallback off) and on cpu/int8. CI runs the init contracts, the refusals and one HTP
build (question answering); every family's builds are `slow`."""

from __future__ import annotations

import pytest
import yaml

from tests import text_families
from tests.conftest import cli
from winml_recipes import api

# arch: family, task, {component: (inputs, outputs)}
CONTRACTS = {
    "dinov2": ("auto", "image-feature-extraction",
               {"model": (["pixel_values"], ["last_hidden_state", "pooler_output"])}),
    "siglip-vision": ("auto", "image-feature-extraction",
                      {"model": (["pixel_values"], ["last_hidden_state", "pooler_output"])}),
    "clip-vision-projection": ("auto", "image-embedding",
                               {"model": (["pixel_values"], ["image_embeds"])}),
    "clip": ("two_tower", "zero-shot-image-classification",
             {"text_model": (["input_ids", "attention_mask"], ["text_embeds"]),
              "vision_model": (["pixel_values"], ["image_embeds"])}),
    "siglip": ("two_tower", "zero-shot-image-classification",
               {"text_model": (["input_ids"], ["text_embeds"]),
                "vision_model": (["pixel_values"], ["image_embeds"])}),
    "distilbert-qa": ("auto", "question-answering",
                      {"model": (["input_ids", "attention_mask"], ["start_logits", "end_logits"])}),
}  # fmt: skip
# the task metric verify judges each family by
METRICS = {
    "dinov2": "embedding-cosine", "siglip-vision": "embedding-cosine",
    "clip-vision-projection": "embedding-cosine", "clip": "embedding-cosine",
    "siglip": "embedding-cosine", "distilbert-qa": "span-agreement",
    "bert-token": "token-label-agreement", "bge": "embedding-cosine",
    "t5-encoder": "embedding-cosine", "deberta-v3": "top-k-agreement",
}  # fmt: skip


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return tmp_path_factory.mktemp("families")


def _init(arch: str, folders, tmp_path, monkeypatch) -> dict:
    monkeypatch.chdir(tmp_path)
    result = cli("init", text_families.saved(arch, folders), "--name", arch)
    assert result.exit_code == 0, result.stderr
    return yaml.safe_load((tmp_path / "catalog" / f"{arch}.yaml").read_text())


@pytest.mark.parametrize("arch", list(CONTRACTS))
def test_init_serves_the_family_with_its_inputs(arch, folders, tmp_path, monkeypatch) -> None:
    """Vision backbones take pixels (not input_ids), CLIP / SigLIP are two towers read from
    their nested configs, QA keeps its span head."""
    entry = _init(arch, folders, tmp_path, monkeypatch)
    family, task, components = CONTRACTS[arch]
    assert (entry["family"], entry["task"]) == (family, task)
    got = {c: (list(s["inputs"]), list(s["outputs"])) for c, s in entry["components"].items()}
    assert got == {c: (list(i), list(o)) for c, (i, o) in components.items()}
    assert cli("validate", f"recipes/{arch}.yaml").exit_code == 0


def test_init_reads_the_towers_sizes_and_preprocessing(folders, tmp_path, monkeypatch) -> None:
    entry = _init("clip", folders, tmp_path, monkeypatch)
    vision = entry["components"]["vision_model"]
    pixel = vision["inputs"]["pixel_values"]
    # vision_config: 32 px, 3 channels; projection_dim 16; the CLIP processor's statistics
    assert pixel["shape"] == ["batch", 3, 32, 32]
    assert pixel["image"]["mean"] == text_families.CLIP_STATS["image_mean"]
    assert vision["outputs"]["image_embeds"]["shape"] == ["batch", 16]
    text = entry["components"]["text_model"]
    assert text["outputs"]["text_embeds"]["shape"] == ["batch", 16]
    assert text["inputs"]["input_ids"]["range"] == [0, 256]  # text_config.vocab_size


def _encoder_decoder():
    from transformers import BertConfig, VisionEncoderDecoderConfig, ViTConfig

    config = VisionEncoderDecoderConfig.from_encoder_decoder_configs(
        ViTConfig(hidden_size=32), BertConfig(hidden_size=32)
    )
    config.architectures = ["VisionEncoderDecoderModel"]
    return config


def _resnet_backbone():
    from transformers import ResNetConfig

    config = ResNetConfig(hidden_sizes=[16, 32], depths=[1, 1])
    config.architectures = ["ResNetModel"]
    return config


@pytest.mark.parametrize(
    "make, says",
    [
        (_encoder_decoder, "VisionEncoderDecoderModel is made of 2 sub-models (decoder, encoder)"),
        (_resnet_backbone, "ResNetModel is an image backbone without hidden_size and patch_size"),
    ],
)
def test_init_refuses_what_it_cannot_serve_in_one_line(make, says, tmp_path, monkeypatch) -> None:
    """An encoder-decoder of two configs, a CNN backbone with no token layout: refused by
    init (never guessed into text features), one line naming what is missing, nothing
    written."""
    monkeypatch.chdir(tmp_path)
    make().save_pretrained(tmp_path / "model")
    result = cli("init", "./model")
    assert result.exit_code != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], result.stderr
    assert not (tmp_path / "catalog").exists()


def test_export_errors_name_their_cause() -> None:
    """torch.onnx wraps the model's own error in one that only says which step failed."""
    import torch

    from winml_recipes.exporters import torch_export
    from winml_recipes.sdk.errors import SourceError

    class Refuses(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.shape[0] > 0:
                raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
            return x

    with pytest.raises(SourceError, match="exactly one of input_ids or inputs_embeds"):
        torch_export(Refuses(), (torch.ones(2, 3),), input_names=["x"], output_names=["y"],
                     dynamic_shapes=({0: "batch"},), opset=None)  # fmt: skip


def _build(arch: str, target: str, tmp_path) -> dict:
    device, precision = target.split("/")
    built = api.build(tmp_path / "recipes" / f"{arch}.yaml", device=device,
                      precision=precision, output_root=tmp_path / "out")  # fmt: skip
    return built


def _judged(manifest: dict, arch: str, device: str) -> dict[str, dict]:
    """Each component's verify record; the family's task metric judged it (on HTP for npu)."""
    out = {}
    for name, component in manifest["components"].items():
        verify = next(s for s in component["steps"] if s["pass"] == "verify")
        assert verify["status"] == "ran", (name, verify)
        record = verify["metrics"]
        assert record["task_metric"]["metric"] == METRICS[arch], (name, record["task_metric"])
        assert record["passed"], (name, record["gates"])
        if device == "npu":
            assert record["verified_on"] == "qnn-htp"
            # the same metric on the CPU simulation of the same QDQ model, beside it
            assert set(record["cpu_simulation"]["task_metric"]) == set(
                record["task_metric"]["values"]
            )
        out[name] = record
    return out


def test_question_answering_builds_on_htp(folders, tmp_path, monkeypatch) -> None:
    """DistilBertForQuestionAnswering: init -> npu/w8a16 judged by span agreement on HTP."""
    _init("distilbert-qa", folders, tmp_path, monkeypatch)
    built = _build("distilbert-qa", "npu/w8a16", tmp_path)
    record = _judged(built.manifest, "distilbert-qa", "npu")["model"]
    values = record["task_metric"]["values"]
    assert values["span_agreement"] >= 0.8 and values["samples"] >= 2


# Known failures: none. (Before stop 39, s8/s8 static QDQ of the tiny random-weight DINOv2
# put its pooled embedding at cosine_worst 0.897 on the CPU EP (gate 0.95): its CLS rows
# spanned 1.8 steps of the 8-bit LayerNormalization inputs; quant/narrow_rows.py keeps those
# inputs at 16 bit: 0.981.)
KNOWN: dict[tuple[str, str], str] = {}


def _cases() -> list:
    return [
        pytest.param(
            arch, target, marks=[pytest.mark.xfail(strict=True, reason=KNOWN[arch, target])]
        )
        if (arch, target) in KNOWN
        else pytest.param(arch, target)
        for arch in text_families.ARCHITECTURES
        for target in ("npu/w8a16", "cpu/int8")
    ]


@pytest.mark.slow
@pytest.mark.parametrize("arch, target", _cases())
def test_every_family_builds_and_is_judged_by_its_metric(
    arch, target, folders, tmp_path, monkeypatch
) -> None:
    entry = _init(arch, folders, tmp_path, monkeypatch)
    built = _build(arch, target, tmp_path)
    device = target.split("/")[0]
    records = _judged(built.manifest, arch, device)
    assert set(records) == set(entry["components"])
    # the exported graph takes exactly the inputs the recipe feeds (DeBERTa v3: no
    # token_type_ids; T5EncoderModel: no decoder inputs)
    import onnx

    for name, spec in entry["components"].items():
        graph = onnx.load(str(built.output_dir / "float-reference" / name / "model.onnx")).graph
        assert [i.name for i in graph.input] == list(spec["inputs"]), name
    if entry["family"] == "two_tower":
        agreement = text_families.zero_shot(
            built.output_dir, device, tmp_path / "catalog" / f"{arch}.yaml"
        )
        # random-weight towers put the prompts close together: a label may flip, but only
        # where the float similarities were a near-tie the target's error can cross
        assert agreement["top1_agreement"] >= 0.5, agreement
        assert agreement["flip_margin_max"] <= 2 * agreement["similarity_max_abs"], agreement


# --------------------------------------------------------------------------- curated entries

CURATED = ["clip-vit-b32", "siglip-base", "dinov2-small", "distilbert-squad", "bge-small",
           "efficientnet-b0", "mobilenet-v2"]  # fmt: skip


def _contract_of(config: dict, family: str, task: str) -> dict:
    """What init's code writes for a config dict (no weights): per component, each tensor's
    shape."""
    from winml_recipes.exporters import auto, build_config, towers

    built = build_config(config, None, "test")
    if family == "two_tower":
        components = towers.catalog_components(built)
    else:
        components = auto.catalog_components(built, task)
    return {
        c: {k: {n: t["shape"] for n, t in s[k].items()} for k in ("inputs", "outputs")}
        for c, s in components.items()
    }


@pytest.mark.parametrize("name", CURATED)
def test_curated_entry_and_its_tiny_twin_agree(name) -> None:
    """Each curated entry pins a Hub repository and revision, and has a tiny random-weight
    twin of the same architecture with the same components and tensor names, whose
    contract is the one init's code derives from its config."""
    from winml_recipes.catalog import load_entry

    full, tiny = load_entry(name), load_entry(f"{name}-tiny")
    assert (full.family, full.data["task"]) == (tiny.family, tiny.data["task"])
    assert list(full.components) == list(tiny.components)
    for cname, comp in full.components.items():
        twin = tiny.components[cname]
        assert comp.source["ref"].count("/") == 1 and comp.source["revision"]
        assert [s.name for s in comp.contract.inputs] == [s.name for s in twin.contract.inputs]
        assert [(s.name, len(s.shape)) for s in comp.contract.outputs] == [
            (s.name, len(s.shape)) for s in twin.contract.outputs
        ]
    config = next(iter(tiny.components.values())).source["config"]
    derived = _contract_of(config, tiny.family, tiny.data["task"])
    written = {
        c: {
            "inputs": {s.name: list(s.shape) for s in comp.contract.inputs},
            "outputs": {s.name: list(s.shape) for s in comp.contract.outputs},
        }
        for c, comp in tiny.components.items()
    }
    # init names the token dim of image features "tokens"; the entry gives its number
    for comp in derived.values():
        for shape in comp["outputs"].values():
            shape[:] = [None if d == "tokens" else d for d in shape]
    for comp in written.values():
        if "last_hidden_state" in comp["outputs"] and "pixel_values" in comp["inputs"]:
            comp["outputs"]["last_hidden_state"][1] = None
    assert derived == written


def _build_entry(name: str, target: str, tmp_path):
    device, precision = target.split("/")
    recipe = tmp_path / "recipes" / f"{name}.yaml"
    recipe.parent.mkdir(parents=True)
    recipe.write_text(
        yaml.safe_dump(
            {
                "schema_version": 1,
                "name": name,
                "model": name,
                "targets": [{"device": device, "precision": precision}],
            }
        )
    )
    return api.build(recipe, device=device, precision=precision, output_root=tmp_path / "out")


@pytest.mark.slow
@pytest.mark.parametrize("name", CURATED)
def test_tiny_twin_of_each_curated_entry_builds_on_htp(name, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    built = _build_entry(f"{name}-tiny", "npu/w8a16", tmp_path)
    for cname, component in built.manifest["components"].items():
        verify = next(s for s in component["steps"] if s["pass"] == "verify")
        assert verify["metrics"]["verified_on"] == "qnn-htp", cname
        assert verify["metrics"]["passed"] and "task_metric" in verify["metrics"], cname
