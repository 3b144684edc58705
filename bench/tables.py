"""Render the measured tables of the docs from their recorded results: `make tables`.

Each `docs/results/NAME.json` holds one table: the page it belongs in (`doc`), what it
measures (`about`), the command that measures it (`command`), its `columns`, and its
`rows`, each with its `cells` and the `commit` that recorded it (the measurement ran on
that change's tree; a row re-measured later carries its own commit). The table is written
between `<!-- table:NAME -->` and `<!-- /table:NAME -->` in that page, with a last column
naming each row's commit, so a page never mixes commits silently. To change a number,
edit the results file (or write it from the bench script's JSON) and run `make tables`;
`tests/docs/test_tables.py` fails when a page's table differs from what its results render.

A results file with `families` instead of `rows` is a summary derived from the others
(README's table of task families): each family lists its `evidence`, rows of other results
files named by their first cell, and each target column counts the rows whose cell for
that target (the first column naming it) holds no failure, naming the ones that fail; the
commit column lists the evidence rows' commits. So the summary cannot claim more than the
measured rows say.

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


FAILED = re.compile(r"fail|refus|error|exit \d", re.I)


def _target_column(columns: list[str], target: str) -> int | None:
    """The first column measuring `target` after the change (not a "before" column)."""
    return next(
        (i for i, c in enumerate(columns) if target in c and "before" not in c.lower()), None
    )


def derive(data: dict, results: Path) -> dict:
    """The summary rows of a `families` file from the rows of the results it cites."""
    sources: dict[str, dict] = {}
    rows = []
    for family in data["families"]:
        counts: dict[str, list] = {t: [] for t in data["targets"]}
        commits: list[str] = []
        for source, first_cell, short in family["evidence"]:
            table = sources.get(source) or sources.setdefault(
                source, load(results / f"{source}.json")
            )
            row = next((r for r in table["rows"] if r["cells"][0] == first_cell), None)
            if row is None:
                raise SystemExit(f"{source}.json: no row {first_cell!r} ({family['family']})")
            commits += [row["commit"]] if row["commit"] not in commits else []
            for target, found in counts.items():
                column = _target_column(table["columns"], target)
                cell = row["cells"][column] if column is not None else ""
                if cell.strip() not in ("", "-"):
                    found.append((short, not FAILED.search(cell)))
        status = []
        for found in counts.values():
            failed = [name for name, ok in found if not ok]
            if not found:
                status.append("-")
                continue
            text = f"{len(found) - len(failed)} of {len(found)}"
            status.append(text + (f" (fails: {', '.join(failed)})" if failed else ""))
        cells = [family["family"], ", ".join(e[2] for e in family["evidence"]),
                 family["judged_by"], *status]  # fmt: skip
        rows.append({"cells": cells, "commit": ", ".join(commits)})
    return {**data, "rows": rows}


def load(path: Path) -> dict:
    """One results file, checked: every row has as many cells as there are columns and a
    commit (a `families` summary is derived from the results it cites first)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if "families" in data:
        return derive(data, path.parent)
    width = len(data["columns"])
    for i, row in enumerate(data["rows"]):
        if len(row["cells"]) != width:
            raise SystemExit(f"{path.name}: row {i}: {len(row['cells'])} cells, {width} columns")
        if not all(COMMIT.fullmatch(c) for c in str(row.get("commit") or "").split(", ")):
            raise SystemExit(f"{path.name}: row {i}: no commit it was measured at")
    return data


def render(data: dict) -> str:
    """The Markdown table of one results file, with the commit column last."""
    head = [*data["columns"], "recorded in"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in data["rows"]:
        commits = ", ".join(f"`{c}`" for c in row["commit"].split(", "))
        lines.append("| " + " | ".join([*row["cells"], commits]) + " |")
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
