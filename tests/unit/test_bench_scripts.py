"""bench/ holds what `make bench` runs (bench/run.py and the cases it imports) and the
scripts that measure the docs' tables; one-off measurements live in experiments/, each
listed in experiments/README.md with the page that writes it up."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import REPO

# Scripts that measure the docs' tables (model families, the real-model corpus) or render
# them (tables, `make tables`): run when the tables are measured again, not by `make bench`.
TABLE_SCRIPTS = {
    "audio_families",
    "corpus",
    "image_classifiers",
    "tables",
    "text_families",
    "vision_tasks",
}


def _local_imports(path: Path, names: set[str]) -> set[str]:
    """The bench/ scripts `path` imports (`import x`, `from bench.x import ...`), lazy too."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name.removeprefix("bench.") for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module.removeprefix("bench."))
    return found & names


def _run_by_make_bench(bench: Path) -> set[str]:
    """bench/run.py and every bench/ script it imports, transitively."""
    names = {p.stem for p in bench.glob("*.py")}
    seen: set[str] = set()
    pending = ["run"]
    while pending:
        name = pending.pop()
        if name not in seen:
            seen.add(name)
            pending += _local_imports(bench / f"{name}.py", names)
    return seen


def test_make_bench_runs_bench_run_py() -> None:
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    target = re.search(r"^bench:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert target and "bench/run.py" in target.group(1)


def test_bench_holds_what_make_bench_runs_and_the_table_scripts() -> None:
    bench = REPO / "bench"
    run = _run_by_make_bench(bench)
    assert {"run", "htp", "mid", "algorithm_memory"} <= run  # it follows the real imports
    assert {p.stem for p in bench.glob("*.py")} - run - TABLE_SCRIPTS == set()


def test_every_experiment_is_listed_with_its_write_up() -> None:
    experiments = REPO / "experiments"
    listing = (experiments / "README.md").read_text(encoding="utf-8")
    scripts = sorted(p.name for p in experiments.glob("*.py"))
    assert "htp_prepare_memory.py" in scripts
    assert [s for s in scripts if f"`{s}`" not in listing] == []
    for page in re.findall(r"`(docs/[\w./-]+\.md)`", listing):
        assert (REPO / page).is_file(), page
