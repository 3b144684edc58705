"""Golden graph digests: every recipe x target that builds offline, pinned with pytest-regressions.

Structure is pinned exactly (I/O, opsets, op histogram, initializer bytes per dtype,
quantization facts, promoted tensors); quality as lower bounds. The byte fingerprint is
not pinned: it changes with any library's float paths and would make every upgrade a
rubber-stamped `make golden` (it stays in each output's graph.yaml).
Regenerate with `make golden` and read the diff: a change here is a behaviour change.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.conftest import RECIPES


def _builds_offline(recipe) -> bool:
    """Every source is local or a random-weight config (checked without resolving)."""
    from winml_recipes.sources import LocalHfDir, LocalOnnx, classify

    for comp in recipe.catalog.components.values():
        spec = comp.source
        if "config" in spec:
            continue
        ref = classify(spec["ref"], base=recipe.catalog.path.parent)
        if not isinstance(ref, LocalOnnx | LocalHfDir):
            return False
    return True


# Built by `make bench` (minutes, GBs at 1008 px); its graphs are sam3-tiny's at other sizes.
BENCH_ONLY = {"sam3-mid"}


GOLDEN_DIR = Path(__file__).with_suffix("")


def _case_id(recipe: str, device: str, precision: str, ep: str | None) -> str:
    """recipe-device-precision[-ep]: a target the recipe builds for another EP than the
    device's has one of its own."""
    return f"{recipe}-{device}-{precision}" + (f"-{ep}" if ep else "")


def _has_golden(*case) -> bool:
    name = re.sub(r"\W", "_", f"test_graph_digest[{_case_id(*case)}]")
    return (GOLDEN_DIR / f"{name}.yml").is_file()


def _offline_targets() -> list[tuple[str, str, str, str | None]]:
    """Targets of the repo's offline recipes that have a golden file; with
    WINML_GOLDEN_ALL=1 (`make golden`) every offline target, to create new ones. A recipe
    a user adds (e.g. with `init`) is not a golden case until `make golden` writes one."""
    from winml_recipes import api

    everything = os.environ.get("WINML_GOLDEN_ALL") == "1"
    cases = []
    for path in sorted(RECIPES.glob("*.yaml")):
        if path.stem in BENCH_ONLY:
            continue
        recipe = api.load(path)
        if _builds_offline(recipe):
            cases += [
                (path.stem, t.device, t.precision, t.ep or None)
                for t in recipe.targets
                if everything or _has_golden(path.stem, t.device, t.precision, t.ep or None)
            ]
    return cases


CASES = _offline_targets()


def test_every_local_recipe_has_golden_cases() -> None:
    assert ("sam3-tiny", "cpu", "fp32", None) in CASES


@pytest.mark.parametrize(
    ("recipe", "device", "precision", "ep"), CASES, ids=[_case_id(*c) for c in CASES]
)
def test_graph_digest(recipe, device, precision, ep, tmp_path, data_regression, request) -> None:

    import yaml

    from winml_recipes import api

    result = api.build(
        RECIPES / f"{recipe}.yaml",
        device=device,
        precision=precision,
        ep=ep,
        output_root=tmp_path,
    )
    digests = {
        name: yaml.safe_load((path.parent / "graph.yaml").read_text())
        for name, path in sorted(result.models.items())
    }
    for digest in digests.values():
        digest.pop("fingerprint")
    golden = GOLDEN_DIR / (re.sub(r"\W", "_", request.node.name) + ".yml")
    previous = yaml.safe_load(golden.read_text()) if golden.is_file() else {}
    for name, comp in result.manifest["components"].items():
        before = (previous or {}).get(name, {}).get("quality", {})
        digests[name]["quality"] = _quality(comp["steps"], before.get("sqnr_db_at_least", {}))
    data_regression.check(digests)


def _quality(steps: list[dict], bounds: dict[str, float]) -> dict:
    """Lower bounds on verify's SQNR, and the quantized share of MatMul/Conv.

    SQNR is pinned as a lower bound, not a value: a bound from the golden file is kept while
    the measurement meets it; a measurement below it writes a new bound (1 dB under the
    measurement, floored), which shows as a diff and fails.
    """
    import math

    out: dict = {}
    for step in steps:
        metrics = step.get("metrics", {})
        if step["pass"] == "verify" and step["status"] == "skipped":
            out["verify_skipped"] = step["reason"]
        elif step["pass"] == "verify":
            # Not where it was verified: that is a fact of the host (an OpenVINO target
            # verifies on OpenVINO on an Intel host, on the CPU simulation on an AMD one),
            # kept in the manifest. The bounds hold on both (docs/eps/openvino.md).
            out["sqnr_db_at_least"] = {
                k: bounds[k] if k in bounds and v["sqnr_db"] >= bounds[k]
                else math.floor(v["sqnr_db"]) - 1
                for k, v in metrics["outputs"].items()
            }  # fmt: skip
        if step["pass"] == "quantize" and "matmul_conv_quantized_fraction" in metrics:
            out["matmul_conv_quantized_fraction"] = metrics["matmul_conv_quantized_fraction"]
            auto = metrics.get("mixed_precision_auto")
            if auto:
                out["promoted_to_16bit"] = [p["tensor"] for p in auto["promoted"]]
                out["auto_scored_on"] = auto["scored_on"]
        if step["pass"] == "compile" and step["status"] != "skipped":
            out["compiled"] = sorted(a["name"] for a in step.get("artifacts", []))
    return out
