"""report.html's file sizes: in a unit that keeps small files readable (a compiled
model_ctx.onnx of a few kB showed as "0.00" MB)."""

from __future__ import annotations

import pytest

from winml_recipes.report import size_text


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (0, "0 B"),
        (812, "812 B"),
        (1_190, "1.19 kB"),
        (151_234, "151 kB"),
        (999_999, "1 MB"),
        (999_400, "999 kB"),
        (2_345_678, "2.35 MB"),
        (640_000_000, "640 MB"),
        (3_100_000_000, "3.1 GB"),
        (4_200_000_000_000, "4200 GB"),
    ],
)
def test_sizes_keep_three_figures_in_their_unit(size: int, text: str) -> None:
    assert size_text(size) == text
