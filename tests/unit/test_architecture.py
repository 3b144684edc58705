"""The package's import graph has no cycles, counting imports inside functions too (a cycle
hidden in a function still couples the two modules). `if TYPE_CHECKING:` blocks are left out."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

PACKAGE = REPO / "winml_recipes"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return {m for m in found if m in modules}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def strongconnect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            strongconnect(v)
    return out


def test_no_import_cycles() -> None:
    modules = _modules()
    graph = {
        name: {m for m in _imports(path, modules) if m != name and not name.startswith(m + ".")}
        for name, path in modules.items()
    }
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]


# The SDK's interfaces to the package's services (model I/O, sample inputs, sessions on a
# target, memory estimates, the presets): what a pass may use of the package besides the
# SDK's core. They sit on top of the implementations; nothing in the package imports them
# but passes.
FACADES = {
    "winml_recipes.sdk.models",
    "winml_recipes.sdk.samples",
    "winml_recipes.sdk.runtime",
    "winml_recipes.sdk.memory",
    "winml_recipes.sdk.presets",
}
# The algorithms of our own passes (quantization, graph rewrites, exporters): what a
# third-party pass brings in its own package. Not engine services, so not in the SDK.
PASS_LIBRARIES = ("winml_recipes.quant", "winml_recipes.graph", "winml_recipes.exporters")


def test_the_sdk_imports_nothing_else_from_the_package() -> None:
    """Passes (ours and third parties') build on winml_recipes.sdk alone: its core sits at
    the bottom of the import graph, so an engine change can never make a plugin import
    cycle. Only its facades reach the package, and nothing below them imports them."""
    modules = _modules()
    sdk = {
        name: path
        for name, path in modules.items()
        if name.startswith("winml_recipes.sdk") and name not in FACADES
    }
    assert "winml_recipes.sdk.passes" in sdk  # the test looks at the real package
    assert set(modules) >= FACADES
    outside = {
        name: sorted(m for m in _imports(path, modules) if not m.startswith("winml_recipes.sdk"))
        for name, path in sdk.items()
    }
    assert {n: m for n, m in outside.items() if m} == {}
    users = {
        name: sorted(FACADES & _imports(path, modules))
        for name, path in modules.items()
        if not name.startswith(("winml_recipes.passes", "winml_recipes.sdk."))
    }
    assert {n: m for n, m in users.items() if m} == {}


def _pass_imports(path: Path, modules: dict[str, Path]) -> list[str]:
    """What a pass module imports of the package that is neither the SDK nor its own
    algorithm libraries."""
    allowed = ("winml_recipes.sdk", "winml_recipes.passes", *PASS_LIBRARIES)
    return sorted(
        m
        for m in _imports(path, modules)
        if m.startswith("winml_recipes") and not m.startswith(allowed)
    )


def test_passes_import_only_the_sdk() -> None:
    """A pass reaches the engine, model I/O, sample inputs and sessions through the SDK
    (winml_recipes.sdk: its core and facades), never the modules behind it, so writing a
    pass needs the SDK alone and those modules can change under it."""
    modules = _modules()
    passes = {n: p for n, p in modules.items() if n.startswith("winml_recipes.passes.")}
    assert {"winml_recipes.passes.quantize", "winml_recipes.passes.verify"} <= set(passes)
    found = {name: _pass_imports(path, modules) for name, path in passes.items()}
    assert {n: m for n, m in found.items() if m} == {}


def test_the_pass_import_rule_catches_a_reach_past_the_sdk(tmp_path: Path) -> None:
    modules = _modules()
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from winml_recipes.sdk import Pass\nfrom winml_recipes import __version__\n"
        "def run():\n    from winml_recipes.engine.budget import RewritesGraph\n"
        "    import winml_recipes.feeds\n"
    )
    assert _pass_imports(bad, modules) == [
        "winml_recipes",
        "winml_recipes.engine.budget",
        "winml_recipes.feeds",
    ]


def _string_literals(path: Path) -> list[str]:
    """Every string constant of a module (f-string parts included), docstrings left out."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        if id(node) not in docstrings
    ]


def test_the_engine_names_no_pass() -> None:
    """Passes are plugins: the engine acts on what they declare, never on their names (a
    command line the engine suggests, `winml-recipes ...`, is not a pass). resolve.py is left
    out: its "export" is a source kind, recorded as such in manifests."""
    import re

    from winml_recipes.sdk.passes import all_passes

    names = sorted(all_passes())
    assert {"quantize", "dequantize", "export", "verify"} <= set(names)
    word = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")
    found = {
        f"{path.name}: {text!r}"
        for path in sorted((PACKAGE / "engine").glob("*.py"))
        if path.name != "resolve.py"
        for text in _string_literals(path)
        if word.search(text) and not text.startswith("winml-recipes ")
    }
    assert found == set()


def test_every_name_of_the_sdk_facades_resolves() -> None:
    """A facade's names load on first use: each one it lists is there (a renamed function
    behind it fails here, not in a pass at build time)."""
    import importlib

    for facade in sorted(FACADES):
        module = importlib.import_module(facade)
        assert module.__all__, facade
        for name in module.__all__:
            assert getattr(module, name) is not None, f"{facade}.{name}"


# onnxruntime ships its generic mixed-precision override fixer under a module path named for
# QNN; importing it is not knowledge of the EP.
_LIBRARY_PATHS_NAMING_QNN = ("onnxruntime.quantization.execution_providers.qnn.",)


def test_only_the_qnn_plugin_names_qnn():
    """A target runtime is known in one place, its EP plugin (eps/qnn): no other module of
    the package names it (the presets data may map a device to it)."""
    plugin = PACKAGE / "eps" / "qnn"
    found = []
    for path in PACKAGE.rglob("*.py"):
        if plugin in path.parents:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if any(p in line for p in _LIBRARY_PATHS_NAMING_QNN):
                continue
            if "qnn" in line.lower():
                found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


CLI_MODULE_MAX_LINES = 400


def test_the_cli_is_one_thin_module_per_command_group() -> None:
    """Every command lives in a module of winml_recipes/cli/ named for its group, over the
    API: no module holds most of the command line (cli.py was 1,127 lines), and the command
    modules share only cli/app.py (the group, its error handling, the shared options)."""
    import click

    from winml_recipes.cli import main

    def walk(cmd: click.Command, path: str) -> dict[str, str]:
        out = {path: cmd.callback.__module__} if path else {}
        for name, sub in getattr(cmd, "commands", {}).items():
            out.update(walk(sub, f"{path} {name}".strip()))
        return out

    homes = walk(main, "")
    assert {"build", "run", "compare", "catalog list", "cache prune"} <= set(homes)
    misplaced = {
        c: m
        for c, m in homes.items()
        if not m.startswith("winml_recipes.cli.") or m == "winml_recipes.cli.app"
    }
    assert misplaced == {}
    modules = _modules()
    cli = {n: p for n, p in modules.items() if n.startswith("winml_recipes.cli.")}
    long = {
        n: n_lines
        for n, p in cli.items()
        if (n_lines := len(p.read_text().splitlines())) > CLI_MODULE_MAX_LINES
    }
    assert long == {}
    shared = {
        n: sorted(m for m in _imports(p, modules) if m.startswith("winml_recipes.cli."))
        for n, p in cli.items()
    }
    assert {n: m for n, m in shared.items() if m not in ([], ["winml_recipes.cli.app"])} == {}
