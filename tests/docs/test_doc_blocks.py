"""Docs are executed: every ```sh / ```bash / ```python block in README.md and docs/ runs as
written, or is marked as an example that is not run, with the reason.

Mark a block with an HTML comment on the line before its fence:

- `<!-- run: fast -->` runs in the suite, `<!-- run: slow -->` behind `-m slow`;
  `, session=NAME` runs the blocks of one file that share NAME in order, in one folder
  (a walkthrough: the Python block writes the files the shell block builds);
- `<!-- not-run: REASON -->` is an example that needs what the suite cannot give it here
  (a build folder, the Hub, a photo of the user's), with the reason.

A shell block runs under bash with this environment's `winml-recipes` first on PATH. In a
block whose lines start with `$ `, those lines are the commands and every other line (but
blank ones and `...`) is output that must appear in what they print.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO

LANGS = ("sh", "bash", "python")
FENCE = re.compile(r"^```(\w+)\s*$")
MARK = re.compile(r"^<!--\s*(run|not-run)\s*:\s*(.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    mark: str | None  # run, not-run, None
    detail: str  # run: "fast[, session=NAME]"; not-run: the reason

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"

    @property
    def speed(self) -> str:
        return self.detail.split(",")[0].strip()

    @property
    def session(self) -> str:
        found = re.search(r"session\s*=\s*([\w.-]+)", self.detail)
        return found.group(1) if found else f"line{self.line}"


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """The code blocks of one Markdown file in the languages that run, with their marks."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        assert end is not None, f"{path}:{i + 1}: code block never closed"
        if fence.group(1) in LANGS:
            before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            mark = MARK.match(before.strip())
            found.append(
                Block(
                    path,
                    i + 1,
                    fence.group(1),
                    "\n".join(lines[i + 1 : end]) + "\n",
                    mark.group(1) if mark else None,
                    mark.group(2) if mark else "",
                )
            )
        i = end + 1
    return found


ALL = [b for p in doc_files() for b in blocks(p)]


def sessions(speed: str) -> dict[str, list[Block]]:
    """Blocks that run at `speed`, grouped by (file, session), in file order."""
    groups: dict[str, list[Block]] = {}
    for b in ALL:
        if b.mark == "run" and b.speed == speed:
            groups.setdefault(f"{b.path.relative_to(REPO)}::{b.session}", []).append(b)
    return groups


def test_every_runnable_block_is_run_or_says_why_not() -> None:
    wrong = []
    for b in ALL:
        if b.mark is None:
            wrong.append(
                f"{b.where}: unmarked {b.lang} block (add <!-- run: fast --> or "
                "<!-- not-run: reason --> on the line before it)"
            )
        elif b.mark == "not-run" and len(b.detail) < 10:
            wrong.append(f"{b.where}: not-run needs a reason")
        elif b.mark == "run" and b.speed not in ("fast", "slow"):
            wrong.append(f"{b.where}: run: says neither fast nor slow ({b.detail!r})")
    assert not wrong, "\n".join(wrong)


def test_the_own_model_walkthrough_is_in_the_readme_and_runs_in_the_suite() -> None:
    walk = sessions("fast").get("README.md::own-model", [])
    assert [b.lang for b in walk] == ["python", "sh"], walk
    assert "winml-recipes build --onnx" in walk[1].code and "--eval-data" in walk[1].code


def _env(folder: Path) -> dict[str, str]:
    bindir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", ""),
            "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}  # fmt: skip


def _run(block: Block, folder: Path, timeout: float) -> None:
    env = _env(folder)
    if block.lang == "python":
        cmds, shown = [[sys.executable, "-c", block.code]], []
    else:
        lines = block.code.splitlines()
        if any(line.startswith("$ ") for line in lines):
            cmds = [["bash", "-eo", "pipefail", "-c", ln[2:]] for ln in lines if ln[:2] == "$ "]
            shown = [ln.strip() for ln in lines if ln.strip() not in ("", "...") and ln[:2] != "$ "]
        else:
            cmds, shown = [["bash", "-eo", "pipefail", "-c", block.code]], []
    printed = ""
    for cmd in cmds:
        done = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip
        assert done.returncode == 0, (
            f"{block.where}: {block.lang} block exited {done.returncode}:\n"
            f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
        printed += done.stdout
    got = [" ".join(line.split()) for line in printed.splitlines()]
    missing = [s for s in shown if " ".join(s.split()) not in got]
    assert not missing, f"{block.where}: the block shows lines its commands do not print: {missing}"


def _run_session(group: list[Block], folder: Path, timeout: float) -> float:
    start = time.perf_counter()
    for block in group:
        _run(block, folder, timeout)
    return time.perf_counter() - start


@pytest.mark.parametrize("name", sorted(sessions("fast")))
def test_fast_doc_blocks_run(name: str, tmp_path: Path) -> None:
    _run_session(sessions("fast")[name], tmp_path, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(sessions("slow")) or ["(none)"])
def test_slow_doc_blocks_run(name: str, tmp_path: Path) -> None:
    if name == "(none)":
        return
    _run_session(sessions("slow")[name], tmp_path, timeout=3600)


def test_every_relative_link_in_the_docs_resolves() -> None:
    """A page moved or renamed leaves no link (or the README's picture) pointing nowhere."""
    dead = []
    for page in doc_files():
        for found in re.finditer(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            target = found.group(1)
            if "://" not in target and not (page.parent / target).exists():
                dead.append(f"{page.relative_to(REPO)}: {target}")
    assert not dead, dead
