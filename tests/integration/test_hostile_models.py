"""Hostile ONNX files: external data must never make the tool read or ship a file from
outside the model's folder, and a pipe given as a model must not hang it.

The sentinel outside the project is a FIFO: opening it for reading blocks until a writer
comes, so a tool that so much as opens it hangs, and the test's timeout fails it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import REPO

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX FIFOs")

TIMEOUT_S = 60


def run(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "winml_recipes", *map(str, args)],
        cwd=cwd or REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def model_with_external(folder: Path, location: str, length: int = 4096) -> Path:
    """A MatMul whose weight (32 x 32 float32 = 4096 bytes) lives in `location`."""
    folder.mkdir(parents=True, exist_ok=True)
    w = numpy_helper.from_array(np.ones((32, 32), np.float32), "w")
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", str(length))):
        w.external_data.add(key=key, value=value)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    path = folder / "m.onnx"
    path.write_bytes(model.SerializeToString())
    return path


@pytest.fixture
def sentinel(tmp_path: Path) -> Path:
    fifo = tmp_path / "outside" / "secret"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    return fifo


def one_error_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


@pytest.mark.parametrize("command", ["inspect", "build", "dequantize"])
def test_symlinked_sidecar_pointing_outside_is_refused_unread(tmp_path, sentinel, command):
    project = tmp_path / "project"
    model = model_with_external(project, "m.onnx_data")
    (project / "m.onnx_data").symlink_to(sentinel)
    out = tmp_path / "out"
    args = {
        "inspect": ("inspect", model, "--json"),
        "build": ("build", "--onnx", model, "--device", "cpu", "--precision", "fp32", "-o", out),
        "dequantize": ("dequantize", model, "-o", tmp_path / "d.onnx"),
    }[command]
    line = one_error_line(run(*args))
    assert line == (
        f"error: {model}: tensor 'w': external data 'm.onnx_data' is outside the model's "
        "folder; keep the weights beside the model"
    )
    assert not out.exists() and not (tmp_path / "d.onnx").exists()


@pytest.mark.parametrize("location", ["../outside/secret", "sub/../../outside/secret"])
def test_relative_escape_is_refused(tmp_path, sentinel, location):
    model = model_with_external(tmp_path / "project", location)
    line = one_error_line(run("inspect", model))
    assert "is outside the model's folder" in line


def test_absolute_location_is_refused(tmp_path, sentinel):
    model = model_with_external(tmp_path / "project", str(sentinel))
    line = one_error_line(run("inspect", model))
    assert "must be a file name relative to the model's folder" in line


def test_sidecar_shorter_than_its_tensors(tmp_path):
    model = model_with_external(tmp_path / "project", "m.onnx_data")
    (tmp_path / "project" / "m.onnx_data").write_bytes(b"\0" * 100)
    line = one_error_line(run("inspect", model))
    assert line == (
        f"error: {model}: external data 'm.onnx_data' holds 100 bytes, the model needs 4096; "
        "is the file complete?"
    )


def test_sidecar_that_is_a_pipe_inside_the_folder(tmp_path):
    model = model_with_external(tmp_path / "project", "m.onnx_data")
    os.mkfifo(tmp_path / "project" / "m.onnx_data")
    line = one_error_line(run("inspect", model))
    assert "external data 'm.onnx_data' is not a regular file" in line


def test_a_pipe_given_as_the_model(tmp_path):
    fifo = tmp_path / "model.onnx"
    os.mkfifo(fifo)
    for args in (("inspect", fifo), ("dequantize", fifo, "--check")):
        line = one_error_line(run(*args))
        assert line == f"error: {fifo}: not a regular file (a pipe, device or socket)"


def test_sidecar_inside_the_folder_still_works(tmp_path):
    """The same model with a real sidecar beside it builds and ships its weights."""
    project = tmp_path / "project"
    model = model_with_external(project, "m.onnx_data")
    (project / "m.onnx_data").write_bytes(np.ones((32, 32), np.float32).tobytes())
    done = run("build", "--onnx", model, "--device", "cpu", "--precision", "fp32", "-o", tmp_path)
    assert done.returncode == 0, done.stderr
    loaded = onnx.load(str(tmp_path / "m" / "cpu-fp32" / "model" / "model.onnx"))
    assert loaded.graph.initializer[0].name == "w"


# --------------------------------------------------------------------------- recipe files


def _project_with_partial(tmp_path: Path, include_in: str) -> Path:
    from tests.conftest import make_mlp_project

    recipe = make_mlp_project(tmp_path / "p")
    (recipe.parent / "_partials").mkdir()
    text = recipe.read_text().replace(
        "name: mlp\n", f"name: mlp\n{include_in}: {{% include 'evil.yaml' %}}\n", 1
    )
    recipe.write_text(text)
    return recipe


@pytest.mark.parametrize("field", ["description", "seed"])
def test_partial_linking_out_of_the_partials_is_never_read(tmp_path, sentinel, field):
    recipe = _project_with_partial(tmp_path, field)
    (recipe.parent / "_partials" / "evil.yaml").symlink_to(sentinel)
    for args in (("validate", recipe), ("build", recipe, "-o", tmp_path / "out")):
        line = one_error_line(run(*args))
        assert line.startswith(f"error: {recipe}:")
        assert "include 'evil.yaml' is a link that leaves the partials directory" in line
    assert not (tmp_path / "out").exists()


def test_partial_linking_to_a_readable_file_outside_is_not_shipped(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-CONTENT\n")
    recipe = _project_with_partial(tmp_path, "description")
    (recipe.parent / "_partials" / "evil.yaml").symlink_to(secret)
    done = run("build", recipe, "-o", tmp_path / "out")
    assert "TOP-SECRET-CONTENT" not in done.stdout + done.stderr
    one_error_line(done)
    assert not (tmp_path / "out").exists()


def test_catalog_entry_linking_out_of_the_catalog(tmp_path, sentinel):
    from tests.conftest import make_mlp_project

    recipe = make_mlp_project(tmp_path / "p")
    catalog = tmp_path / "p" / "catalog"
    (catalog / "mlp.yaml").unlink()
    (catalog / "mlp.yaml").symlink_to(sentinel)
    line = one_error_line(run("validate", recipe))
    assert line == (
        f"error: {catalog / 'mlp.yaml'}: is a link that leaves the catalog directory; "
        "catalog entries are files in it"
    )


# --------------------------------------------------------------------------- invalid graphs


def _graph_model(path: Path, nodes, inits=(), outputs=("y",)) -> Path:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, [1, 4]) for o in outputs],
        list(inits),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    path.write_bytes(model.SerializeToString())
    return path


def _raw(name: str, dims: list[int], size: int) -> onnx.TensorProto:
    """A float initializer declaring `dims` and holding `size` bytes (helper refuses it)."""
    tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=dims)
    tensor.raw_data = b"\0" * size
    return tensor


def _relu(i: str, o: str, name: str) -> onnx.NodeProto:
    return helper.make_node("Relu", [i], [o], name=name)


INVALID = {
    "cycle": (
        [helper.make_node("Add", ["x", "b"], ["a"], name="n1"), _relu("a", "b", "n2"),
         _relu("b", "y", "n3")],
        (),
        "invalid graph: a cycle runs through node n1",
    ),
    "duplicate": (
        [_relu("x", "y", "first"), _relu("x", "y", "second")],
        (),
        "invalid graph: 'y' is produced twice (first and second)",
    ),
    "undefined": (
        [helper.make_node("Add", ["x", "ghost"], ["y"], name="add")],
        (),
        "invalid graph: node add reads 'ghost', which nothing produces",
    ),
    "short_raw_data": (
        [helper.make_node("Add", ["x", "w"], ["y"], name="add")],
        [_raw("w", [1, 4], 8)],
        "invalid initializer 'w': dims [1, 4] need 16 bytes, it holds 8",
    ),
    "huge_declared": (
        [helper.make_node("Add", ["x", "w"], ["y"], name="add")],
        [_raw("w", [750_000_000, 1], 16)],
        "invalid initializer 'w': dims [750000000, 1] need 3000000000 bytes, it holds 16",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_graphs_are_refused_before_anything_describes_them(tmp_path, case):
    nodes, inits, message = INVALID[case]
    model = _graph_model(tmp_path / "bad.onnx", nodes, inits)
    for args in (
        ("inspect", model, "--json"),
        ("dequantize", model, "-o", tmp_path / "d.onnx"),
        ("build", "--onnx", model, "--device", "cpu", "--precision", "fp32", "-o", tmp_path / "o"),
    ):
        assert one_error_line(run(*args)) == f"error: {model}: {message}"
    assert not (tmp_path / "d.onnx").exists() and not (tmp_path / "o").exists()


# --------------------------------------------------------------------------- catalog limits


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("shape: [batch, 4]", "shape: [0, 4]"), "0 is less than the minimum of 1"),
        (("dims: {batch: 2}", "dims: {batch: 100000000}"), "100000000 is greater than the max"),
        (
            ("range: [-1.0, 1.0]}", "range: [-1.0, 1.0], image: {size: 30000}}"),
            "30000 is greater than the maximum of 16384",
        ),
    ],
)
def test_catalog_sizes_are_bounded(tmp_path, edit, message):
    from tests.conftest import make_mlp_project

    recipe = make_mlp_project(tmp_path / "p")
    catalog = tmp_path / "p" / "catalog" / "mlp.yaml"
    text = catalog.read_text()
    assert edit[0] in text
    catalog.write_text(text.replace(edit[0], edit[1]))
    line = one_error_line(run("validate", recipe))
    assert line.startswith(f"error: {catalog}:") and message in line, line


def test_define_cannot_inject_recipe_keys(tmp_path):
    from tests.conftest import make_mlp_project

    recipe = make_mlp_project(tmp_path / "p")
    recipe.write_text(
        recipe.read_text().replace("name: mlp\n", "name: mlp\ndescription: {{ note }}\n")
    )
    line = one_error_line(run("build", recipe, "-D", "note=x\nsteps: [export]", "-o", tmp_path))
    assert "values are one line of printable text" in line
