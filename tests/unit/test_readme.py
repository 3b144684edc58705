"""The docs' examples are real: the full recipe example (docs/recipes.md) validates and every
command README.md and docs/ name exists (tests/docs runs their code blocks)."""

from __future__ import annotations

import re

from tests.conftest import REPO, cli

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
DOCS = "\n".join(p.read_text() for p in PAGES)


def _yaml_blocks() -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", (REPO / "docs" / "recipes.md").read_text(), flags=re.S)


def test_the_full_recipe_example_validates(tmp_path, monkeypatch) -> None:
    """In an empty folder: its catalog entry and partials are the built-in ones."""
    example = next(b for b in _yaml_blocks() if b.startswith("# yaml-language-server"))
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "recipes" / "example.yaml"
    path.parent.mkdir()
    path.write_text(example)
    result = cli("validate", path)
    assert result.exit_code == 0, result.stderr


def test_every_documented_command_has_help() -> None:
    commands = set(re.findall(r"^(?:\$ )?winml-recipes ([a-z]+(?: [a-z]+)?)", DOCS, flags=re.M))
    assert {"validate", "plan", "build", "passes", "schema", "inspect", "dequantize"} <= {
        c.split()[0] for c in commands
    }
    for command in commands:
        words = command.split()
        if words[0] in ("catalog", "hub") and len(words) == 2:
            result = cli(*words, "--help")
        else:
            result = cli(words[0], "--help")
        assert result.exit_code == 0, command


def test_the_readme_stays_a_ten_minute_read() -> None:
    """Issue 37: at most about 250 lines, none over 200 characters; reference material
    belongs in a docs/ page the README's "Read more" list links."""
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move reference into docs/"
    assert not [i + 1 for i, line in enumerate(lines) if len(line) > 200]
    read_more = "\n".join(lines).split("## Read more", 1)[1]
    linked = set(re.findall(r"\]\((docs/[^)#]+\.md)\)", read_more))
    pages = {f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")}
    assert pages <= linked, f"docs pages the README does not list: {sorted(pages - linked)}"
