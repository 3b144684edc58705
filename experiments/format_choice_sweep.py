"""Every family's tiny `save_pretrained` folder through `init` and `build --device cpu
--precision int8`: what quantize's mode auto kept (static or a dynamic candidate), the static
model's task values and missed gates, and verify's values. One JSON line per folder.

    python experiments/format_choice_sweep.py OUT_DIR [ARCH ...]

The folders come from tests/vision_models.py, tests/image_classifiers.py,
tests/text_families.py and tests/audio_models.py (seeded random weights); OUT_DIR keeps
them, the recipes and the builds.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests import audio_models, image_classifiers, text_families, vision_models  # noqa: E402


def _folders(root: Path) -> list[tuple[str, Callable[[], Path]]]:
    hf = root / "hf"

    def vision(arch: str) -> Path:
        folder = hf / arch
        if (folder / "config.json").is_file():
            return folder
        return vision_models.save_tiny(arch, folder)

    cases: list[tuple[str, Callable[[], Path]]] = [
        (a, lambda a=a: vision(a)) for a in vision_models.TINY
    ]
    for module in (image_classifiers, text_families, audio_models):
        cases += [(a, lambda a=a, m=module: m.saved(a, hf)) for a in module.ARCHITECTURES]
    return cases


def _records(build: Path) -> dict:
    out = {}
    for manifest in build.glob("cpu-int8*/manifest.json"):
        for name, comp in json.loads(manifest.read_text())["components"].items():
            steps = {s["pass"]: s.get("metrics") or {} for s in comp["steps"]}
            choice = steps.get("quantize", {}).get("format_choice") or {}
            static = next((t for t in choice.get("tried", []) if t["candidate"] == "static"), {})
            out[name] = {
                "kept": choice.get("kept"),
                "static": static.get("task_metric"),
                "static_missed": static.get("missed"),
                "verify": (steps.get("verify", {}).get("task_metric") or {}).get("values"),
            }
    return out


def main() -> None:
    root = Path(sys.argv[1]).resolve()
    root.mkdir(parents=True, exist_ok=True)
    only = set(sys.argv[2:])
    cli = [sys.executable, "-m", "winml_recipes"]
    for arch, make in _folders(root):
        if only and arch not in only:
            continue
        name = "".join(c if c.isalnum() else "-" for c in arch.lower())[:40]
        subprocess.run([*cli, "init", str(make()), "--name", name], cwd=root, capture_output=True)
        started = time.time()
        done = subprocess.run(
            [*cli, "build", f"recipes/{name}.yaml", "--device", "cpu", "--precision", "int8",
             "-o", "out"], cwd=root, capture_output=True, text=True,
        )  # fmt: skip
        row = {"arch": arch, "exit": done.returncode, "seconds": round(time.time() - started, 1)}
        print(json.dumps(row | {"components": _records(root / "out" / name)}), flush=True)


if __name__ == "__main__":
    main()
