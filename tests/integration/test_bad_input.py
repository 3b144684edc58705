"""Bad input through the CLI: one `error:` line, exit 2, nothing written. Interrupted and
concurrent builds leave the output and the cache whole. Good paths: -D, validate, plan."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import onnx
import pytest

from tests.conftest import BUILTIN_NAMES, MLP_CATALOG, RECIPES, cli, known_names, make_mlp_onnx
from winml_recipes.engine.cache import LOCKS, WORK
from winml_recipes.onnx.io import file_sha256
from winml_recipes.presets import precisions

PASSES, DEVICES, PRECISIONS = known_names()

HEAD = """\
# yaml-language-server: $schema=../schemas/recipe.schema.json
schema_version: 1
name: r
model: mlp
targets:
  - {device: cpu, precision: fp32}
  - {device: npu, precision: fp32}
"""


@dataclass
class Project:
    root: Path
    out: Path
    cache: Path

    @property
    def catalog(self) -> Path:
        return self.root / "catalog"

    def recipe(self, text: str, name: str = "r") -> Path:
        path = self.root / "recipes" / f"{name}.yaml"
        path.write_text(textwrap.dedent(text))
        return path

    def assert_nothing_written(self) -> None:
        assert not self.out.exists(), sorted(self.out.rglob("*"))
        assert not self.cache.exists() or not any(self.cache.rglob("*"))


@pytest.fixture
def proj(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Project:
    """tmp/catalog (mlp.yaml around a tiny onnx.helper MLP, beside the built-in entries),
    tmp/recipes, an output root and a cache of its own."""
    (tmp_path / "catalog").mkdir()
    make_mlp_onnx(tmp_path / "catalog" / "mlp.onnx")
    (tmp_path / "catalog" / "mlp.yaml").write_text(MLP_CATALOG.format(ref="./mlp.onnx"))
    (tmp_path / "recipes" / "_partials").mkdir(parents=True)
    p = Project(tmp_path, tmp_path / "out", tmp_path / "cache")
    monkeypatch.setenv("WINML_RECIPES_CACHE", str(p.cache))
    return p


def user_error(*args: str | Path) -> str:
    """Run the CLI; assert exit 2 and exactly one stderr line; return it without `error: `."""
    result = cli(*args)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0][len("error: ") :]


def build_error(p: Project, recipe: Path, *args: str) -> str:
    """The error of `build` (also what `plan` and `validate` say); nothing may be written."""
    message = user_error("build", recipe, "-o", p.out, *args)
    assert user_error("plan", recipe, *args) == message
    assert user_error("validate", recipe, *args) == message
    p.assert_nothing_written()
    return message


# --- bad recipes: FILE:LINE: path: message ----------------------------------------------------

BAD_RECIPES = [
    pytest.param(
        HEAD + "steps: [normalize, verify\ndims: {batch: 1}\n",
        r"{path}:9: invalid YAML: .+",
        id="malformed-yaml",
    ),
    pytest.param(
        HEAD + "steps:\n{% for s in steps %}\n  - {{ s }}\n",
        r"{path}:\d+: template syntax error: Unexpected end of template\..+",
        id="jinja-syntax",
    ),
    pytest.param(
        HEAD + "seed: {{ sead }}\n",
        r"{path}:8: undefined variable: 'sead' is undefined; known: catalog, device, "
        r"precision \(add more with -D key=value\)",
        id="undefined-variable",
    ),
    pytest.param(
        HEAD + "description: \"{{ ''.__class__.__mro__ }}\"\n",
        r"{path}:8: not allowed in a recipe: access to attribute '__class__' of 'str' "
        r"object is unsafe\.",
        id="sandbox-mro",
    ),
    pytest.param(
        HEAD + 'description: "{{ cycler.__init__.__globals__ }}"\n',
        r"{path}:8: not allowed in a recipe: access to attribute '__init__' of 'type' "
        r"object is unsafe\.",
        id="sandbox-globals",
    ),
    pytest.param(
        HEAD + "description: \"{{ 'x' * 10**10 }}\"\n",
        r"{path}:8: not allowed in a recipe: repeating a sequence 10000000000 times is too "
        r"large for a recipe",
        id="sandbox-memory",
    ),
    pytest.param(
        HEAD + "seed: one\n",
        r"{path}:8: \$\.seed: 'one' is not of type 'integer'",
        id="wrong-type",
    ),
    pytest.param(
        HEAD.replace("targets:", "tagets:"),
        r"{path}:5: \$: unknown key 'tagets' \(did you mean 'targets'\?\)",
        id="unknown-key",
    ),
    pytest.param(
        HEAD + "components:\n  model:\n    dimz: {batch: 1}\n",
        r"{path}:10: \$\.components\.model: unknown key 'dimz' \(did you mean 'dims'\?\)",
        id="unknown-nested-key",
    ),
    pytest.param(
        HEAD + "steps: [normalize]\nsteps: [verify]\n",
        r"{path}:9: \$: duplicate key 'steps' \(first at line 8\)",
        id="duplicate-key",
    ),
    pytest.param(
        HEAD + "steps:\n  - normalize\n  - verfy\n",
        r"{path}:10: \$\.steps\[1\]: unknown value 'verfy' \(did you mean 'verify'\?\); "
        r"expected one of: " + re.escape(PASSES),
        id="unknown-pass",
    ),
    pytest.param(
        HEAD + "steps:\n  - normalize: {bakend: ort}\n",
        r"{path}:9: \$\.steps\[0\]\.normalize: unknown key 'bakend' \(did you mean "
        r"'backend'\?\)",
        id="unknown-pass-option",
    ),
    pytest.param(
        HEAD.replace("device: npu", "device: tpu"),
        r"{path}:7: \$\.targets\[1\]\.device: unknown value 'tpu' \(did you mean 'npu'\?\); "
        r"expected one of: " + re.escape(DEVICES),
        id="unknown-device-in-targets",
    ),
    pytest.param(
        HEAD.replace("model: mlp", "model: mpl"),
        r"{path}:4: \$\.model: unknown catalog entry 'mpl' \(did you mean 'mlp'\?\); "
        r"entries in {catalog}: mlp; built-in: " + re.escape(", ".join(BUILTIN_NAMES)),
        id="unknown-catalog-entry",
    ),
    pytest.param(
        HEAD + "components:\n  modle:\n    steps: [normalize]\n",
        r"{path}:9: \$\.components: unknown component 'modle' \(did you mean 'model'\?\); "
        r"catalog 'mlp' has: model",
        id="unknown-component",
    ),
    pytest.param(
        HEAD + "{% include '../../catalog/mlp.yaml' %}\n",
        r"{path}:8: include '\.\./\.\./catalog/mlp\.yaml' leaves the partials directory "
        r"\('\.\.'\); includes are file names inside {partials}",
        id="include-outside-partials",
    ),
]


@pytest.mark.parametrize(("text", "pattern"), BAD_RECIPES)
def test_bad_recipe(proj: Project, text: str, pattern: str) -> None:
    path = proj.recipe(text)
    message = build_error(proj, path)
    expected = pattern.format(
        path=re.escape(str(path)),
        catalog=re.escape(str(proj.catalog)),
        partials=re.escape(str(proj.root / "recipes" / "_partials")),
    )
    assert re.fullmatch(expected, message), message


def test_unknown_key_has_the_required_shape(proj: Project) -> None:
    path = proj.recipe(HEAD.replace("targets:", "tagets:"))
    assert build_error(proj, path) == f"{path}:5: $: unknown key 'tagets' (did you mean 'targets'?)"


def test_unknown_device_argument(proj: Project) -> None:
    path = proj.recipe(HEAD)
    assert build_error(proj, path, "--device", "tpu") == (
        f"unknown device 'tpu' (did you mean 'npu'?); known: {DEVICES}"
    )


def test_unknown_precision_argument(proj: Project) -> None:
    path = proj.recipe(HEAD)
    assert build_error(proj, path, "--precision", "zzz") == (
        f"unknown precision 'zzz'; known: {PRECISIONS}"
    )


def test_precision_not_declared(proj: Project) -> None:
    path = proj.recipe(HEAD)
    other = next(p for p in precisions() if p != "fp32")
    assert build_error(proj, path, "--precision", other) == (
        f"{path}:6: $.targets: */{other} is not a target of this recipe "
        "(declared: cpu/fp32, npu/fp32); add it to targets"
    )


def test_target_not_declared(proj: Project) -> None:
    path = proj.recipe(HEAD.replace("  - {device: npu, precision: fp32}\n", ""))
    assert build_error(proj, path, "--device", "gpu", "--precision", "fp32") == (
        f"{path}:6: $.targets: gpu/fp32 is not a target of this recipe (declared: cpu/fp32); "
        "add it to targets"
    )


def test_reserved_define(proj: Project) -> None:
    path = proj.recipe(HEAD)
    assert build_error(proj, path, "-D", "device=npu") == (
        "-D 'device=npu': 'device' is set by the tool; use --device"
    )


def test_unused_define(proj: Project) -> None:
    path = proj.recipe(HEAD + "steps:\n  - verify: {samples: {{ samples }}}\n")
    assert build_error(proj, path, "-D", "samples=2", "-D", "smples=3") == (
        f"{path}: -D smples: the recipe does not use 'smples' (did you mean 'samples'?); "
        "variables it reads: samples"
    )


def test_missing_recipe(proj: Project) -> None:
    path = proj.root / "recipes" / "nope.yaml"
    assert build_error(proj, path) == f"{path}: recipe not found"
    assert user_error("build") == "missing RECIPE (e.g. recipes/sam3-tiny.yaml) or --onnx FILE"


# --- bad sources --------------------------------------------------------------------------------


def _point_catalog_at(proj: Project, ref: str) -> Path:
    entry = proj.catalog / "mlp.yaml"
    entry.write_text(MLP_CATALOG.format(ref=ref))
    return entry


def test_missing_source_file(proj: Project) -> None:
    entry = _point_catalog_at(proj, "./missing.onnx")
    message = build_error(proj, proj.recipe(HEAD))
    # where: the catalog file (and its line once the engine reports one), then the source path
    assert re.fullmatch(
        rf"{re.escape(str(entry))}(:7)?: \$?\.?components\.model\.source(\.ref)?: "
        rf"source file not found: {re.escape(str(proj.catalog / 'missing.onnx'))}",
        message,
    ), message


def test_missing_source_relative_path_without_dot(proj: Project) -> None:
    _point_catalog_at(proj, "models/missing.onnx")
    message = build_error(proj, proj.recipe(HEAD))
    assert message.endswith(
        f"'models/missing.onnx' is not a file (relative to {proj.catalog}) and not a Hub ONNX "
        "file (org/repo/path.onnx); for a local path start it with ./"
    ), message


def _truncated(proj: Project) -> Path:
    path = proj.catalog / "truncated.onnx"
    path.write_bytes((proj.catalog / "mlp.onnx").read_bytes()[:100])
    return path


def _text(proj: Project) -> Path:
    path = proj.catalog / "notes.onnx"
    path.write_text("this is a text file, not an ONNX model\n")
    return path


def _empty(proj: Project) -> Path:
    path = proj.catalog / "empty.onnx"
    path.write_bytes(b"")
    return path


UNREADABLE = r"not a readable ONNX model \(.+\); is the file complete\?"
EMPTY = r"not an ONNX model \(empty graph\); is the file truncated or of another format\?"


@pytest.mark.parametrize(
    ("make", "pattern"),
    [(_truncated, UNREADABLE), (_text, UNREADABLE), (_empty, EMPTY)],
    ids=["truncated", "text", "empty"],
)
def test_unreadable_source(proj: Project, make: Callable, pattern: str) -> None:
    bad = make(proj)
    _point_catalog_at(proj, f"./{bad.name}")
    message = build_error(proj, proj.recipe(HEAD))
    assert re.fullmatch(rf"{re.escape(str(bad))}: {pattern}", message), message
    # `inspect` says the same about the file
    assert re.fullmatch(rf"{re.escape(str(bad))}: {pattern}", user_error("inspect", bad))


def test_inspect_missing_and_directory(proj: Project) -> None:
    missing = proj.root / "missing.onnx"
    assert user_error("inspect", missing) == f"{missing}: file not found; check the path"
    assert user_error("inspect", proj.catalog) == (
        f"{proj.catalog}: is a directory, expected an .onnx file"
    )


def test_inspect_good_model(proj: Project) -> None:
    result = cli("inspect", proj.catalog / "mlp.onnx", "--json")
    assert result.exit_code == 0, result.stderr
    digest = json.loads(result.stdout)
    assert "MatMul" in json.dumps(digest)


# --- good paths ---------------------------------------------------------------------------------


def test_validate_reports_each_file(proj: Project) -> None:
    good = proj.recipe(HEAD, name="good")
    cpu_only = proj.recipe(HEAD.replace("  - {device: npu, precision: fp32}\n", ""), name="cpu")
    bad1 = proj.recipe(HEAD + "stepz: []\n", name="bad1")
    bad2 = proj.recipe(HEAD + "seed: {{ x }}\n", name="bad2")
    result = cli("validate", good, bad1, cpu_only, bad2)
    assert result.exit_code == 2
    assert result.stdout.splitlines() == [
        f"ok: {good} (cpu/fp32, npu/fp32)",
        f"ok: {cpu_only} (cpu/fp32)",
    ]
    assert result.stderr.splitlines() == [
        f"error: {bad1}:8: $: unknown key 'stepz' (did you mean 'steps'?)",
        f"error: {bad2}:8: undefined variable: 'x' is undefined; known: catalog, device, "
        "precision (add more with -D key=value)",
    ]
    ok = cli("validate", good, cpu_only)
    assert ok.exit_code == 0 and ok.stderr == ""
    proj.assert_nothing_written()


def test_validate_repo_recipes() -> None:
    result = cli("validate", *sorted(RECIPES.glob("*.yaml")))
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert [line.split(" (")[0] for line in lines] == [
        f"ok: {p}" for p in sorted(RECIPES.glob("*.yaml"))
    ]
    tiny = next(line for line in lines if "sam3-tiny.yaml" in line)
    assert tiny.startswith(f"ok: {RECIPES / 'sam3-tiny.yaml'} (cpu/fp32, ")


def test_plan_json(proj: Project) -> None:
    path = proj.recipe(HEAD + "steps: [export, normalize, fix_shapes, {verify: {samples: 3}}]\n")
    result = cli("plan", path, "--json", "--device", "npu")
    assert result.exit_code == 0, result.stderr
    model = proj.catalog / "mlp.onnx"
    plan = json.loads(result.stdout)
    assert plan["recipe"] == "r"
    assert plan["target"] == {"device": "npu", "precision": "fp32"}
    assert list(plan["components"]) == ["model"]
    comp = plan["components"]["model"]
    assert comp["source"] == {"kind": "onnx", "ref": str(model), "sha256": file_sha256(model)}
    assert comp["steps"] == [
        {"pass": "export", "options": {}, "skip": "source is already ONNX"},
        {"pass": "normalize", "options": {"backend": "ort", "force": False}},
        {"pass": "fix_shapes", "options": {}},
        {
            "pass": "verify",
            "options": {
                "min_sqnr_db": 30.0,
                "min_cosine": 0.99,
                "samples": 3,
                "seed": 0,
                "skip": 0,
                "samples_per_upstream": 1,
                "zero_shot_min_top1": 0.8,
                "allow_cpu_fallback": False,
                "allow_calibration_overlap": False,
                "on_target": True,
                "require_ep": False,
                "compare_simulation": True,
                "locate_divergence": True,
                "task_decides": False,
            },
        },
    ]
    proj.assert_nothing_written()


def test_plan_text(proj: Project) -> None:
    result = cli("plan", proj.recipe(HEAD))
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "r -> cpu/fp32"
    assert lines[1] == f"  model  (source: {proj.catalog / 'mlp.onnx'})"
    assert lines[2] == "    1. export  [skip: source is already ONNX]"
    assert [line.split(".")[1].split()[0] for line in lines[2:]] == [
        "export",
        "normalize",
        "verify",
    ]


def test_defines_reach_the_build(proj: Project) -> None:
    path = proj.recipe(
        HEAD + "seed: {{ seed }}\nsteps:\n  - normalize\n  - verify: {samples: {{ n }}}\n"
    )
    result = cli("build", path, "-o", proj.out, "-D", "n=3", "-D", "seed=5", "--json")
    assert result.exit_code == 0, result.stderr
    manifest = json.loads(result.stdout)
    assert manifest["recipe"]["variables"] == {
        "n": 3,
        "seed": 5,
        "device": "cpu",
        "precision": "fp32",
    }
    _, verify = manifest["components"]["model"]["steps"]
    assert verify["status"] == "ran"
    assert verify["metrics"]["samples"] == 3
    assert "seed: 5\n" in manifest["recipe"]["rendered"]


def test_all_targets_builds_each_declared_target(proj: Project) -> None:
    path = proj.recipe(HEAD)  # no steps: the presets per target
    result = cli("build", path, "-o", proj.out, "--all-targets")
    assert result.exit_code == 0, result.stderr
    built = [line for line in result.stdout.splitlines() if line.startswith("built ")]
    assert [line.split(" -> ")[1] for line in built] == [
        str(proj.out / "r" / "cpu-fp32"),
        str(proj.out / "r" / "npu-fp32"),
    ]
    for target, passes, batch in (
        ("cpu-fp32", ["export", "normalize", "verify"], "batch"),
        ("npu-fp32", ["export", "normalize", "fix_shapes", "prepare", "verify"], 2),
    ):
        out = proj.out / "r" / target
        manifest = json.loads((out / "manifest.json").read_text())
        assert f"{manifest['target']['device']}-{manifest['target']['precision']}" == target
        steps = manifest["components"]["model"]["steps"]
        assert [s["pass"] for s in steps] == passes
        assert steps[0]["status"] == "skipped"
        # An MLP has nothing for prepare to fold or rewrite: it says so and hands the model on.
        by_pass = {s["pass"]: s for s in steps}
        if "prepare" in by_pass:
            assert by_pass["prepare"]["reason"] == "nothing to fold or rewrite"
        assert all(s["status"] in ("ran", "cached") for s in steps[1:] if s["pass"] != "prepare")
        model = onnx.load(str(out / "model" / "model.onnx"))
        dim = model.graph.input[0].type.tensor_type.shape.dim[0]
        assert (dim.dim_value or dim.dim_param) == batch
    assert sorted(p.name for p in (proj.out / "r").iterdir()) == ["cpu-fp32", "npu-fp32"]


def test_all_targets_with_device_is_refused(proj: Project) -> None:
    path = proj.recipe(HEAD)
    assert user_error("build", path, "-o", proj.out, "--all-targets", "--device", "npu") == (
        "--all-targets cannot be combined with --device/--precision/--ep"
    )
    proj.assert_nothing_written()


# --- interrupted and concurrent builds ------------------------------------------------------------

# A pass registered only inside the build subprocesses: it signals that it runs (the marker
# file) and then waits for the test to create the release file, so the test interrupts it
# at a known point instead of racing a timer.
SLOW_CLI = """\
import os
import shutil
import sys
import time
from pathlib import Path

from winml_recipes.sdk.passes import Pass, model_file, register
from winml_recipes.sdk.types import StepResult


@register
class SlowPass(Pass):
    name = "slow"
    summary = "test pass: waits for a release file"
    target_dependent = False
    options_schema = {
        "type": "object",
        "additionalProperties": False,
        "properties": {"tag": {"type": "string"}},
    }

    def run(self, src, out_dir, options, ctx):
        Path(os.environ["SLOW_MARKER"]).write_text(str(os.getpid()))
        release = Path(os.environ["SLOW_RELEASE"])
        deadline = time.monotonic() + 60
        while not release.exists():
            if time.monotonic() > deadline:
                raise RuntimeError("never released")
            time.sleep(0.02)
        out = model_file(out_dir)
        shutil.copyfile(src, out)
        return StepResult(out, {"tag": options.get("tag", "")})


if __name__ == "__main__":
    from winml_recipes.cli import main

    main()
"""

SLOW_RECIPE = """\
schema_version: 1
name: slow
model: mlp
targets:
  - {device: cpu, precision: fp32}
steps:
  - normalize
  - slow: {tag: "{{ tag }}"}
  - verify
"""


class SlowBuilds:
    def __init__(self, proj: Project) -> None:
        self.proj = proj
        self.script = proj.root / "slow_cli.py"
        self.script.write_text(SLOW_CLI)
        self.recipe = proj.recipe(SLOW_RECIPE, name="slow")
        self.release = proj.root / "release"
        self.target = proj.out / "slow" / "cpu-fp32"

    def _cmd(self, tag: str, *args: str) -> list[str]:
        return [
            sys.executable,
            str(self.script),
            "build",
            str(self.recipe),
            "-o",
            str(self.proj.out),
            "-D",
            f"tag={tag}",
            *args,
        ]

    def _env(self, marker: Path) -> dict[str, str]:
        return {
            **os.environ,
            "WINML_RECIPES_CACHE": str(self.proj.cache),
            "SLOW_MARKER": str(marker),
            "SLOW_RELEASE": str(self.release),
        }

    def start(self, tag: str, name: str, *args: str) -> tuple[subprocess.Popen, Path, Path]:
        """Start a build; returns the process, its step marker and its stderr file."""
        marker = self.proj.root / f"marker-{name}"
        err = self.proj.root / f"stderr-{name}"
        with err.open("w") as stderr:
            proc = subprocess.Popen(
                self._cmd(tag, *args),
                cwd=self.proj.root,
                env=self._env(marker),
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        return proc, marker, err

    def run(self, tag: str, name: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            self._cmd(tag, *args),
            cwd=self.proj.root,
            env=self._env(self.proj.root / f"marker-{name}"),
            capture_output=True,
            text=True,
            timeout=120,
        )

    def leftovers(self) -> list[str]:
        return sorted(p.name for p in self.target.parent.glob(".*") if not p.name.endswith(".lock"))


def wait_for(condition: Callable[[], bool], *procs: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        for proc in procs:
            assert proc.poll() is None, f"build exited early with {proc.returncode}"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def snapshot(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def cache_entries(cache: Path) -> dict[str, dict]:
    """Every cache entry, checked whole: a 64-hex key, its result and a loadable model."""
    assert not list(cache.rglob(".tmp-*")), "half-written cache entry left behind"
    entries = {}
    for shard in cache.iterdir():
        if shard.name == LOCKS:  # a lock file per key computed (no content)
            continue
        if shard.name == WORK:  # steps' scratch folders (not entries)
            continue
        for entry in shard.iterdir():
            assert re.fullmatch(r"[0-9a-f]{64}", entry.name) and entry.name[:2] == shard.name
            result = json.loads((entry / "result.json").read_text())
            if (entry / "model.onnx").exists():
                onnx.checker.check_model(str(entry / "model.onnx"))
                assert file_sha256(entry / "model.onnx") == result["output_sha256"]
            entries[entry.name] = result
    return entries


@pytest.fixture
def slow(proj: Project) -> SlowBuilds:
    return SlowBuilds(proj)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
def test_interrupted_build_leaves_output_and_cache_whole(slow: SlowBuilds, sig) -> None:
    slow.release.touch()
    first = slow.run("v1", "first")
    assert first.returncode == 0, first.stderr
    before = snapshot(slow.target)
    assert json.loads(before["manifest.json"])["components"]["model"]["steps"][1]["metrics"] == {
        "tag": "v1"
    }
    cached_before = cache_entries(slow.proj.cache)

    slow.release.unlink()
    proc, marker, err = slow.start("v2", "interrupted")
    try:
        wait_for(marker.exists, proc)
        # the step runs in a scratch folder in the store, named after the building process
        assert [p.name.split("-")[0] for p in (slow.proj.cache / WORK).glob("*/")] == [
            str(proc.pid)
        ]
        proc.send_signal(sig)
        proc.wait(timeout=60)
    finally:
        proc.kill()
    if sig == signal.SIGINT:
        assert proc.returncode == 130
        assert err.read_text().splitlines()[-1] == (
            "error: interrupted; the previous output and the cache are intact"
        )
        assert slow.leftovers() == []  # cleaned up on the way out
    else:
        assert proc.returncode == -signal.SIGKILL
    assert snapshot(slow.target) == before  # the previous output is untouched
    assert cache_entries(slow.proj.cache) == cached_before  # nothing half-stored

    slow.release.touch()
    again = slow.run("v2", "again")
    assert again.returncode == 0, again.stderr
    assert slow.leftovers() == []  # a killed build's staging is swept
    manifest = json.loads((slow.target / "manifest.json").read_text())
    steps = manifest["components"]["model"]["steps"]
    assert [(s["pass"], s["status"]) for s in steps] == [
        ("normalize", "cached"),
        ("slow", "ran"),
        ("verify", "cached"),  # same model as v1 (the slow step copies it): same key
    ]
    assert steps[1]["metrics"] == {"tag": "v2"}
    model = slow.target / "model" / "model.onnx"
    onnx.checker.check_model(str(model))
    assert file_sha256(model) == manifest["components"]["model"]["artifact"]["sha256"]
    assert sorted(p.name for p in slow.target.iterdir()) == [
        "float-reference", "manifest.json", "model", "report.html"
    ]  # fmt: skip
    assert len(cache_entries(slow.proj.cache)) == len(cached_before) + 1  # slow v2
    assert list((slow.proj.cache / WORK).glob("*/")) == []  # a killed step's scratch swept


def test_concurrent_builds_take_turns(slow: SlowBuilds) -> None:
    first, first_marker, _ = slow.start("v1", "first")
    waiter = None
    try:
        wait_for(first_marker.exists, first)

        # --wait 0: stops at once with a clear message, writes nothing
        refused = slow.run("v1", "refused", "--wait", "0")
        assert refused.returncode == 2
        assert re.fullmatch(
            rf"error: {re.escape(str(slow.proj.out / 'slow'))}(/cpu-fp32)?: another build "
            rf"\(pid {first.pid}\) is writing this output; wait for it to finish or raise --wait\n",
            refused.stderr,
        ), refused.stderr
        assert not slow.target.exists()

        # default: waits for the lock, says so, and starts no step meanwhile
        waiter, waiter_marker, waiter_err = slow.start("v1", "waiter")
        wait_for(lambda: "waiting for another build" in waiter_err.read_text(), waiter, first)
        assert f"(pid {first.pid})" in waiter_err.read_text()
        assert not waiter_marker.exists()
        assert waiter.poll() is None

        slow.release.touch()
        assert first.wait(timeout=60) == 0
        assert waiter.wait(timeout=60) == 0
    finally:
        first.kill()
        if waiter is not None:
            waiter.kill()
    # the waiter ran after the first build finished: it found every step in the cache
    manifest = json.loads((slow.target / "manifest.json").read_text())
    statuses = [s["status"] for s in manifest["components"]["model"]["steps"]]
    assert statuses == ["cached", "cached", "cached"]
    assert not waiter_marker.exists()
    assert slow.leftovers() == []
    onnx.checker.check_model(str(slow.target / "model" / "model.onnx"))
    assert len(cache_entries(slow.proj.cache)) == 3
