"""Writes winml_recipes/data/speech: the spoken sentences audio builds calibrate and verify on.

Synthesized with espeak-ng (Debian: `apt-get install -y espeak-ng`; its output is not a
derivative of its GPL code), several voices and speeds, resampled to 16 kHz by FFT and
saved as 16-bit mono WAV. Calibration and held-out clips speak different sentences.

    python tests/data/make_speech.py

`tests/unit/test_bundled_speech.py` checks every file against its recorded sha256.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import wave
from pathlib import Path

import numpy as np
import yaml

RATE = 16000
OUT = Path(__file__).resolve().parents[2] / "winml_recipes" / "data" / "speech"
# (sentence, voice, words per minute, pitch, split)
CLIPS = (
    ("The weather today is sunny with a light breeze.", "en-us", 160, 50, "calibration"),
    ("Please send the report to the finance team by Friday.", "en-gb", 170, 40, "calibration"),
    ("A small dog chased the ball across the green park.", "en-us", 150, 65, "calibration"),
    ("She plays the violin in the city orchestra.", "en-gb-x-rp", 165, 55, "calibration"),
    ("Fresh bread smells wonderful early in the morning.", "en-us", 175, 35, "calibration"),
    ("The museum opens at ten and closes at six.", "en-gb-scotland", 155, 50, "calibration"),
    ("Turn left at the bakery and walk two blocks.", "en-us", 160, 45, "heldout"),
    ("The train to Berlin leaves from platform nine.", "en-gb", 150, 60, "heldout"),
    ("Our flight was delayed because of heavy snow.", "en-gb-x-rp", 170, 40, "heldout"),
    ("Children built a sandcastle near the waves.", "en-us", 165, 70, "heldout"),
)
LICENSE = "synthesized speech (espeak-ng 1.51, no copyright in the output); this project's"


def speak(text: str, voice: str, speed: int, pitch: int) -> np.ndarray:
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise SystemExit("espeak-ng is not installed (apt-get install -y espeak-ng)")
    args = [exe, "-v", voice, "-s", str(speed), "-p", str(pitch), "--stdout", text]
    done = subprocess.run(args, capture_output=True, timeout=60, check=True)
    with wave.open(io.BytesIO(done.stdout)) as w:
        rate = w.getframerate()
        pcm = np.frombuffer(w.readframes(w.getnframes()), np.int16).astype(np.float32) / 32768
    n = round(len(pcm) * RATE / rate)
    out = np.fft.irfft(np.fft.rfft(pcm)[: n // 2 + 1], n) * (n / len(pcm))
    return np.clip(out, -1, 1)


def main() -> None:
    import hashlib

    shutil.rmtree(OUT, ignore_errors=True)
    records = []
    for k, (text, voice, speed, pitch, split) in enumerate(CLIPS):
        pcm = (speak(text, voice, speed, pitch) * 32767).round().astype("<i2")
        path = OUT / split / f"speech_{k}.wav"
        path.parent.mkdir(parents=True, exist_ok=True)
        with wave.open(str(path), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(RATE)
            w.writeframes(pcm.tobytes())
        records.append({
            "file": f"{split}/{path.name}",
            "text": text,
            "source": f"espeak-ng -v {voice} -s {speed} -p {pitch}",
            "license": LICENSE,
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        })  # fmt: skip
    head = (
        "# Spoken sentences bundled for calibration and held-out verification of audio\n"
        "# inputs. Written by tests/data/make_speech.py; checked by\n"
        "# tests/unit/test_bundled_speech.py. 16 kHz, 16-bit mono.\n"
    )
    text = yaml.safe_dump({"clips": records}, sort_keys=False, allow_unicode=True)
    (OUT / "ATTRIBUTION.yaml").write_text(head + text, encoding="utf-8")


if __name__ == "__main__":
    main()
