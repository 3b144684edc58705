"""Real inputs for the corpus: scikit-image's photographs, espeak-ng speech, rendered text.

Photographs come from scikit-image's wheel (fetched like the models, see fetch.py). Speech is
synthesized with espeak-ng (Debian: `apt-get install -y espeak-ng`) and resampled to 16 kHz.
Text is rendered with Pillow's built-in scalable font, so no font file is needed.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import wave
from functools import cache

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from tests.corpus import fetch

PHOTOS = ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "camera.png", "coins.png",
          "hubble_deep_field.jpg", "motorcycle_left.png", "brick.png", "grass.png",
          "gravel.png", "color.png")  # fmt: skip
WORDS = (  # noqa: SIM905 (a sentence reads better than a list)
    "the quick brown fox jumps over a lazy dog while seven bright stars rise above quiet "
    "hills and rivers carry cold water from the north towards distant cities where people "
    "read books write letters paint walls build bridges measure time and count numbers "
    "model layer input output signal data table figure chapter section result method"
).split()
SENTENCES = (
    "The weather today is sunny with a light breeze.",
    "Please send the report to the finance team by Friday.",
    "A small dog chased the ball across the green park.",
    "Quantum computers may change how we break codes.",
    "She plays the violin in the city orchestra.",
    "The train to Berlin leaves from platform nine.",
    "Fresh bread smells wonderful early in the morning.",
    "Our servers were down for maintenance last night.",
    "He planted tomatoes and basil in the garden.",
    "The museum opens at ten and closes at six.",
    "Neural networks learn patterns from large datasets.",
    "Mount Everest is the highest mountain on Earth.",
    "I forgot my umbrella and got completely soaked.",
    "The committee approved the new budget proposal.",
    "Cats often sleep for more than twelve hours a day.",
    "Turn left at the bakery and walk two blocks.",
    "The stock market fell sharply after the announcement.",
    "Children built a sandcastle near the waves.",
    "This recipe needs two eggs and a cup of flour.",
    "The spacecraft entered orbit around Mars.",
    "Music can improve concentration while studying.",
    "Our flight was delayed because of heavy snow.",
    "The library has thousands of rare manuscripts.",
    "Electric cars are becoming cheaper every year.",
)


def _image_path(name: str):
    return fetch.member("scikit-image", f"skimage/data/{name}")


@cache
def photo(name: str) -> np.ndarray:
    """A scikit-image photograph as an H x W x 3 uint8 RGB array."""
    return np.asarray(Image.open(_image_path(name)).convert("RGB"))


def resized(img: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """`img` resized to (height, width), bilinear."""
    h, w = size
    return np.asarray(Image.fromarray(img).resize((w, h), Image.BILINEAR))


def crop(rng: np.random.Generator, img: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """A random crop of at least half the photo's shorter side, resized to (height, width)."""
    h, w = img.shape[:2]
    side = int(rng.uniform(0.5, 1.0) * min(h, w))
    aspect = size[1] / size[0]
    ch, cw = side, min(w, int(side * aspect))
    y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
    return resized(img[y : y + ch, x : x + cw], size)


def font(size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.load_default(size=size)


def words(rng: np.random.Generator, count: int) -> str:
    return " ".join(rng.choice(WORDS, count))


def text_line(rng: np.random.Generator, text: str, height: int, width: int,
              background: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """`text` rendered dark on light (or on `background`), fit to height x width, RGB uint8."""
    size = int(height * rng.uniform(0.55, 0.75))
    f = font(size)
    box = f.getbbox(text)
    tw = box[2] - box[0] + 2 * int(rng.integers(2, 8))
    canvas_w = max(width, tw)
    if background is None:
        paper = rng.integers(190, 256, 3)
        img = Image.new("RGB", (canvas_w, height), tuple(int(v) for v in paper))
    else:
        img = Image.fromarray(resized(background, (height, canvas_w)))
    ink = tuple(int(v) for v in rng.integers(0, 70, 3))
    draw = ImageDraw.Draw(img)
    draw.text((int(rng.integers(2, 8)), (height - size) // 2 - box[1] // 2), text, font=f, fill=ink)
    out = np.asarray(img).astype(np.float32)
    out += rng.normal(0, 4, out.shape)
    out = np.clip(out, 0, 255).astype(np.uint8)
    return resized(out, (height, width)) if canvas_w != width else out


def document_page(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A rendered page: a title, paragraphs, a figure (a photograph) and a ruled table."""
    img = Image.new("RGB", (width, height), (250, 250, 246))
    draw = ImageDraw.Draw(img)
    y, margin = int(height * 0.05), int(width * 0.08)
    title = font(max(12, height // 28))
    body = font(max(8, height // 60))
    draw.text((margin, y), words(rng, 4).title(), font=title, fill=(10, 10, 10))
    y += height // 14
    layout = rng.permutation(["text", "figure", "table", "text"])
    for block in layout:
        if y > height * 0.9:
            break
        if block == "text":
            for _ in range(int(rng.integers(3, 7))):
                draw.text((margin, y), words(rng, int(rng.integers(6, 10))), font=body,
                          fill=(20, 20, 20))  # fmt: skip
                y += int(height / 45)
            y += height // 40
        elif block == "figure":
            fh = int(height * rng.uniform(0.15, 0.25))
            fw = int((width - 2 * margin) * rng.uniform(0.5, 0.9))
            pic = crop(rng, photo(str(rng.choice(PHOTOS))), (fh, fw))
            img.paste(Image.fromarray(pic), (margin, y))
            y += fh + height // 40
        else:
            rows, cols = int(rng.integers(3, 6)), int(rng.integers(2, 5))
            rh, cw = height // 40, (width - 2 * margin) // cols
            for r in range(rows + 1):
                draw.line((margin, y + r * rh, margin + cols * cw, y + r * rh), fill=(0, 0, 0))
            for c in range(cols + 1):
                draw.line((margin + c * cw, y, margin + c * cw, y + rows * rh), fill=(0, 0, 0))
            for r in range(rows):
                for c in range(cols):
                    draw.text((margin + c * cw + 3, y + r * rh + 2), words(rng, 1), font=body,
                              fill=(0, 0, 0))  # fmt: skip
            y += rows * rh + height // 40
    return np.asarray(img)


ESPEAK_INSTALL = "apt-get install -y espeak-ng"


def speech(text: str, voice: str = "en-us", speed: int = 160, pitch: int = 50) -> np.ndarray:
    """`text` spoken by espeak-ng, as float32 samples in [-1, 1] at 16 kHz."""
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise RuntimeError(f"corpus: espeak-ng is not installed; install it ({ESPEAK_INSTALL})")
    done = subprocess.run(
        [exe, "-v", voice, "-s", str(speed), "-p", str(pitch), "--stdout", text],
        capture_output=True, timeout=60, check=True,
    )  # fmt: skip
    with wave.open(io.BytesIO(done.stdout)) as w:
        rate = w.getframerate()
        pcm = np.frombuffer(w.readframes(w.getnframes()), np.int16)
    return resample(pcm.astype(np.float32) / 32768.0, rate, 16000)


def resample(x: np.ndarray, rate: int, target: int) -> np.ndarray:
    """Band-limited resampling by FFT (espeak-ng speaks at 22,050 Hz)."""
    n = round(len(x) * target / rate)
    spectrum = np.fft.rfft(x)
    keep = n // 2 + 1
    out = np.fft.irfft(spectrum[:keep], n) * (n / len(x))
    return out.astype(np.float32)
