"""Golden graph digests: every recipe x target that builds offline, pinned with pytest-regressions.

Regenerate with `make golden` and read the diff: a change here is a behaviour change.
"""

from __future__ import annotations

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


def _offline_targets() -> list[tuple[str, str, str]]:
    from winml_recipes import api

    cases = []
    for path in sorted(RECIPES.glob("*.yaml")):
        recipe = api.load(path)
        if _builds_offline(recipe):
            cases += [(path.stem, t.device, t.precision) for t in recipe.targets]
    return cases


CASES = _offline_targets()


def test_every_local_recipe_has_golden_cases() -> None:
    assert ("sam3-tiny", "cpu", "fp32") in CASES


@pytest.mark.parametrize(
    ("recipe", "device", "precision"), CASES, ids=[f"{r}-{d}-{p}" for r, d, p in CASES]
)
def test_graph_digest(recipe, device, precision, tmp_path, data_regression) -> None:
    import yaml

    from winml_recipes import api

    result = api.build(
        RECIPES / f"{recipe}.yaml", device=device, precision=precision, output_root=tmp_path
    )
    digests = {
        name: yaml.safe_load((path.parent / "graph.yaml").read_text())
        for name, path in sorted(result.models.items())
    }
    for name, comp in result.manifest["components"].items():
        digests[name]["quality"] = _quality(comp["steps"])
    data_regression.check(digests)


def _quality(steps: list[dict]) -> dict:
    """Verify SQNR per output (0.1 dB) and the quantized share of MatMul/Conv nodes."""
    out: dict = {}
    for step in steps:
        metrics = step.get("metrics", {})
        if step["pass"] == "verify":
            out["sqnr_db"] = {k: round(v["sqnr_db"], 1) for k, v in metrics["outputs"].items()}
        if step["pass"] == "quantize" and "matmul_conv_quantized_fraction" in metrics:
            out["matmul_conv_quantized_fraction"] = metrics["matmul_conv_quantized_fraction"]
            auto = metrics.get("mixed_precision_auto")
            if auto:
                out["promoted_to_16bit"] = [p["tensor"] for p in auto["promoted"]]
    return out
