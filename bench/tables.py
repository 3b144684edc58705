"""Render the measured tables of the docs from their recorded results: `make tables`.

Each `docs/results/NAME.json` holds one table: the page it belongs in (`doc`), what it
measures (`about`), the command that measures it (`command`), its `columns`, and its
`rows`, each with its `cells` and the `commit` that recorded it (the measurement ran on
that change's tree; a row re-measured later carries its own commit). The table is written
between `<!-- table:NAME -->` and `<!-- /table:NAME -->` in that page, with a last column
naming each row's commit, so a page never mixes commits silently. To change a number,
edit the results file (or write it from the bench script's JSON) and run `make tables`;
`tests/docs/test_tables.py` fails when a page's table differs from what its results render.

`python bench/tables.py` rewrites the regions; `--check` changes nothing and exits 1
naming each page whose table differs. Needs nothing but the standard library.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "results"
COMMIT = re.compile(r"[0-9a-f]{7,40}")


def load(path: Path) -> dict:
    """One results file, checked: every row has as many cells as there are columns and a
    commit."""
    data = json.loads(path.read_text(encoding="utf-8"))
    width = len(data["columns"])
    for i, row in enumerate(data["rows"]):
        if len(row["cells"]) != width:
            raise SystemExit(f"{path.name}: row {i}: {len(row['cells'])} cells, {width} columns")
        if not COMMIT.fullmatch(str(row.get("commit") or "")):
            raise SystemExit(f"{path.name}: row {i}: no commit it was measured at")
    return data


def render(data: dict) -> str:
    """The Markdown table of one results file, with the commit column last."""
    head = [*data["columns"], "recorded in"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in data["rows"]:
        lines.append("| " + " | ".join([*row["cells"], f"`{row['commit']}`"]) + " |")
    return "\n".join(lines)


def region(name: str) -> re.Pattern[str]:
    name = re.escape(name)
    return re.compile(rf"(<!-- table:{name} -->\n)(.*?)(\n<!-- /table:{name} -->)", re.S)


def rendered_pages() -> dict[Path, tuple[str, str]]:
    """Each page with a table: (its text now, its text with every table rendered)."""
    pages: dict[Path, tuple[str, str]] = {}
    for path in sorted(RESULTS.glob("*.json")):
        data = load(path)
        page = REPO / data["doc"]
        now, new = pages.get(page) or (page.read_text(encoding="utf-8"),) * 2
        found = region(path.stem)
        if not found.search(new):
            raise SystemExit(f"{data['doc']}: no <!-- table:{path.stem} --> region for {path.name}")
        table = render(data)
        new = found.sub(lambda m, t=table: m.group(1) + t + m.group(3), new, count=1)
        pages[page] = (now, new)
    return pages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    args = parser.parse_args(argv)
    stale = [page for page, (now, new) in rendered_pages().items() if now != new]
    if args.check:
        for page in stale:
            print(f"{page.relative_to(REPO)}: a table differs from docs/results (make tables)")
        return 1 if stale else 0
    for page, (_, new) in rendered_pages().items():
        if page in stale:
            page.write_text(new, encoding="utf-8")
            print(f"rendered {page.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
