"""sam3-mid (the real 1008 px shapes and widths, 2 ViT layers) built for npu/w8a16 in a
fresh process: the full-size behaviour in minutes. Slow: `make test-slow`, not CI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import RECIPES, REPO

pytestmark = pytest.mark.slow


def test_sam3_mid_npu_build_fits_and_encodes_each_image_once(tmp_path: Path) -> None:
    env = {**os.environ, "WINML_RECIPES_CACHE": str(tmp_path / "cache")}
    cmd = [
        sys.executable, "-m", "winml_recipes", "build", str(RECIPES / "sam3-mid.yaml"),
        "--device", "npu", "--precision", "w8a16", "-o", str(tmp_path / "out"), "--json",
        "--memory-budget", "16GB",
    ]  # fmt: skip
    done = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    manifest = json.loads(done.stdout)
    enc = {s["pass"]: s for s in manifest["components"]["vision_encoder"]["steps"]}
    dec = {s["pass"]: s for s in manifest["components"]["prompt_encoder_mask_decoder"]["steps"]}
    # 8 decoder samples, 4 prompts per image: 2 images, both encoded by the encoder's own
    # calibration (4 images); its verification's reference serves the decoder's.
    assert dec["quantize"]["metrics"]["upstream_forwards"] == {"computed": 0, "reused": 2}
    assert dec["verify"]["metrics"]["upstream_forwards"] == {"computed": 0, "reused": 1}
    # the encoder on QNN HTP, every node placed there, and compiled (its 1008 px graph
    # prepares in about 1.4 GB since the rotary rewrite; > 16 GB before)
    rewrites = {r["rule"]: r["count"] for r in enc["prepare"]["metrics"]["rewrites"]}
    assert rewrites["rotate_pairwise_to_gather"] == 4  # q and k of both layers
    verify = enc["verify"]["metrics"]
    assert verify["verified_on"] == "qnn-htp", verify.get("verified_on")
    assert set(verify["placement"]["nodes"]) == {"QNNExecutionProvider"}
    assert enc["compile"]["status"] == "ran"
    for steps in (enc, dec):
        for name in ("fix_shapes", "quantize", "verify"):
            assert steps[name]["memory_estimate_mb"] > 0, name
    peak = max(s.get("peak_rss_mb") or 0 for s in [*enc.values(), *dec.values()])
    assert peak < 16 * 1024, peak
    # The estimate of the heaviest measured step is of the right size: the encoder's
    # calibration (a 1008 px forward) at least as much as a plain forward's 4.4 GB.
    assert enc["quantize"]["memory_estimate_mb"] >= 4000
