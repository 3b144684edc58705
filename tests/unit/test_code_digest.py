"""Cache keys follow the code: a pass's digest covers its module and what it imports."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from winml_recipes.engine import code_digest as cd


@pytest.fixture
def package(tmp_path: Path, monkeypatch):
    root = tmp_path / "fakepkg"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "sub" / "__init__.py").write_text("")
    (root / "sub" / "helper.py").write_text("VALUE = 1\n")
    (root / "unrelated.py").write_text("OTHER = 1\n")
    (root / "passmod.py").write_text(
        "class MyPass:\n"
        "    def run(self):\n"
        "        from fakepkg.sub import helper  # imported inside a function\n"
        "        return helper.VALUE\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield root
    for name in [m for m in sys.modules if m.startswith("fakepkg")]:
        del sys.modules[name]


def _digest() -> str:
    cd._closure_digest.cache_clear()
    cd._source.cache_clear()
    return cd.code_digest(importlib.import_module("fakepkg.passmod").MyPass)


def test_digest_follows_imported_modules_only(package: Path) -> None:
    first = _digest()
    (package / "unrelated.py").write_text("OTHER = 2\n")
    assert _digest() == first
    (package / "sub" / "helper.py").write_text("VALUE = 2\n")
    changed = _digest()
    assert changed != first
    (package / "passmod.py").write_text((package / "passmod.py").read_text() + "# edit\n")
    assert _digest() != changed


def test_builtin_passes_have_distinct_digests() -> None:
    from winml_recipes.sdk.passes import all_passes

    digests = {name: cd.code_digest(cls) for name, cls in all_passes().items()}
    assert len(set(digests.values())) == len(digests)


def test_imports_after_a_plain_import_line_are_found() -> None:
    """`from x import a` followed by more import lines: the names end with the line (the
    prepare pass's rule modules were missing from its key, so edits to them hit the cache)."""
    from winml_recipes.engine.code_digest import _imports

    text = (
        "from typing import Any\n\nimport onnx\n\nfrom pkg.fold import A, b\n"
        "from pkg.other import (\n    C,\n    d,\n)\nimport pkg.last\n"
    )
    found = _imports(text, "pkg.main", "pkg")
    assert {"pkg.fold", "pkg.fold.b", "pkg.other", "pkg.other.d", "pkg.last"} <= set(found)
    assert not [m for m in found if m.endswith((".from", ".import", ".pkg"))]
