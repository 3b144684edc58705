"""report.html makes all its HTML through one autoescaping path (winml_recipes.safehtml):
no f-string or %-format in the page's modules builds markup, where a manifest value could
slip through unescaped (issue 36: a placement value added a <meta> refresh)."""

from __future__ import annotations

import ast
from pathlib import Path

import winml_recipes

PAGE_MODULES = ("report.py", "report_svg.py")


def _markup_fstrings(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(
                v.value
                for v in node.values
                if isinstance(v, ast.Constant) and isinstance(v.value, str)
            )
            if "<" in text and ">" in text:
                found.append(f"{path.name}:{node.lineno}")
    return found


def test_the_page_builds_no_markup_outside_the_escaping_path() -> None:
    root = Path(winml_recipes.__file__).parent
    found = [hit for name in PAGE_MODULES for hit in _markup_fstrings(root / name)]
    assert found == [], f"markup built with f-strings (use safehtml.h): {found}"
    for name in PAGE_MODULES:
        text = (root / name).read_text(encoding="utf-8")
        assert "html.escape" not in text and "import html" not in text, name


def test_safehtml_escapes_every_value_but_its_own_fragments() -> None:
    from winml_recipes.safehtml import h, join

    hostile = '<meta http-equiv=refresh content="0;url=http://127.0.0.1:1/">'
    cell = h("<td>{}</td>", hostile)
    assert "<meta" not in cell and "&lt;meta" in cell and "&#34;" in cell
    row = join([cell, hostile, h("<td>{:.1f}</td>", 2.25)])
    assert row.count("<td>") == 2 and "<meta" not in row and "<td>2.2</td>" in row
