"""Text, two-tower and image-embedding families (issue 33) through `init` and `build`.

For every tiny architecture of tests/text_families.py (seeded random weights, a
`save_pretrained` folder with its preprocessor file): `winml-recipes init FOLDER`, then
`build` of the recipe it writes for each target (npu/w8a16 on QNN HTP with CPU fallback
off, cpu/int8). A row: init ok, the task and family chosen, the build's status, the task
metric on the target and on the CPU simulation of the same QDQ model, wall seconds and
the peak RSS of the largest child process. Two-tower models (CLIP, SigLIP) also get the
zero-shot top-1 agreement of their two built graphs on the bundled held-out photographs
against 8 label prompts (float graphs vs the target's).

Each cell runs in its own process. Run:
`python bench/text_families.py [--archs a,b] [--targets npu/w8a16,cpu/int8] [--json F]`;
`--tool-path DIR` runs another checkout's winml_recipes (the "before" table).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
FOLDERS = Path(tempfile.gettempdir()) / "winml-text-families"
TIMEOUT = 1500
PROMPTS = ["a photo of a cat", "a photo of coins", "a rocket on a launch pad", "printed text",
           "an eye's retina", "a street at night", "a bowl of soup", "a mountain lake"]  # fmt: skip


def _first(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("WARNING")]
    errors = [ln for ln in lines if "error" in ln.lower()]
    return ((errors or lines or [""])[-1]).strip()[:220]


def _metric(component: dict) -> dict:
    verify = next((s for s in component["steps"] if s["pass"] == "verify"), {})
    m = verify.get("metrics") or {}
    task = m.get("task_metric") or {}
    return {
        "metric": task.get("metric", "-"),
        "target": task.get("values"),
        "simulation": (m.get("cpu_simulation") or {}).get("task_metric"),
        "verified_on": m.get("verified_on", verify.get("status")),
    }


def cell(arch: str, target: str, tool_path: str | None) -> dict:
    """init + build of one architecture for one target, in this process's children."""
    from tests import text_families

    device, precision = target.split("/")
    folder = text_families.saved(arch, FOLDERS)
    row: dict = {"arch": arch, "target": target}
    env = {**os.environ, "PYTHONPATH": tool_path or str(REPO)}
    with tempfile.TemporaryDirectory(prefix=f"text-families-{arch}-") as tmp:
        work = Path(tmp)
        env["WINML_RECIPES_CACHE"] = str(work / "cache")

        def run(*args: object) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "winml_recipes", *map(str, args)],
                                  cwd=work, capture_output=True, text=True, timeout=TIMEOUT,
                                  env=env)  # fmt: skip

        done = run("init", folder, "--name", arch)
        if done.returncode != 0:
            return row | {"init": _first(done.stderr + done.stdout)}
        import yaml

        entry = yaml.safe_load((work / "catalog" / f"{arch}.yaml").read_text())
        row |= {"init": "ok", "task": entry["task"], "family": entry.get("family")}
        row["inputs"] = {c: list(s["inputs"]) for c, s in entry["components"].items()}
        started = time.perf_counter()
        done = run("build", f"recipes/{arch}.yaml", "--device", device, "--precision", precision,
                   "-o", work / "out", "--json")  # fmt: skip
        row["seconds"] = round(time.perf_counter() - started, 1)
        row["peak_mb"] = round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
        if done.returncode != 0:
            return row | {"build": _first(done.stderr)}
        manifest = json.loads(done.stdout)
        row["build"] = manifest.get("status", "ok")
        row["components"] = {c: _metric(s) for c, s in manifest["components"].items()}
        if entry.get("family") == "two_tower":
            row["zero_shot"] = zero_shot(work / "out" / arch / f"{device}-{precision}", device,
                                         work / "catalog" / f"{arch}.yaml")  # fmt: skip
    return row


def zero_shot(build: Path, device: str, catalog_path: Path) -> dict:
    """Top-1 agreement of the two built towers' image-text similarities with the float
    towers' on the bundled held-out photographs and PROMPTS (word ids: the tiny models
    have no trained tokenizer)."""
    import numpy as np

    from winml_recipes.bundled import bundled_images
    from winml_recipes.catalog import entry_from_text
    from winml_recipes.feeds import from_images
    from winml_recipes.metrics.zeroshot import zero_shot_agreement
    from winml_recipes.runtime.sessions import run_model
    from winml_recipes.runtime.target import run_on_target

    entry = entry_from_text(catalog_path.read_text(), catalog_path)
    vision = entry.components["vision_model"].contract
    text = entry.components["text_model"].contract
    photos = list(bundled_images("heldout"))
    images = list(from_images(photos, vision, len(photos), 0)())
    texts = prompt_feeds(PROMPTS, text)
    out = {}
    for who in ("float", "target"):
        embeds = []
        for comp, feeds in (("vision_model", images), ("text_model", texts)):
            if who == "float":
                got = run_model(build / "float-reference" / comp / "model.onnx", feeds)
            else:
                got = run_on_target(build / comp / "model.onnx", feeds, device).outputs
            embeds.append(np.concatenate([next(iter(g.values())) for g in got]))
        out[who] = tuple(embeds)
    return zero_shot_agreement(out["float"], out["target"])


def prompt_feeds(prompts: list[str], contract) -> list[dict]:
    """Each prompt as word ids (a stable hash of each word into the vocabulary), padded to
    the component's sequence length, with the inputs the text graph takes."""
    import zlib

    import numpy as np

    length = int(contract.dims.get("sequence", 16))
    ids_spec = next(s for s in contract.inputs if s.name == "input_ids")
    vocab = int(ids_spec.range[1]) if ids_spec.range else 100
    feeds = []
    for prompt in prompts:
        words = [3 + zlib.crc32(w.encode()) % (vocab - 3) for w in prompt.split()][: length - 2]
        ids = np.zeros(length, np.int64)
        ids[0], ids[1 : len(words) + 1], ids[len(words) + 1] = 1, words, 2
        mask = (np.arange(length) <= len(words) + 1).astype(np.int64)
        feed = {"input_ids": ids[None], "attention_mask": mask[None]}
        feeds.append({s.name: feed[s.name] for s in contract.inputs})
    return feeds


def main() -> None:
    from tests import text_families

    ap = argparse.ArgumentParser()
    ap.add_argument("--archs", default=",".join(text_families.ARCHITECTURES))
    ap.add_argument("--targets", default="npu/w8a16,cpu/int8")
    ap.add_argument("--json")
    ap.add_argument("--tool-path")
    ap.add_argument("--cell", nargs=2)
    args = ap.parse_args()
    if args.cell:
        print(json.dumps(cell(*args.cell, args.tool_path)))
        return
    rows = []
    for arch in args.archs.split(","):
        for target in args.targets.split(","):
            cmd = [sys.executable, __file__, "--cell", arch, target]
            cmd += ["--tool-path", args.tool_path] if args.tool_path else []
            done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                                  timeout=2 * TIMEOUT)  # fmt: skip
            line = next((ln for ln in reversed(done.stdout.splitlines()) if ln.startswith("{")),
                        None)  # fmt: skip
            row = json.loads(line) if line else {"arch": arch, "target": target,
                                                 "error": _first(done.stderr)}  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
