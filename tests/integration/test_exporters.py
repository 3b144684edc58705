"""torch -> ONNX exporters: names, dynamic dims, numerics vs torch, determinism, errors.

Each graph is exported once per module (fixtures below); the whole module takes ~40 s.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest

from winml_recipes.exporters import ExportRequest, export_model, families
from winml_recipes.sdk.errors import SourceError

pytestmark = pytest.mark.export

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")

from winml_recipes.exporters import auto, sam3_tracker  # noqa: E402
from winml_recipes.exporters.sam3_tracker import TINY_SAM3_TRACKER_CONFIG  # noqa: E402

TINY_BERT = {
    "model_type": "bert",
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "vocab_size": 100,
}
TINY_CONVNEXT = {
    "model_type": "convnext",
    "hidden_sizes": [8, 16, 32, 64],
    "depths": [1, 1, 1, 1],
    "image_size": 32,
    "num_labels": 10,
}

SAM_VISION = ExportRequest("sam3_tracker", "vision_encoder", config=TINY_SAM3_TRACKER_CONFIG)
SAM_DECODER = ExportRequest(
    "sam3_tracker", "prompt_encoder_mask_decoder", config=TINY_SAM3_TRACKER_CONFIG
)
BERT = ExportRequest("auto", "model", task="feature-extraction", config=TINY_BERT)
CONVNEXT = ExportRequest("auto", "model", task="image-classification", config=TINY_CONVNEXT)


def _session(proto: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])


def _dims(value: onnx.ValueInfoProto) -> list[int | str]:
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


def _close(got: np.ndarray, ref, name: str) -> None:
    ref = ref.detach().numpy() if hasattr(ref, "detach") else np.asarray(ref)
    assert got.shape == ref.shape, name
    # Outputs must not be degenerate, or a 1e-4 comparison proves nothing.
    assert float(ref.std()) > 1e-3 or ref.size == 1, name
    np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-4, err_msg=name)


class Exported:
    def __init__(self, req: ExportRequest) -> None:
        self.proto = export_model(req)
        self.session = _session(self.proto)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def sam():
    model = sam3_tracker.load_model(SAM_VISION)
    return model, Exported(SAM_VISION), Exported(SAM_DECODER)


@pytest.fixture(scope="module")
def bert():
    return auto.load_model(BERT), Exported(BERT)


@pytest.fixture(scope="module")
def convnext():
    return auto.load_model(CONVNEXT), Exported(CONVNEXT)


def _prompts(batch: int, points: int, seed: int, size: int = 112):
    gen = torch.Generator().manual_seed(seed)
    pts = torch.rand(batch, 1, points, 2, generator=gen) * size
    labels = torch.randint(0, 2, (batch, 1, points), generator=gen)
    if points > 1:
        labels[:, :, -1] = -1  # a padding point
    xy = torch.rand(batch, 1, 2, generator=gen) * size / 2
    boxes = torch.cat([xy, xy + size / 3], dim=-1)
    return pts, labels, boxes


def _pixels(batch: int, seed: int, size: int = 112):
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(batch, 3, size, size, generator=gen) * 2 - 1


# --------------------------------------------------------------------------- sam3 tracker


def test_sam3_graph_io(sam):
    _, vision, decoder = sam
    g = vision.proto.graph
    assert [(i.name, _dims(i)) for i in g.input] == [("pixel_values", ["batch", 3, 112, 112])]
    assert [(o.name, _dims(o)) for o in g.output] == [
        ("image_embeddings.0", ["batch", 4, 32, 32]),
        ("image_embeddings.1", ["batch", 8, 16, 16]),
        ("image_embeddings.2", ["batch", 32, 8, 8]),
    ]
    g = decoder.proto.graph
    assert [(i.name, _dims(i)) for i in g.input] == [
        ("input_points", ["batch", 1, "points", 2]),
        ("input_labels", ["batch", 1, "points"]),
        ("input_boxes", ["batch", 1, 4]),
        ("image_embeddings.0", ["batch", 4, 32, 32]),
        ("image_embeddings.1", ["batch", 8, 16, 16]),
        ("image_embeddings.2", ["batch", 32, 8, 8]),
    ]
    assert g.input[1].type.tensor_type.elem_type == onnx.TensorProto.INT64
    assert [(o.name, _dims(o)) for o in g.output] == [
        ("iou_scores", ["batch", 1, 3]),
        ("pred_masks", ["batch", 1, 3, 32, 32]),
        ("object_score_logits", ["batch", 1, 1]),
    ]


@pytest.mark.parametrize("batch", [1, 2])
def test_sam3_vision_matches_torch(sam, batch):
    model, vision, _ = sam
    x = _pixels(batch, seed=batch)
    with torch.no_grad():
        ref = model.get_image_embeddings(x)
    got = vision.session.run(None, {"pixel_values": x.numpy()})
    for i, (g, r) in enumerate(zip(got, ref, strict=True)):
        _close(g, r, f"image_embeddings.{i}")


@pytest.mark.parametrize(("batch", "points"), [(1, 1), (1, 3), (2, 1), (2, 3)])
def test_sam3_decoder_matches_torch(sam, batch, points):
    model, _, decoder = sam
    with torch.no_grad():
        emb = model.get_image_embeddings(_pixels(batch, seed=10 + batch))
        pts, labels, boxes = _prompts(batch, points, seed=points)
        ref = model(image_embeddings=emb, input_points=pts, input_labels=labels, input_boxes=boxes)
    feeds = {"input_points": pts.numpy(), "input_labels": labels.numpy()}
    feeds["input_boxes"] = boxes.numpy()
    feeds.update({f"image_embeddings.{i}": e.numpy() for i, e in enumerate(emb)})
    got = decoder.session.run(None, feeds)
    for name, g in zip(("iou_scores", "pred_masks", "object_score_logits"), got, strict=True):
        _close(g, getattr(ref, name), name)


@pytest.mark.parametrize(("batch", "points"), [(1, 2), (2, 3)])
def test_sam3_decoder_of_vision_matches_full_model(sam, batch, points):
    """decoder(vision_encoder(x)) == Sam3TrackerModel(pixel_values=x, prompts)."""
    model, vision, decoder = sam
    x = _pixels(batch, seed=20 + batch)
    pts, labels, boxes = _prompts(batch, points, seed=30 + points)
    with torch.no_grad():
        ref = model(pixel_values=x, input_points=pts, input_labels=labels, input_boxes=boxes)
    emb = vision.session.run(None, {"pixel_values": x.numpy()})
    feeds = {
        "input_points": pts.numpy(),
        "input_labels": labels.numpy(),
        "input_boxes": boxes.numpy(),
        **{f"image_embeddings.{i}": e for i, e in enumerate(emb)},
    }
    got = decoder.session.run(None, feeds)
    for name, g in zip(("iou_scores", "pred_masks", "object_score_logits"), got, strict=True):
        _close(g, getattr(ref, name), name)


@pytest.mark.slow  # suite wall time: the goldens pin the exported graphs in CI
def test_sam3_export_is_deterministic(sam):
    _, _, decoder = sam
    again = export_model(SAM_DECODER)
    assert again.SerializeToString() == decoder.proto.SerializeToString()


def test_graphs_are_normalized(sam, bert):
    for proto in (sam[1].proto, sam[2].proto, bert[1].proto):
        assert not proto.doc_string and not proto.metadata_props
        for node in proto.graph.node:
            assert not node.metadata_props and not node.doc_string
        for t in proto.graph.initializer:
            assert t.data_location == onnx.TensorProto.DEFAULT and not t.external_data
        onnx.checker.check_model(proto)


# --------------------------------------------------------------------------- auto


def test_bert_graph_io(bert):
    proto = bert[1].proto
    assert [(i.name, _dims(i)) for i in proto.graph.input] == [
        ("input_ids", ["batch", "sequence"]),
        ("attention_mask", ["batch", "sequence"]),
        ("token_type_ids", ["batch", "sequence"]),
    ]
    assert [(o.name, _dims(o)) for o in proto.graph.output] == [
        ("last_hidden_state", ["batch", "sequence", 32])
    ]


@pytest.mark.parametrize(("batch", "sequence"), [(1, 5), (2, 7), (3, 12)])
def test_bert_matches_torch(bert, batch, sequence):
    model, exported = bert
    gen = torch.Generator().manual_seed(batch * 100 + sequence)
    ids = torch.randint(0, 100, (batch, sequence), generator=gen)
    mask = torch.ones(batch, sequence, dtype=torch.int64)
    mask[-1, sequence - 2 :] = 0
    types = torch.randint(0, 2, (batch, sequence), generator=gen)
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
    feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
    feeds["token_type_ids"] = types.numpy()
    (got,) = exported.session.run(None, feeds)
    _close(got, ref, "last_hidden_state")


def test_bert_export_is_deterministic(bert):
    assert export_model(BERT).SerializeToString() == bert[1].proto.SerializeToString()


@pytest.mark.parametrize("batch", [1, 3])
def test_convnext_matches_torch(convnext, batch):
    model, exported = convnext
    proto = exported.proto
    assert [(i.name, _dims(i)) for i in proto.graph.input] == [
        ("pixel_values", ["batch", 3, 32, 32])
    ]
    assert [(o.name, _dims(o)) for o in proto.graph.output] == [("logits", ["batch", 10])]
    x = _pixels(batch, seed=40 + batch, size=32)
    with torch.no_grad():
        ref = model(pixel_values=x).logits
    (got,) = exported.session.run(None, {"pixel_values": x.numpy()})
    _close(got, ref, "logits")


# --------------------------------------------------------------------------- errors


def test_families_table():
    assert {name: family.components for name, family in families().items()} == {
        "sam3_tracker": ("vision_encoder", "prompt_encoder_mask_decoder"),
        "sam2": ("vision_encoder", "prompt_encoder_mask_decoder"),
        "sam": ("vision_encoder", "prompt_encoder_mask_decoder"),
        "auto": ("model",),
        "two_tower": ("text_model", "vision_model"),
    }


@pytest.mark.parametrize(
    ("req", "words"),
    [
        (ExportRequest("nope", "model", config=TINY_BERT), "unknown exporter family"),
        (ExportRequest("sam3_tracker", "decoder", config=TINY_SAM3_TRACKER_CONFIG), "component"),
        (ExportRequest("auto", "model", task="feature-extraction"), "exactly one"),
        (
            ExportRequest("auto", "model", task="feature-extraction", config={"model_type": "x1"}),
            "unknown model_type",
        ),
        (ExportRequest("auto", "model", config=TINY_BERT), "task"),
    ],
)
def test_bad_requests_raise_source_error(req, words):
    with pytest.raises(SourceError) as info:
        export_model(req)
    assert words in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_local_dir_raises_source_error(tmp_path):
    missing = str(tmp_path / "no" / "such" / "model")
    req = ExportRequest("sam3_tracker", "vision_encoder", model_id=missing)
    with pytest.raises(SourceError, match="does not exist"):
        export_model(req)


def test_unloadable_local_dir_raises_source_error(tmp_path):
    req = ExportRequest("auto", "model", task="feature-extraction", model_id=str(tmp_path))
    with pytest.raises(SourceError, match="cannot load") as info:
        export_model(req)
    assert "\n" not in str(info.value)


def test_local_dir_roundtrip(tmp_path, convnext):
    """A saved checkpoint directory exports the same graph as the config it came from."""
    model, exported = convnext
    model.save_pretrained(tmp_path)
    req = ExportRequest("auto", "model", task="image-classification", model_id=str(tmp_path))
    assert export_model(req).SerializeToString() == exported.proto.SerializeToString()


def test_import_does_not_import_torch():
    code = (
        "import sys\n"
        "import winml_recipes.exporters, winml_recipes.exporters.sam3_tracker\n"
        "import winml_recipes.exporters.auto\n"
        "bad = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------- auto: task heads

TINY_GPT2 = {
    "model_type": "gpt2",
    "n_embd": 32,
    "n_layer": 2,
    "n_head": 2,
    "vocab_size": 100,
    "n_positions": 64,
}

HEADS = [
    # (architecture named in the config, config, task it means, output name, shape at b=2,s=5)
    ("BertForSequenceClassification", {**TINY_BERT, "num_labels": 3}, "text-classification",
     "logits", (2, 3)),
    ("BertForTokenClassification", {**TINY_BERT, "num_labels": 4}, "token-classification",
     "logits", (2, 5, 4)),
    ("BertForMaskedLM", TINY_BERT, "fill-mask", "logits", (2, 5, 100)),
    ("GPT2LMHeadModel", TINY_GPT2, "text-generation", "logits", (2, 5, 100)),
    ("BertModel", TINY_BERT, "feature-extraction", "last_hidden_state", (2, 5, 32)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("arch", "config", "task", "output", "shape"), HEADS, ids=[h[0] for h in HEADS]
)
def test_auto_keeps_the_task_head(arch, config, task, output, shape) -> None:
    """The architecture in the config decides the task; the export computes what that
    class computes in torch (names, shapes, values), not the base model's features."""
    import transformers

    built = transformers.AutoConfig.for_model(**{**config, "architectures": [arch]})
    assert auto.task_of(built) == task
    req = ExportRequest("auto", "model", task=task, config={**config, "architectures": [arch]})
    model = auto.load_model(req)
    assert type(model).__name__ == arch
    proto = export_model(req)
    assert [o.name for o in proto.graph.output] == [output]
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 100, (2, 5), generator=gen)
    mask = torch.ones(2, 5, dtype=torch.int64)
    feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
    names = [i.name for i in proto.graph.input]
    if "token_type_ids" in names:
        feeds["token_type_ids"] = np.zeros((2, 5), np.int64)
    (got,) = _session(proto).run(None, {n: feeds[n] for n in names})
    kwargs = {n: torch.from_numpy(feeds[n]) for n in names}
    with torch.no_grad():
        ref = getattr(model(**kwargs, return_dict=True), output)
    assert got.shape == shape
    _close(got, ref, arch)


@pytest.mark.parametrize("arch", ["BertForNextSentencePrediction", "T5ForConditionalGeneration"])
def test_auto_refuses_a_head_it_cannot_export(arch) -> None:
    import transformers

    config = transformers.AutoConfig.for_model(**{**TINY_BERT, "architectures": [arch]})
    with pytest.raises(SourceError) as err:
        auto.task_of(config)
    text = str(err.value)
    assert arch in text and "text-classification" in text and "\n" not in text


# --------------------------------------------------------------------------- auto: audio

TINY_WHISPER = {
    "model_type": "whisper", "vocab_size": 64, "d_model": 16, "encoder_layers": 1,
    "encoder_attention_heads": 2, "decoder_layers": 1, "decoder_attention_heads": 2,
    "encoder_ffn_dim": 32, "decoder_ffn_dim": 32, "num_mel_bins": 8,
    "max_source_positions": 20, "max_target_positions": 16, "pad_token_id": 0,
    "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 1, "num_labels": 3,
}  # fmt: skip


@pytest.mark.parametrize(
    ("arch", "task", "output", "shape"),
    [
        ("WhisperForConditionalGeneration", "audio-feature-extraction", "last_hidden_state",
         (2, 20, 16)),
        ("WhisperModel", "audio-feature-extraction", "last_hidden_state", (2, 20, 16)),
        ("WhisperForAudioClassification", "audio-classification", "logits", (2, 3)),
    ],
)  # fmt: skip
def test_auto_exports_whisper_audio(arch, task, output, shape) -> None:
    """A Whisper config is audio: log-mel input_features [batch, n_mels, 2 x positions] in;
    a sequence-to-sequence model exports its encoder alone, a classifier keeps its head;
    the catalog init writes says the same shapes as the graph."""
    import transformers

    config = {**TINY_WHISPER, "architectures": [arch]}
    assert auto.task_of(transformers.AutoConfig.for_model(**config)) == task
    contract = auto.catalog_components(
        transformers.AutoConfig.for_model(**config), task, {"feature_size": 8, "nb_max_frames": 40}
    )["model"]
    assert contract["inputs"]["input_features"]["shape"] == ["batch", 8, 40]
    assert contract["outputs"][output]["shape"] == ["batch", *shape[1:]]
    req = ExportRequest("auto", "model", task=task, config=config)
    proto = export_model(req)
    assert [i.name for i in proto.graph.input] == ["input_features"]
    assert [o.name for o in proto.graph.output] == [output]
    x = np.random.default_rng(1).uniform(-1, 1.5, (2, 8, 40)).astype(np.float32)
    (got,) = _session(proto).run(None, {"input_features": x})
    model = auto.load_model(req)
    inner = model.get_encoder() if task == "audio-feature-extraction" else model
    with torch.no_grad():
        ref = getattr(inner(torch.from_numpy(x), return_dict=True), output)
    assert got.shape == shape
    _close(got, ref, arch)


def test_auto_audio_refuses_a_feature_extractor_that_disagrees() -> None:
    import transformers

    config = transformers.AutoConfig.for_model(**TINY_WHISPER)
    with pytest.raises(SourceError) as err:
        auto.catalog_components(config, "audio-feature-extraction", {"nb_max_frames": 3000})
    text = str(err.value)
    assert "nb_max_frames 3000" in text and "[batch, 8, 40]" in text and "\n" not in text
