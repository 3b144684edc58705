"""Real architectures built here, as users bring them: exported ONNX files and their data.

Each builder writes `model.onnx`, `calib.npz` and `heldout.npz` into a folder and returns
a `RealModel`: the float model the build starts from, and the task metric that tells
whether a quantized copy still does the job on the held-out samples.

- `bert`: a tiny BERT (random weights) with a sentence-embedding head (masked mean
  pooling), exported with its attention mask and token_type_ids, then converted to opset
  11 as old exports are; token ids from a vocabulary of a few hundred, padded sequences
  with real masks. Metric: embedding cosine.
- `cnn`: a MobileNet-style CNN with ReLU6 and HardSwish (Clip and HardSwish ops).
  Metric: top-1 agreement with the float model.
- `recognizer`: a text-line recognizer (CNN, then self-attention over the width, then a
  BatchNormalization) with per-timestep CTC logits over dark glyphs on light lines, at
  opset 12. Metric: character agreement of the greedy-decoded lines.
- `classifier`: a small image classifier (transformers' ResNet, random weights).

The models have random weights, with BatchNorm statistics of the data they see and heads
trained on their own decisions, so their outputs are as confident as a trained model's (a
random head's near-ties flip under any change of arithmetic, which says nothing about the
quantization).
Used by tests/integration/test_real_models.py and bench/thirdparty.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from winml_recipes.metrics.text import ctc_decode, edit_distance

Feed = dict[str, np.ndarray]

VOCAB = 320  # token ids 0..319: pad 0, [CLS] 1, [SEP] 2, words from 5
SEQUENCE = 16
BLANK = 0  # CTC blank class of the recognizer


@dataclass
class RealModel:
    name: str
    model: Path
    calib: Path
    heldout: Path
    metric: str  # the task metric's name
    score: Callable[[list[Feed], list[Feed]], float]  # (float outputs, candidate outputs)
    threshold: float  # what the issue asks of an npu/w8a16 build


def _export(module, args: tuple, path: Path, inputs: list[str], outputs: list[str],
            dynamic: dict | None, opset: int) -> None:  # fmt: skip
    """torch.onnx.export at `opset` (the TorchScript exporter: it still writes opset 11
    and 12 as old exports are; onnx's version converter cannot take the dynamo exporter's
    opset-18 graphs down, e.g. LayerNormalization has no earlier version)."""
    import onnx
    import torch

    tmp = path.with_suffix(".export.onnx")
    with torch.no_grad():
        torch.onnx.export(
            module.eval(), args, str(tmp), input_names=inputs, output_names=outputs,
            dynamic_axes=dynamic, dynamo=False, opset_version=opset,
        )  # fmt: skip
    model = onnx.load(str(tmp))
    tmp.unlink()
    model.ir_version = min(model.ir_version, 8)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def _stack(samples: list[Feed]) -> dict[str, np.ndarray]:
    """Samples on a new leading axis (the documented npz layout)."""
    return {k: np.stack([s[k] for s in samples]) for k in samples[0]}


def _save_data(folder: Path, samples: list[Feed], calib: int) -> tuple[Path, Path]:
    np.savez(folder / "calib.npz", **_stack(samples[:calib]))
    np.savez(folder / "heldout.npz", **_stack(samples[calib:]))
    return folder / "calib.npz", folder / "heldout.npz"


# --------------------------------------------------------------------------- metrics


def mean_cosine(reference: list[Feed], candidate: list[Feed]) -> float:
    """Mean over samples (and rows) of the cosine of the first output's vectors."""
    out = []
    for r, c in zip(reference, candidate, strict=True):
        a = np.asarray(next(iter(r.values())), np.float64).reshape(-1, r_last(r))
        b = np.asarray(next(iter(c.values())), np.float64).reshape(a.shape)
        num = (a * b).sum(-1)
        den = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1) + 1e-30
        out += list(num / den)
    return float(np.mean(out))


def r_last(feed: Feed) -> int:
    return int(np.asarray(next(iter(feed.values()))).shape[-1])


def top1_agreement(reference: list[Feed], candidate: list[Feed]) -> float:
    hits = [
        int(np.argmax(next(iter(r.values()))) == np.argmax(next(iter(c.values()))))
        for r, c in zip(reference, candidate, strict=True)
    ]
    return float(np.mean(hits))


def greedy_decode(logits: np.ndarray) -> list[int]:
    """CTC greedy decoding of [1, T, C] logits: best class per step, repeats merged,
    blanks dropped."""
    return ctc_decode(
        np.asarray(logits).reshape(-1, np.asarray(logits).shape[-1]).argmax(-1), BLANK
    )


def character_agreement(reference: list[Feed], candidate: list[Feed]) -> float:
    """1 - character error rate of the candidate's greedy-decoded lines against the float
    model's (edit distance over the float lines' length), OCR's usual measure."""
    errors = total = 0
    for r, c in zip(reference, candidate, strict=True):
        want = greedy_decode(next(iter(r.values())))
        errors += edit_distance(want, greedy_decode(next(iter(c.values()))))
        total += max(1, len(want))
    return 1.0 - errors / total


def sequence_agreement(reference: list[Feed], candidate: list[Feed]) -> float:
    hits = [
        int(greedy_decode(next(iter(r.values()))) == greedy_decode(next(iter(c.values()))))
        for r, c in zip(reference, candidate, strict=True)
    ]
    return float(np.mean(hits))


# --------------------------------------------------------------------------- BERT


def bert(folder: Path, calib: int = 16, heldout: int = 8, opset: int = 11) -> RealModel:
    """Tiny BERT sentence embedder (mean pooling over the attention mask), opset 11."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=128, max_position_embeddings=64, type_vocab_size=2,
        initializer_range=0.1,
        attn_implementation="eager",
    )  # fmt: skip

    class Embedder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = BertModel(config, add_pooling_layer=False)

        def forward(self, input_ids, attention_mask, token_type_ids):
            hidden = self.bert(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)

    rng = np.random.default_rng(0)
    samples = [_sentence(rng) for _ in range(calib + heldout)]
    example = tuple(torch.from_numpy(np.concatenate([s[k] for s in samples[:2]]))
                    for k in ("input_ids", "attention_mask", "token_type_ids"))  # fmt: skip
    seq = {0: "batch", 1: "sequence"}
    folder.mkdir(parents=True, exist_ok=True)
    _export(
        Embedder(), example, folder / "model.onnx",
        ["input_ids", "attention_mask", "token_type_ids"], ["sentence_embedding"],
        {"input_ids": seq, "attention_mask": seq, "token_type_ids": seq}, opset,
    )  # fmt: skip
    c, h = _save_data(folder, samples, calib)
    return RealModel("bert", folder / "model.onnx", c, h, "embedding cosine", mean_cosine, 0.99)


def _sentence(rng: np.random.Generator) -> Feed:
    """[CLS] w1 .. wn [SEP] then padding, as a tokenizer writes one sentence of [1, 16]."""
    n = int(rng.integers(3, SEQUENCE - 1))
    # word ids follow a Zipf-like law, as real text does
    words = np.minimum(5 + rng.zipf(1.3, n) - 1, VOCAB - 1)
    ids = np.zeros(SEQUENCE, np.int64)
    ids[0], ids[1 : n + 1], ids[n + 1] = 1, words, 2
    mask = (np.arange(SEQUENCE) <= n + 1).astype(np.int64)
    return {
        "input_ids": ids[None],
        "attention_mask": mask[None],
        "token_type_ids": np.zeros((1, SEQUENCE), np.int64),
    }


# --------------------------------------------------------------------------- images


def _images(rng: np.random.Generator, count: int, size: tuple[int, int]) -> list[np.ndarray]:
    """Smooth images with edges and texture (not white noise), normalized like ImageNet."""
    h, w = size
    yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
    out = []
    for _ in range(count):
        img = np.zeros((3, h, w))
        for c in range(3):
            f = rng.uniform(1, 6, 2)
            phase = rng.uniform(0, 2 * np.pi, 2)
            img[c] = 0.5 + 0.3 * np.sin(2 * np.pi * f[0] * xx + phase[0]) * np.cos(
                2 * np.pi * f[1] * yy + phase[1]
            )
        y0, x0 = rng.integers(0, h // 2), rng.integers(0, w // 2)
        img[:, y0 : y0 + h // 3, x0 : x0 + w // 3] = rng.uniform(0, 1, (3, 1, 1))  # an object
        img += rng.normal(0, 0.03, img.shape)
        img = (np.clip(img, 0, 1) - 0.45) / 0.25
        out.append(img[None].astype(np.float32))
    return out


def _text_lines(rng: np.random.Generator, count: int, size: tuple[int, int]) -> list[np.ndarray]:
    """Dark glyphs on a light, slightly uneven background, as a text detector crops lines:
    3 to 8 characters from a fixed 36-glyph font (random 10x6 stroke patterns), spaced
    unevenly, with ink and paper colours that vary by line."""
    h, w = size
    font = np.random.default_rng(36).random((36, 10, 6)) < 0.45
    out = []
    for _ in range(count):
        paper = rng.uniform(0.7, 1.0, (3, 1, 1))
        img = np.broadcast_to(paper, (3, h, w)).copy()
        img += rng.normal(0, 0.02, (3, h, w)) + np.linspace(0, rng.uniform(-0.1, 0.1), w)
        x = int(rng.integers(2, 10))
        ink = rng.uniform(0.0, 0.3, (3, 1, 1))
        for k in rng.integers(0, 36, int(rng.integers(3, 9))):
            if x + 6 > w:
                break
            y = int(rng.integers(1, h - 10))
            img[:, y : y + 10, x : x + 6] = np.where(font[k], ink, img[:, y : y + 10, x : x + 6])
            x += 6 + int(rng.integers(2, 6))
        img = (np.clip(img, 0, 1) - 0.5) / 0.5
        out.append(img[None].astype(np.float32))
    return out


def cnn(folder: Path, calib: int = 16, heldout: int = 16) -> RealModel:
    """MobileNet-style blocks: Conv-BN-ReLU6, depthwise Conv-BN-HardSwish, pooled, linear."""
    import torch
    from torch import nn

    torch.manual_seed(0)

    def block(cin: int, cout: int, stride: int, act: type[nn.Module]) -> nn.Sequential:
        return nn.Sequential(
            nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False), nn.BatchNorm2d(cin), act(),
            nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout), act(),
        )  # fmt: skip

    net = nn.Sequential(
        nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.Hardswish(),
        block(16, 24, 2, nn.ReLU6), block(24, 32, 2, nn.Hardswish), block(32, 48, 1, nn.ReLU6),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.BatchNorm1d(48), nn.Linear(48, 10),
    )  # fmt: skip
    rng = np.random.default_rng(1)
    _fit_batchnorm(net, _images(rng, 64, (32, 32)))
    _head(net[-1], gain=4.0)
    _sharpen(net, net[-1], _images(rng, 256, (32, 32)))
    samples = [{"pixel_values": x} for x in _images(rng, calib + heldout, (32, 32))]
    folder.mkdir(parents=True, exist_ok=True)
    _export(net, (torch.from_numpy(np.concatenate([samples[0]["pixel_values"]] * 2)),),
            folder / "model.onnx", ["pixel_values"], ["logits"],
            {"pixel_values": {0: "batch"}}, 17)  # fmt: skip
    c, h = _save_data(folder, samples, calib)
    return RealModel("cnn", folder / "model.onnx", c, h, "top-1 agreement", top1_agreement, 1.0)


def _fit_batchnorm(net, inputs: list[np.ndarray]) -> None:
    """BatchNorm statistics of the data the model sees, as training leaves them (random
    statistics would leave features that barely depend on the image), with random affine
    parameters."""
    import torch

    g = torch.Generator().manual_seed(0)
    norms = [m for m in net.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average over the batches
        m.weight.data.copy_(torch.rand(m.num_features, generator=g) * 0.5 + 0.75)
        m.bias.data.copy_(torch.randn(m.num_features, generator=g) * 0.2)
    net.train()
    with torch.no_grad():
        net(torch.from_numpy(np.concatenate(inputs)))
    net.eval()


def _head(head, gain: float, blank: float = 0.0) -> None:
    """A head as confident as a trained one: random unit directions scaled by `gain` over
    standardized features (a BatchNorm before it), so the class scores depend on the
    image; `blank` adds a bias to class 0 (CTC's blank, which most steps of a line are)."""
    import torch

    g = torch.Generator().manual_seed(1)
    w = torch.randn(head.out_features, head.in_features, generator=g)
    with torch.no_grad():
        head.weight.copy_(w / w.norm(dim=1, keepdim=True) * gain)
        head.bias.zero_()
        head.bias[0] += blank


def _sharpen(net, head, inputs: list[np.ndarray], steps: int = 200) -> None:
    """Train the head on its own decisions (cross-entropy, head only): the decisions stay,
    their margins grow towards the max-margin direction, as a trained model's are. A
    random head's near-ties flip under any change of arithmetic, which would measure the
    head, not the quantization."""
    import torch

    seen = []
    hook = head.register_forward_hook(lambda m, i, o: seen.append(i[0].detach()))
    with torch.no_grad():
        net(torch.from_numpy(np.concatenate(inputs)))
    hook.remove()
    x = seen[0].reshape(-1, head.in_features)
    with torch.no_grad():
        labels = head(x).argmax(-1)
    opt = torch.optim.Adam(head.parameters(), lr=0.02)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(head(x), labels).backward()
        opt.step()


def recognizer(folder: Path, calib: int = 16, heldout: int = 16, opset: int = 12) -> RealModel:
    """Text-line recognizer: conv stack to height 1, a self-attention layer over the width
    (SVTR-style; QNN HTP could not finalize a BiLSTM here), per-step logits over 37 classes
    (blank + 36 characters), at opset 12."""
    import torch
    from torch import nn

    torch.manual_seed(0)

    class Recognizer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(3, 16, 3, 1, 1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                nn.Conv2d(16, 32, 3, 1, 1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                nn.Conv2d(32, 48, 3, 1, 1), nn.BatchNorm2d(48), nn.ReLU(),
                nn.MaxPool2d((2, 1)), nn.Conv2d(48, 64, (2, 1)), nn.ReLU(),
            )  # fmt: skip
            self.qkv = nn.Linear(64, 192)
            self.out = nn.Linear(64, 64)
            self.ln = nn.LayerNorm(64)
            self.norm = nn.BatchNorm1d(64)
            self.head = nn.Linear(64, 37)

        def forward(self, x):
            f = self.features(x)  # [N, 64, 1, W/4]
            seq = f.squeeze(2).permute(0, 2, 1)  # [N, T, 64]
            q, k, v = self.qkv(seq).chunk(3, dim=-1)
            attn = torch.softmax(q @ k.transpose(1, 2) / 8.0, dim=-1)
            out = self.ln(seq + self.out(attn @ v))
            return self.head(self.norm(out.transpose(1, 2)).transpose(1, 2))  # [N, T, 37]

    net = Recognizer()
    rng = np.random.default_rng(2)
    _fit_batchnorm(net, _text_lines(rng, 32, (16, 96)))
    _head(net.head, gain=8.0, blank=19.0)
    _sharpen(net, net.head, _text_lines(rng, 64, (16, 96)))
    samples = [{"x": x} for x in _text_lines(rng, calib + heldout, (16, 96))]
    folder.mkdir(parents=True, exist_ok=True)
    _export(net, (torch.from_numpy(np.concatenate([samples[0]["x"]] * 2)),),
            folder / "model.onnx", ["x"], ["logits"], {"x": {0: "batch"}}, opset)  # fmt: skip
    c, h = _save_data(folder, samples, calib)
    return RealModel(
        "recognizer", folder / "model.onnx", c, h, "character agreement", character_agreement,
        0.95,
    )  # fmt: skip


def classifier(folder: Path, calib: int = 16, heldout: int = 16) -> RealModel:
    """A small image classifier: transformers' ResNet (two stages), 10 classes, 64 px."""
    import torch
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(0)
    config = ResNetConfig(
        embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], num_labels=10,
        layer_type="basic",
    )  # fmt: skip
    model = ResNetForImageClassification(config)

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, pixel_values):
            return self.model(pixel_values=pixel_values).logits

    net = Logits()
    head = model.classifier[-1]
    rng = np.random.default_rng(3)
    _fit_batchnorm(net, _images(rng, 64, (64, 64)))
    _head(head, gain=4.0)
    _sharpen(net, head, _images(rng, 128, (64, 64)))
    samples = [{"pixel_values": x} for x in _images(rng, calib + heldout, (64, 64))]
    folder.mkdir(parents=True, exist_ok=True)
    _export(net, (torch.from_numpy(np.concatenate([samples[0]["pixel_values"]] * 2)),),
            folder / "model.onnx", ["pixel_values"], ["logits"],
            {"pixel_values": {0: "batch"}}, 17)  # fmt: skip
    c, h = _save_data(folder, samples, calib)
    return RealModel(
        "classifier", folder / "model.onnx", c, h, "top-1 agreement", top1_agreement, 1.0
    )


BUILDERS = {"bert": bert, "cnn": cnn, "recognizer": recognizer, "classifier": classifier}


def heldout_feeds(model: RealModel) -> list[Feed]:
    with np.load(model.heldout) as data:
        arrays = {k: data[k] for k in data.files}
    count = next(iter(arrays.values())).shape[0]
    return [{k: v[i] for k, v in arrays.items()} for i in range(count)]


def float_outputs(model: RealModel, feeds: list[Feed]) -> list[Feed]:
    """The float model's outputs on the CPU EP (the reference)."""
    from winml_recipes.runtime.sessions import open_session

    session = open_session(model.model)
    return [session.run(feed, i) for i, feed in enumerate(feeds)]


def task_score(model: RealModel, candidate: Path, device: str = "npu") -> tuple[float, str]:
    """The task metric of `candidate` against the float model on the held-out samples, run
    on the device's EP (QNN HTP for npu where it loads, without CPU fallback), and where."""
    from winml_recipes.runtime.target import run_on_target

    feeds = heldout_feeds(model)
    run = run_on_target(candidate, feeds, device)
    return model.score(float_outputs(model, feeds), run.outputs), run.verified_on
