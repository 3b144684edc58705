"""A model folder, a config or an output path chosen by an attacker: `init`, `validate` and
`build` refuse it with one line (exit 2) within seconds; the folder's code never runs, even
when a terminal answers `y` to any prompt; nothing is written into the step cache."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, cli, cli_subprocess, make_mlp_project
from tests.hubserver import local_hub, point_hf_at  # noqa: F401  (fixture)

# The folder's code writes this file when it runs; no test may ever see it.
PAYLOAD = """\
import pathlib
pathlib.Path({marker!r}).write_text("the model folder's code ran")
from transformers import PretrainedConfig

class EvilConfig(PretrainedConfig):
    model_type = "evilbert"
"""

AUTO_MAP_CONFIG = {
    "model_type": "evilbert",
    "architectures": ["EvilModel"],
    "auto_map": {"AutoConfig": "configuration_evil.EvilConfig"},
    "hidden_size": 8,
}

# An image classifier transformers ships, described by its config alone (init reads no weights).
CONVNEXT = {
    "model_type": "convnext",
    "architectures": ["ConvNextForImageClassification"],
    "hidden_sizes": [8, 16, 32, 64],
    "depths": [1, 1, 1, 1],
    "image_size": 64,
    "num_labels": 5,
}


def _refused(result, *words: str) -> None:
    """Exit 2 and at most three lines of stderr, no traceback, naming `words`."""
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    assert 1 <= len(lines) <= 3 and "Traceback" not in result.stderr, result.stderr
    for word in words:
        assert word in result.stderr, (word, result.stderr)


def _evil_folder(root: Path, marker: Path, *, code: bool = True, where: str = ".") -> Path:
    folder = root / "evil"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(AUTO_MAP_CONFIG))
    if code:
        (folder / where).mkdir(parents=True, exist_ok=True)
        (folder / where / "configuration_evil.py").write_text(PAYLOAD.format(marker=str(marker)))
    return folder


def _run_in_a_terminal(args: list[str], cwd: Path, deadline: float = 60.0) -> tuple[int, str]:
    """Run the CLI on a pseudo-terminal that answers `y` to anything it prints (an
    interactive prompt included); returns the exit code and everything it printed."""
    import pty
    import select
    import termios

    pid, fd = pty.fork()
    if pid == 0:  # the child: the CLI, with the terminal as stdin, stdout and stderr
        os.chdir(cwd)
        os.environ["PYTHONPATH"] = str(REPO)
        os.execv(sys.executable, [sys.executable, "-m", "winml_recipes", *args])
    attrs = termios.tcgetattr(fd)
    attrs[3] &= ~termios.ECHO  # the answers are not printed back (and answered again)
    termios.tcsetattr(fd, termios.TCSANOW, attrs)
    out = b""
    os.write(fd, b"y\n")
    end = time.monotonic() + deadline
    status = None
    while time.monotonic() < end:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the child closed the terminal
                chunk = b""
            if chunk:
                out += chunk
                os.write(fd, b"y\n")  # whatever it asked: yes
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail(f"no exit within {deadline:.0f} s; printed {out[-500:]!r}")
    os.close(fd)
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace")


@pytest.mark.skipif(sys.platform == "win32", reason="pseudo-terminals are POSIX (Linux CI)")
@pytest.mark.parametrize("code", [True, False], ids=["auto_map+py", "auto_map"])
def test_a_terminal_answering_yes_never_runs_the_folders_code(tmp_path, code) -> None:
    marker = tmp_path / "PWNED"
    _evil_folder(tmp_path, marker, code=code)
    started = time.monotonic()
    status, printed = _run_in_a_terminal(["init", "./evil"], tmp_path)
    # a terminal: the error wraps at 80 columns, its continuation lines indented
    lines = [ln for ln in printed.replace("\r", "").splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith(" ")]
    assert status == 2, printed
    assert len(lines) <= 3 and "Traceback" not in printed and "[y/N]" not in printed, printed
    assert ("Python code" if code else "auto_map") in printed
    assert not marker.exists()
    assert not (tmp_path / "catalog").exists()
    assert time.monotonic() - started < 60


def test_without_a_terminal_stdin_is_never_read(tmp_path) -> None:
    marker = tmp_path / "PWNED"
    _evil_folder(tmp_path, marker, code=False)
    result = cli_subprocess("init", "./evil", cwd=tmp_path, env={"PYTHONPATH": str(REPO)})
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "auto_map (AutoConfig)" in lines[0] and "Traceback" not in result.stderr
    assert not marker.exists()


@pytest.mark.parametrize("where", [".", "sub/deeper"])
def test_python_anywhere_in_the_folder_is_refused(tmp_path, monkeypatch, where) -> None:
    marker = tmp_path / "PWNED"
    folder = _evil_folder(tmp_path, marker, where=where)
    (folder / "config.json").write_text(json.dumps(CONVNEXT))  # no auto_map: only the file
    monkeypatch.chdir(tmp_path)
    _refused(cli("init", "./evil"), "holds Python code", "configuration_evil.py")
    assert not marker.exists() and not (tmp_path / "catalog").exists()


def test_a_catalog_source_with_code_is_refused_before_the_export(tmp_path, monkeypatch) -> None:
    """The build path: a catalog entry whose source is the folder (validate, build), and a
    random-weights `config:` naming classes of another Hub repo in `auto_map`."""
    marker = tmp_path / "PWNED"
    _evil_folder(tmp_path, marker)
    recipe = make_mlp_project(tmp_path / "p", steps="[export]")
    catalog = tmp_path / "p" / "catalog" / "mlp.yaml"
    text = catalog.read_text().replace("{ref: ./mlp.onnx}", "{ref: ../../evil}")
    catalog.write_text(text.replace("license: mit", "license: mit\nfamily: auto"))
    monkeypatch.chdir(tmp_path)
    _refused(cli("validate", recipe), "holds Python code")
    _refused(cli("build", recipe, "-o", tmp_path / "out"), "holds Python code")
    config = '{config: {model_type: bert, auto_map: {AutoModel: "evil/repo--m.EvilModel"}}}'
    catalog.write_text(text.replace("{ref: ../../evil}", config).replace(
        "license: mit", "license: mit\nfamily: auto"))  # fmt: skip
    _refused(cli("build", recipe, "-o", tmp_path / "out"), "auto_map (AutoModel)")
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_a_hub_repo_whose_config_names_code_is_refused(local_hub, tmp_path, monkeypatch):  # noqa: F811
    """`init org/model` and a catalog source `org/model`: the config.json fetched from the
    Hub is checked before transformers reads it."""
    local_hub.add_file("acme/evil", "config.json", json.dumps(AUTO_MAP_CONFIG).encode())
    local_hub.add_file("acme/evil", "configuration_evil.py", PAYLOAD.format(marker="x").encode())
    point_hf_at(local_hub, tmp_path / "hf", monkeypatch)
    monkeypatch.chdir(tmp_path)
    _refused(cli("init", "acme/evil"), "config.json: auto_map (AutoConfig)")
    recipe = make_mlp_project(tmp_path / "p", steps="[export]")
    catalog = tmp_path / "p" / "catalog" / "mlp.yaml"
    catalog.write_text(catalog.read_text().replace("{ref: ./mlp.onnx}", "{ref: acme/evil}")
                       .replace("license: mit", "license: mit\nfamily: auto"))  # fmt: skip
    _refused(cli("build", recipe, "-o", tmp_path / "out"), "auto_map (AutoConfig)")
    assert not (tmp_path / "out").exists() and not (tmp_path / "catalog").exists()


def _bomb(folder: Path, name: str, kind: str) -> None:
    path = folder / name
    if kind == "deep":
        path.write_text("[" * 200_000 + "]" * 200_000)
    elif kind == "huge":  # 300 MB of holes: reading it would cost 300 MB and minutes
        path.write_text("{")
        os.truncate(path, 300 << 20)
    elif kind == "fifo":  # opening it would block for ever
        path.unlink(missing_ok=True)
        os.mkfifo(path)
    elif kind == "array":
        path.write_text("[1, 2]")


@pytest.mark.skipif(sys.platform == "win32", reason="mkfifo and sparse files: Linux CI")
@pytest.mark.parametrize(
    ("name", "kind", "says"),
    [
        ("config.json", "deep", "nested more than 64"),
        ("config.json", "huge", "314,572,800 bytes"),
        ("config.json", "fifo", "not a regular file"),
        ("preprocessor_config.json", "huge", "314,572,800 bytes"),
        ("generation_config.json", "deep", "nested more than 64"),
        ("tokenizer_config.json", "array", "expected a JSON object"),
    ],
)
def test_json_bombs_in_a_model_folder(tmp_path, monkeypatch, name, kind, says) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(CONVNEXT))
    _bomb(folder, name, kind)
    monkeypatch.chdir(tmp_path)
    started = time.monotonic()
    _refused(cli("init", "./m"), name, says)
    assert time.monotonic() - started < 60
    assert not (tmp_path / "catalog").exists()


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"image_std": [0.5, 0.0, 0.5]}, "image_std[1] is 0.0"),
        ({"image_std": [float("nan")] * 3}, "image_std[0] is nan"),
        ({"image_std": [-0.2, 0.2, 0.2]}, "image_std[0] is -0.2"),
        ({"image_std": "0.5"}, "image_std is '0.5'"),
        ({"image_mean": {"r": 0.5}}, "image_mean is {'r': 0.5}"),
        ({"image_mean": [0.5, 0.5]}, "expected a list of 3 numbers"),
        ({"size": "abc"}, "size is 'abc'"),
        ({"size": -5}, "size is -5"),
        ({"size": {"height": 10**12, "width": 64}}, "size.height is 1000000000000"),
        ({"size": {"shortest_edge": True}}, "size.shortest_edge is True"),
        ({"crop_size": {"height": "64", "width": 64}}, "crop_size.height is '64'"),
    ],
)
def test_bad_preprocessor_values_name_the_file_and_field(tmp_path, monkeypatch, fields, says):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(CONVNEXT))
    good = {"size": {"shortest_edge": 64}, "image_mean": [0.5] * 3, "image_std": [0.5] * 3}
    (folder / "preprocessor_config.json").write_text(json.dumps({**good, **fields}))
    monkeypatch.chdir(tmp_path)
    _refused(cli("init", "./m"), "preprocessor_config.json", says)
    assert not (tmp_path / "catalog").exists()


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"num_channels": -3}, "num_channels is -3"),
        ({"num_channels": 0}, "num_channels is 0"),
        ({"image_size": "big"}, "'image_size' with value 'big'"),  # transformers' check
        ({"image_size": -64}, "image_size is -64"),
        ({"num_labels": 0, "id2label": {}}, "num_labels is 0"),
    ],
)
def test_config_numbers_that_make_no_model_are_refused(tmp_path, monkeypatch, fields, says):
    """`init` never writes an entry that `validate` would then reject."""
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**CONVNEXT, **fields}))
    monkeypatch.chdir(tmp_path)
    _refused(cli("init", "./m"), "config.json", says)
    assert not (tmp_path / "catalog").exists() and not (tmp_path / "recipes").exists()


def test_output_inside_the_cache_and_the_cache_inside_the_output(tmp_path, monkeypatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("WINML_RECIPES_CACHE", str(cache))
    recipe = make_mlp_project(tmp_path / "p", steps="[normalize]")
    assert cli("build", recipe, "-o", tmp_path / "out").exit_code == 0
    before = sorted(cache.rglob("*"))
    _refused(cli("build", recipe, "-o", cache / "out"), "inside the step cache")
    _refused(cli("build", recipe, "-o", cache), "inside the step cache")
    _refused(cli("matrix", recipe, "-o", tmp_path), "is inside the output folder")
    monkeypatch.chdir(tmp_path)  # `-o .`, relative
    _refused(cli("build", recipe, "-o", "."), "is inside the output folder")
    assert sorted(cache.rglob("*")) == before
    # --no-cache keeps the cache out of it: the same -o builds
    assert cli("build", recipe, "-o", ".", "--no-cache").exit_code == 0


def test_cache_verify_names_what_the_cache_did_not_make(tmp_path, monkeypatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("WINML_RECIPES_CACHE", str(cache))
    recipe = make_mlp_project(tmp_path / "p", steps="[normalize]")
    assert cli("build", recipe, "-o", tmp_path / "out").exit_code == 0
    entry = next(p for p in cache.glob("??/*") if p.is_dir())
    clean = cli("cache", "verify")
    assert clean.stdout.strip() == "1 entries intact, 0 damaged entries removed"
    assert clean.stderr == ""
    (cache / "mlp").mkdir()  # a build output written into the cache
    (cache / entry.parent.name / "notes.txt").write_text("x")
    (entry / "extra.onnx").write_bytes(b"not recorded")  # a file the entry never recorded
    result = cli("cache", "verify")
    assert result.exit_code == 0
    assert result.stdout.strip() == "0 entries intact, 1 damaged entries removed"
    assert "2 items in the cache folder were not made by the cache" in result.stderr
    assert "notes.txt" in result.stderr and str(cache / "mlp") in result.stderr
    assert (cache / "mlp").is_dir() and not entry.exists()  # someone's: left; damaged: gone
