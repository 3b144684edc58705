"""Tables cannot go stale: every measured table in docs/ is what its recorded results
(docs/results/NAME.json, each row with the commit it was measured at) render, and the
renderer (`make tables`, bench/tables.py) refuses a row without a commit."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
import tables


def test_every_docs_table_is_what_its_results_render() -> None:
    pages = tables.rendered_pages()
    assert {p.name for p in pages} >= {"measurements.md", "models.md", "recipes.md"}
    stale = [str(p.relative_to(REPO)) for p, (now, new) in pages.items() if now != new]
    assert not stale, f"tables differ from docs/results (run `make tables`): {stale}"


def test_an_edited_number_is_caught(tmp_path: Path, monkeypatch) -> None:
    """A results row changed without `make tables` (or a table edited by hand) fails."""
    doc = tmp_path / "docs" / "page.md"
    results = tmp_path / "docs" / "results"
    results.mkdir(parents=True)
    data = {"doc": "docs/page.md", "about": "x", "command": "x", "columns": ["model", "cosine"],
            "rows": [{"cells": ["minilm-l6", "0.9989"], "commit": "ecb7ddf"}]}  # fmt: skip
    (results / "t.json").write_text(json.dumps(data))
    table = tables.render(data)
    doc.write_text(f"# x\n\n<!-- table:t -->\n{table}\n<!-- /table:t -->\n")
    monkeypatch.setattr(tables, "REPO", tmp_path)
    monkeypatch.setattr(tables, "RESULTS", results)
    assert tables.main(["--check"]) == 0
    doc.write_text(doc.read_text().replace("0.9989", "0.8096"))
    assert tables.main(["--check"]) == 1
    assert tables.main([]) == 0 and "0.9989" in doc.read_text()
    data["rows"][0]["commit"] = ""
    (results / "t.json").write_text(json.dumps(data))
    with pytest.raises(SystemExit, match="no commit it was measured at"):
        tables.main(["--check"])


def test_the_stale_rows_the_issue_named_are_fixed() -> None:
    corpus = json.loads((REPO / "docs" / "results" / "corpus.json").read_text())
    rows = {(r["cells"][0], r["cells"][2]): r for r in corpus["rows"]}
    assert rows[("minilm-l6", "w8a16")]["cells"][4].startswith("0.9989")
    for precision in ("w8a16", "uint8"):
        assert not rows[("hf-whisper-encoder via init", precision)]["cells"][4].startswith("fails")


def test_the_family_summary_counts_only_what_its_rows_measured(tmp_path: Path) -> None:
    """README's family table is derived: a failing cell in a cited row shows as a failure
    with its name, a row that does not exist is refused, a missing target is not measured."""
    results = tmp_path / "results"
    results.mkdir()
    rows = [
        {"cells": ["A", "fails", "ok: top-1 1.0", "FAIL: top-1 0.5"], "commit": "abc1234"},
        {"cells": ["B", "ok", "fails: refused 3 nodes", "-"], "commit": "def5678"},
    ]
    columns = ["architecture", "npu/w8a16 before", "npu/w8a16 on HTP", "cpu/int8"]
    detail = {"doc": "d.md", "about": "x", "command": "x", "columns": columns, "rows": rows}
    (results / "detail.json").write_text(json.dumps(detail))
    summary = {"doc": "README.md", "about": "x", "command": "x",
               "columns": ["family", "architectures", "judged by", "npu", "cpu"],
               "targets": ["npu/w8a16", "cpu/int8"],
               "families": [{"family": "f", "judged_by": "m",
                             "evidence": [["detail", "A", "a"], ["detail", "B", "b"]]}],
               }  # fmt: skip
    (results / "families.json").write_text(json.dumps(summary))
    (row,) = tables.load(results / "families.json")["rows"]
    # the "before" column is not the target's: A verifies on npu, B fails there; cpu: only
    # A measured, and it failed
    assert row["cells"][3:] == ["1 of 2 (fails: b)", "0 of 1 (fails: a)"]
    assert row["commit"] == "abc1234, def5678"
    summary["families"][0]["evidence"].append(["detail", "C", "c"])
    (results / "families.json").write_text(json.dumps(summary))
    with pytest.raises(SystemExit, match="no row 'C'"):
        tables.load(results / "families.json")
