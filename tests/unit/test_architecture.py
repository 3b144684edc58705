"""The package's import graph has no cycles, counting imports inside functions too (a cycle
hidden in a function still couples the two modules). `if TYPE_CHECKING:` blocks are left out."""

from __future__ import annotations

import ast
from functools import cache
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
    return {m for m in _imported_names(path, path.read_text(encoding="utf-8")) if m in modules}


@cache
def _imported_names(path: Path, text: str) -> frozenset[str]:
    """Every name an import of `text` (the source of `path`) may bind, inside functions too;
    parsed once per source for all the tests here."""
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

    visit(ast.parse(text))
    return frozenset(found)


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


# The package's layers, bottom first: a module imports only from its own layer and those
# below it (imports inside functions counted). A module belongs to the layer of the longest
# name below that is it or one of its packages (the root package, winml_recipes, is only
# itself); a new module must be placed here.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # The SDK's core: types, errors, configs, records, the Pass and EP interfaces.
    ("sdk core", ("winml_recipes", "winml_recipes.sdk")),
    # Files, formats and facts over the core: hostile-input checks, bundled data, the Hub,
    # ONNX loading and digests, the presets.
    (
        "foundations",
        (
            "winml_recipes.bundled",
            "winml_recipes.console",
            "winml_recipes.copyfile",
            "winml_recipes.data",
            "winml_recipes.datafiles",
            "winml_recipes.finitejson",
            "winml_recipes.hub",
            "winml_recipes.hubguard",
            "winml_recipes.images",
            "winml_recipes.modelfolder",
            "winml_recipes.onnx",
            "winml_recipes.outputroot",
            "winml_recipes.pictures",
            "winml_recipes.presets",
            "winml_recipes.prompts",
            "winml_recipes.report_svg",
            "winml_recipes.safehtml",
            "winml_recipes.safewrite",
            "winml_recipes.sources",
            "winml_recipes.speech",
            "winml_recipes.standin",
            "winml_recipes.tasks",
            "winml_recipes.untrusted",
            "winml_recipes.yamlfile",
        ),
    ),
    # Sessions on an EP plugin, what a run costs, the memory budget.
    ("runtime", ("winml_recipes.runtime", "winml_recipes.runcost", "winml_recipes.engine.budget")),
    # Sample inputs: synthetic, npz, images, datasets, upstream outputs.
    ("inputs", ("winml_recipes.feeds", "winml_recipes.hfdata", "winml_recipes.labelprompts")),
    # What the SDK hands to passes: facades over the three layers below.
    ("services", ("winml_recipes.services",)),
    # The algorithms of our own passes: what a third-party pass brings in its own package.
    ("pass libraries", ("winml_recipes.quant", "winml_recipes.graph", "winml_recipes.exporters")),
    # Plugins found through entry points: passes, EPs, task metrics.
    ("plugins", ("winml_recipes.passes", "winml_recipes.eps", "winml_recipes.metrics")),
    # Recipes, the catalog, planning, running with the cache, build folders, reports.
    (
        "engine",
        (
            "winml_recipes.buildfolder",
            "winml_recipes.catalog",
            "winml_recipes.engine",
            "winml_recipes.exec",
            "winml_recipes.progress",
            "winml_recipes.recipe",
            "winml_recipes.report",
            "winml_recipes.report_bounds",
            "winml_recipes.schemas",
        ),
    ),
    # The API and what it composes over builds.
    (
        "api",
        (
            "winml_recipes.api",
            "winml_recipes.authoring",
            "winml_recipes.compare_inputs",
            "winml_recipes.perf",
            "winml_recipes.pipeline",
            "winml_recipes.presenter",
            "winml_recipes.runbuild",
        ),
    ),
    ("cli", ("winml_recipes.cli", "winml_recipes.clihelp", "winml_recipes.__main__")),
]


def _layer_of(name: str, layers: list[tuple[str, tuple[str, ...]]] = LAYERS) -> int | None:
    """The index of `name`'s layer: that of the longest entry naming it or a package of it
    (the root package's entry names only the root)."""
    matches = [
        (len(entry), index)
        for index, (_, entries) in enumerate(layers)
        for entry in entries
        if name == entry or (entry != "winml_recipes" and name.startswith(entry + "."))
    ]
    return max(matches)[1] if matches else None


def _upward_imports(
    modules: dict[str, Path], layers: list[tuple[str, tuple[str, ...]]] = LAYERS
) -> list[str]:
    """Every import (inside functions too) of a module from a layer above its own."""
    found = []
    for name, path in sorted(modules.items()):
        own = _layer_of(name, layers)
        for target in sorted(_imports(path, modules)):
            if name.startswith(target + "."):  # a module's own packages run first anyway
                continue
            above = _layer_of(target, layers)
            if own is not None and above is not None and above > own:
                found.append(f"{name} ({layers[own][0]}) -> {target} ({layers[above][0]})")
    return found


def test_every_module_has_a_layer() -> None:
    unplaced = sorted(n for n in _modules() if _layer_of(n) is None)
    assert unplaced == [], "place these in LAYERS (tests/unit/test_architecture.py)"


def test_the_layers_read_top_to_bottom() -> None:
    """Nothing imports from a layer above its own: the SDK's core imports nothing of the
    package, the services passes use sit above what they front, the CLI on top."""
    modules = _modules()
    assert len(modules) > 100  # the real package
    assert _upward_imports(modules) == []


def test_the_layer_rule_catches_a_lazy_upward_import(tmp_path: Path) -> None:
    root = tmp_path / "winml_recipes"
    (root / "sdk").mkdir(parents=True)
    (root / "sdk" / "__init__.py").write_text("")
    (root / "sdk" / "models.py").write_text("def load():\n    from winml_recipes.onnx import io\n")
    (root / "onnx").mkdir()
    (root / "onnx" / "__init__.py").write_text("")
    (root / "onnx" / "io.py").write_text("from winml_recipes.sdk import errors\n")
    modules = {
        "winml_recipes.sdk": root / "sdk" / "__init__.py",
        "winml_recipes.sdk.models": root / "sdk" / "models.py",
        "winml_recipes.onnx": root / "onnx" / "__init__.py",
        "winml_recipes.onnx.io": root / "onnx" / "io.py",
    }
    assert _upward_imports(modules) == [
        "winml_recipes.sdk.models (sdk core) -> winml_recipes.onnx (foundations)",
        "winml_recipes.sdk.models (sdk core) -> winml_recipes.onnx.io (foundations)",
    ]


def _documented_layers(text: str) -> list[tuple[str, tuple[str, ...]]]:
    """The layer table of docs/layers.md: each row's name and the modules it lists."""
    import re

    rows = re.findall(r"^\| (\d+) \| ([^|]+) \| ([^|]+) \|", text, re.MULTILINE)
    out = []
    for _, name, cell in rows:
        names = []
        for token in re.findall(r"`([^`]+)`", cell):
            token = token.removesuffix("/").removesuffix(".py").replace("/", ".")
            names.append("winml_recipes" if token == "winml_recipes" else f"winml_recipes.{token}")
        out.append((name.strip(), tuple(sorted(names))))
    return out


def test_the_layers_page_lists_the_layers() -> None:
    """docs/layers.md shows the layers this test enforces, in order, module for module."""
    page = (REPO / "docs" / "layers.md").read_text(encoding="utf-8")
    assert _documented_layers(page) == [(n, tuple(sorted(e))) for n, e in LAYERS]


# The services passes use of the package besides the SDK's core (model I/O, sample inputs,
# sessions on a target, memory estimates, the presets). Nothing in the package imports them
# but passes.
FACADES = {
    "winml_recipes.services.models",
    "winml_recipes.services.samples",
    "winml_recipes.services.runtime",
    "winml_recipes.services.memory",
    "winml_recipes.services.presets",
}
# The algorithms of our own passes (quantization, graph rewrites, exporters): what a
# third-party pass brings in its own package. Not engine services, so not in the SDK.
PASS_LIBRARIES = ("winml_recipes.quant", "winml_recipes.graph", "winml_recipes.exporters")


def test_the_sdk_imports_nothing_else_from_the_package() -> None:
    """Passes (ours and third parties') build on winml_recipes.sdk and the services: the
    SDK sits at the bottom of the import graph, so an engine change can never make a plugin
    import cycle, and only passes import the services."""
    modules = _modules()
    sdk = {name: path for name, path in modules.items() if name.startswith("winml_recipes.sdk")}
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
        if not name.startswith(("winml_recipes.passes", "winml_recipes.services"))
    }
    assert {n: m for n, m in users.items() if m} == {}


def _pass_imports(path: Path, modules: dict[str, Path]) -> list[str]:
    """What a pass module imports of the package that is neither the SDK, its services nor
    its own algorithm libraries."""
    allowed = (
        "winml_recipes.sdk",
        "winml_recipes.services",
        "winml_recipes.passes",
        *PASS_LIBRARIES,
    )
    return sorted(
        m
        for m in _imports(path, modules)
        if m.startswith("winml_recipes") and not m.startswith(allowed)
    )


def test_passes_import_only_the_sdk() -> None:
    """A pass reaches the engine, model I/O, sample inputs and sessions through the SDK
    (winml_recipes.sdk) and its services (winml_recipes.services), never the modules behind
    them, so writing a pass needs those alone and the modules can change under it."""
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
