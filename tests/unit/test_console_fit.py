"""Console lines wrap at spaces to the console's width, never inside a word or a number,
and keep their indentation; a pipe gets whole lines."""

from __future__ import annotations

from winml_recipes.console import fit, fit_all

SUMMARY = (
    "    y: SQNR 47.05 dB (gate >= 20 dB, margin +27 dB) pass, cosine 0.99999 (gate >= "
    "0.99000, margin +0.00999) pass, max_abs 0.0281"
)


def test_a_long_line_wraps_at_spaces_with_its_indent() -> None:
    lines = fit(SUMMARY, 80)
    assert len(lines) == 2 and all(len(line) <= 80 for line in lines)
    assert lines[0].startswith("    y: ") and lines[1].startswith("        ")
    assert " ".join(line.strip() for line in lines) == SUMMARY.strip()  # no word cut


def test_a_number_stays_with_its_unit_and_a_long_path_stays_whole() -> None:
    line = "perf: model/model.onnx: one run 0.113 s; 5 warm-up and 200 timed runs, about 23 s"
    assert fit(line, 80) == [line[:76], "    23 s"]  # "23" is not left apart from "s"
    path = "/tmp/" + "x" * 90
    assert fit(f"wrote {path} and more", 80) == ["wrote", f"    {path}", "    and more"]


def test_the_width_comes_from_the_console(monkeypatch) -> None:
    monkeypatch.setenv("WINML_RECIPES_COLUMNS", "60")
    assert all(len(line) <= 60 for line in fit_all([SUMMARY]))
    monkeypatch.delenv("WINML_RECIPES_COLUMNS")
    assert fit_all([SUMMARY]) == [SUMMARY]  # a pipe (pytest's stdout): whole lines


def test_an_inherited_columns_does_not_wrap_a_pipe(monkeypatch) -> None:
    """readline exports COLUMNS into its process's environment, which children inherit:
    output to a pipe stays whole lines all the same (one error line is a contract)."""
    monkeypatch.delenv("WINML_RECIPES_COLUMNS", raising=False)
    monkeypatch.setenv("COLUMNS", "80")
    assert fit_all([SUMMARY]) == [SUMMARY]
