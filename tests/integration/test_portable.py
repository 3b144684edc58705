"""Portable and installable: the CLI from a folder outside this repository (built-in catalog,
partials and schemas), `init` + the commands it prints, a wheel that carries its data, and
the build path with the POSIX-only modules unimportable (as on Windows)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.conftest import BUILTIN_NAMES, DATA, MLP_CATALOG, REPO, make_mlp_onnx

# Unimportable for everyone (Windows has neither), and for winml_recipes' own modules.
EVERYWHERE = ("fcntl", "termios")
OURS_ONLY = ("resource",)


def _outside(tmp_path: Path) -> Path:
    """An empty working folder that is not inside this repository."""
    folder = tmp_path / "work"
    folder.mkdir()
    assert REPO not in folder.resolve().parents
    return folder


def installed_cli(*args: str | Path, cwd: Path, env: dict | None = None):
    """The `winml-recipes` script installed beside this interpreter, run in `cwd`."""
    script = shutil.which("winml-recipes", path=str(Path(sys.executable).parent))
    assert script, "winml-recipes is not installed in this environment (make install)"
    return subprocess.run(
        [script, *map(str, args)],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
    )


def run_printed(line: str, cwd: Path):
    """Run a `next: winml-recipes ...` line exactly as printed."""
    assert line.startswith("next: winml-recipes "), line
    return installed_cli(*shlex.split(line[len("next: winml-recipes ") :]), cwd=cwd)


def test_catalog_list_outside_the_repo_shows_the_builtins(tmp_path) -> None:
    work = _outside(tmp_path)
    result = installed_cli("catalog", "list", cwd=work)
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line for line in result.stdout.splitlines()}
    assert set(rows) == set(BUILTIN_NAMES)
    assert rows["sam3-tiny"].endswith(" built-in")
    shown = installed_cli("catalog", "show", "sam3-tiny", "--json", cwd=work)
    assert json.loads(shown.stdout)["components"]["vision_encoder"]["source"]["seed"] == 0


def test_init_in_an_empty_folder_validates_and_builds_with_the_printed_commands(
    tmp_path,
) -> None:
    work = _outside(tmp_path)
    make_mlp_onnx(work / "mlp.onnx")
    result = installed_cli("init", "./mlp.onnx", cwd=work)
    assert result.returncode == 0, result.stderr
    printed = [line for line in result.stdout.splitlines() if line.startswith("next: ")]
    assert printed == [
        "next: winml-recipes validate recipes/mlp.yaml",
        "next: winml-recipes build recipes/mlp.yaml",
    ]
    # every `$schema` comment points at a file init wrote into the project
    for kind, folder in (("catalog", "catalog"), ("recipe", "recipes")):
        written = work / folder / "mlp.yaml"
        first = written.read_text().splitlines()[0]
        ref = first.split("$schema=")[1]
        assert ref == f"../schemas/{kind}.schema.json"
        schema = json.loads((written.parent / ref).read_text())
        assert schema["title"].startswith("winml-recipes")
    validated = run_printed(printed[0], work)
    assert validated.returncode == 0, validated.stderr
    assert validated.stdout.startswith("ok: recipes/mlp.yaml (cpu/fp32, npu/w8a16")
    built = run_printed(printed[1], work)
    assert built.returncode == 0, built.stderr
    model = work / "build" / "mlp" / "cpu-fp32" / "model" / "model.onnx"
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    assert np.allclose(_run(model, x), _mlp_reference(work / "mlp.onnx", x), atol=1e-5)


def test_a_project_entry_overrides_a_builtin_by_name_and_says_so(tmp_path) -> None:
    """A project's catalog/sam3-tiny.yaml is the one used (here: an MLP), with a note; the
    other built-ins stay available."""
    work = _outside(tmp_path)
    (work / "catalog").mkdir()
    make_mlp_onnx(work / "catalog" / "mlp.onnx")
    (work / "catalog" / "sam3-tiny.yaml").write_text(
        MLP_CATALOG.format(ref="./mlp.onnx").replace("name: mlp", "name: sam3-tiny")
    )
    (work / "recipes").mkdir()
    (work / "recipes" / "r.yaml").write_text(
        "schema_version: 1\nname: r\nmodel: sam3-tiny\ntargets: [{device: cpu, precision: fp32}]\n"
    )
    listed = installed_cli("catalog", "list", cwd=work)
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()}
    assert rows["sam3-tiny"].endswith("catalog/sam3-tiny.yaml (overrides the built-in)")
    assert rows["sam3"].endswith(" built-in")
    validated = installed_cli("validate", "recipes/r.yaml", cwd=work)
    assert validated.returncode == 0, validated.stderr
    assert validated.stderr == (
        "note: catalog entry 'sam3-tiny' from catalog/sam3-tiny.yaml overrides the built-in one\n"
    )
    plan = installed_cli("plan", "recipes/r.yaml", "--json", cwd=work)
    assert list(json.loads(plan.stdout)["components"]) == ["model"]


# --- a wheel carries its data ---------------------------------------------------------------


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel of this checkout, built from a copy (setuptools writes build/ and egg-info
    beside the sources)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(
        REPO / "winml_recipes", src / "winml_recipes", ignore=shutil.ignore_patterns("__pycache__")
    )
    out = tmp_path_factory.mktemp("wheel")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(src)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return next(out.glob("winml_recipes-*.whl"))


def test_the_wheel_carries_every_data_file(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = sorted(
        p.relative_to(REPO).as_posix()
        for p in DATA.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )
    assert len(shipped) >= 9  # 3 entries, 2 partials, 3 schemas, the module
    assert [n for n in shipped if n not in names] == []
    assert "winml_recipes/presets.yaml" in names


def test_an_installed_wheel_works_from_any_folder(wheel: Path, tmp_path) -> None:
    """Unpacked (a regular install) and as a zip on sys.path (zipimport: no paths at all)."""
    work = _outside(tmp_path)
    unpacked = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(unpacked)
    recipe = work / "recipes" / "r.yaml"
    recipe.parent.mkdir()
    recipe.write_text(
        "# yaml-language-server: $schema=../schemas/recipe.schema.json\n"
        "schema_version: 1\nname: r\nmodel: sam3-tiny\n"
        "targets: [{device: cpu, precision: fp32}]\n"
        "steps: [export, {verify: {% include 'verify-float.yaml' %}}]\n"
    )
    code = textwrap.dedent("""\
        import sys
        import winml_recipes
        from winml_recipes import api
        from winml_recipes.catalog import entry_names, load_entry
        print(winml_recipes.__file__)
        print(",".join(entry_names()))
        print(load_entry("sam3-tiny").path)
        r = api.load("recipes/r.yaml")
        print(r.components["vision_encoder"][1].options)
        """)
    for where in (unpacked, wheel):
        result = subprocess.run(
            [sys.executable, "-c", code],
            cwd=work,
            env={**os.environ, "PYTHONPATH": str(where)},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr
        module, names, entry, options = result.stdout.splitlines()
        assert Path(module).is_relative_to(where), module  # not this checkout
        assert names == ",".join(BUILTIN_NAMES)
        assert not Path(entry).is_relative_to(REPO)
        assert options == "{'min_sqnr_db': 60, 'min_cosine': 0.9999, 'samples': 2}"


# --- the build path without POSIX-only modules -------------------------------------------------

WITHOUT_POSIX_ONLY = """\
import sys


class NoPosixOnly:
    '''fcntl and termios are unimportable, as on Windows; resource is for this package's own
    modules (psutil's Linux backend needs it here; on Windows psutil has another backend).'''

    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        ours = _importer().startswith("winml_recipes")
        if top in {everywhere!r} or (top in {ours_only!r} and ours):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


def _importer():
    '''The module whose import statement is being run.'''
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
        frame = frame.f_back
    return frame.f_globals.get("__name__", "") if frame is not None else ""


for _name in {everywhere!r} + {ours_only!r}:
    sys.modules.pop(_name, None)
sys.meta_path.insert(0, NoPosixOnly())
try:
    import fcntl  # noqa: F401
except ImportError:
    pass
else:
    raise SystemExit("the blocker did not work")

import json
from pathlib import Path

from winml_recipes import api
from winml_recipes.cli import main

recipe, out = Path(sys.argv[1]), Path(sys.argv[2])
report = {{}}
for device, precision in (("cpu", "fp32"), ("cpu", "int8")):
    plan = api.plan(recipe, device=device, precision=precision)
    built = api.build(recipe, device=device, precision=precision, output_root=out)
    steps = built.manifest["components"]["model"]["steps"]
    report[precision] = {{
        "planned": [s.name for s in plan.components[0].steps],
        "status": {{s["pass"]: s["status"] for s in steps}},
        "model": str(built.models["model"]),
    }}
try:
    main(["validate", str(recipe)])
except SystemExit as exc:
    report["validate_exit"] = exc.code
report["loaded"] = sorted(m for m in {everywhere!r} if m in sys.modules)
print(json.dumps(report))
"""


def test_plan_validate_build_without_posix_only_modules(tmp_path) -> None:
    project = tmp_path / "p"
    (project / "catalog").mkdir(parents=True)
    (project / "recipes").mkdir()
    make_mlp_onnx(project / "catalog" / "mlp.onnx")
    (project / "catalog" / "mlp.yaml").write_text(MLP_CATALOG.format(ref="./mlp.onnx"))
    recipe = project / "recipes" / "mlp.yaml"
    recipe.write_text(
        "schema_version: 1\nname: mlp\nmodel: mlp\n"
        "targets: [{device: cpu, precision: fp32}, {device: cpu, precision: int8}]\n"
    )
    script = WITHOUT_POSIX_ONLY.format(everywhere=EVERYWHERE, ours_only=OURS_ONLY)
    result = subprocess.run(
        [sys.executable, "-c", script, str(recipe), str(tmp_path / "out")],
        cwd=tmp_path,
        env={**os.environ, "WINML_RECIPES_CACHE": str(tmp_path / "cache")},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["validate_exit"] == 0 and report["loaded"] == []
    assert report["int8"]["planned"] == ["export", "normalize", "quantize", "verify"]
    # a cache of its own: normalize runs once and the second target reads it back
    assert report["fp32"]["status"] == {"export": "skipped", "normalize": "ran", "verify": "ran"}
    assert report["int8"]["status"] == {
        "export": "skipped",  # an ONNX source
        "normalize": "cached",
        "quantize": "ran",
        "verify": "ran",
    }
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    want = _mlp_reference(project / "catalog" / "mlp.onnx", x)
    assert np.allclose(_run(Path(report["fp32"]["model"]), x), want, atol=1e-5)
    quantized = onnx.load(report["int8"]["model"])
    assert "QuantizeLinear" in {n.op_type for n in quantized.graph.node}
    got = _run(Path(report["int8"]["model"]), x)
    assert np.abs(got - want).max() < 0.1 * np.abs(want).max()


def _run(model: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def _mlp_reference(model: Path, x: np.ndarray) -> np.ndarray:
    """relu(x @ w1 + b1) @ w2 in numpy, from the source model's initializers."""
    w = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(str(model)).graph.initializer}
    return np.maximum(x @ w["w1"] + w["b1"], 0) @ w["w2"]
