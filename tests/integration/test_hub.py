"""Hub-hosted ONNX files against a local fake Hub (tests/hubserver.py): no internet.

How the environment is set: `winml_recipes.hub` reads HF_ENDPOINT, HF_HUB_OFFLINE and
HF_HOME on every call and passes them to huggingface_hub explicitly, so these tests run
in-process and set them per test with monkeypatch (huggingface_hub may already have been
imported by another test). `hub_env` also pins the two import-time switches that would
otherwise leak in: offline mode off, telemetry (a request to huggingface.co) off. One test
runs a fresh process with the variables set before the import, as the CLI sees them.

Retries: huggingface_hub sleeps 1+2+4+8+8 s between retries; `fast_retries` replaces its
`time.sleep` for the tests that exercise retries. "connection refused" is not patched: it
must be fast on its own.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import REPO as REPO_ROOT
from tests.hubserver import LocalHub, local_hub, point_hf_at  # noqa: F401  (fixture)
from winml_recipes.hub import HubEntry, SidecarWarning, download_onnx, list_onnx
from winml_recipes.onnx.io import load_model
from winml_recipes.sdk.errors import SourceError
from winml_recipes.sources import HubOnnx, classify

REPO = "onnx-community/sam3-tracker-ONNX"
VISION = "onnx/vision_encoder_int8.onnx"
VISION_DATA = "onnx/vision_encoder_int8.onnx_data"
DECODER = "onnx/prompt_encoder_mask_decoder_int8.onnx"


# --------------------------------------------------------------------------- models


def _vision_model(dirpath: Path) -> tuple[bytes, bytes, np.ndarray]:
    """x[1,16] @ w[16,32]; w (2 KiB) lives in `vision_encoder_int8.onnx_data`."""
    w = (np.arange(16 * 32, dtype=np.float32).reshape(16, 32) / 100).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "vision",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])],
        initializer=[numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    path = dirpath / "vision_encoder_int8.onnx"
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=True,
        location="vision_encoder_int8.onnx_data",
        size_threshold=1024,
    )
    return path.read_bytes(), (dirpath / "vision_encoder_int8.onnx_data").read_bytes(), w


def _decoder_model(bias: float) -> bytes:
    """relu(x + bias), weights inline (no sidecar)."""
    b = numpy_helper.from_array(np.full(4, bias, dtype=np.float32), "b")
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["x", "b"], ["h"], name="add"),
            helper.make_node("Relu", ["h"], ["y"], name="relu"),
        ],
        "decoder",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        initializer=[b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model.SerializeToString()


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict:
    vision, vision_data, w = _vision_model(tmp_path_factory.mktemp("models"))
    return {
        VISION: vision,
        VISION_DATA: vision_data,
        "w": w,
        DECODER: _decoder_model(0.5),
        "decoder_v1": _decoder_model(-0.25),
    }


# --------------------------------------------------------------------------- env


@pytest.fixture
def hub(local_hub: LocalHub, models: dict, tmp_path: Path, monkeypatch) -> LocalHub:  # noqa: F811
    """The fake Hub serving the SAM 3 tracker files; HF_* point at it and at a tmp cache."""
    local_hub.add_file(REPO, VISION, models[VISION])
    local_hub.add_file(REPO, VISION_DATA, models[VISION_DATA])
    local_hub.add_file(REPO, DECODER, models[DECODER])
    local_hub.add_file(REPO, "README.md", b"# sam3 tracker\n")
    local_hub.add_file(REPO, "config.json", b"{}")
    local_hub.add_file(REPO, DECODER, models["decoder_v1"], revision="v1")
    point_hf_at(local_hub, tmp_path / "hf", monkeypatch)
    return local_hub


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "hf" / "hub" / "models--onnx-community--sam3-tracker-ONNX"


class _FastTime:
    """`time` for huggingface_hub's retry loops: sleeping is recorded, not waited."""

    def __init__(self) -> None:
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)

    def __getattr__(self, name: str):
        return getattr(time, name)


@pytest.fixture
def fast_retries(monkeypatch) -> _FastTime:
    import huggingface_hub.file_download as file_download
    import huggingface_hub.utils._http as http

    fake = _FastTime()
    monkeypatch.setattr(http, "time", fake)
    monkeypatch.setattr(file_download, "time", fake)
    return fake


def ref(path: str, revision: str | None = None, repo: str = REPO) -> HubOnnx:
    got = classify(f"{repo}@{revision}/{path}" if revision else f"{repo}/{path}")
    assert isinstance(got, HubOnnx)
    return got


def one_line_error(exc_info: pytest.ExceptionInfo) -> str:
    text = str(exc_info.value)
    assert "\n" not in text
    return text


def assert_clean_cache(cache: Path) -> None:
    """No partial download anywhere, and every blob is whole (LFS blob name = sha256)."""
    assert list(cache.rglob("*.incomplete")) == []
    for blob in (cache / "blobs").glob("*") if (cache / "blobs").exists() else []:
        assert hashlib.sha256(blob.read_bytes()).hexdigest() == blob.name, blob


def run_vision(path: Path, w: np.ndarray) -> None:
    x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(1, 16)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"x": x})[0], x @ w, rtol=1e-5)


# --------------------------------------------------------------------------- downloads


def test_download_both_files_with_sidecar(hub: LocalHub, models: dict, cache: Path) -> None:
    commit = hub.commit(REPO)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a missing optional sidecar is silent
        vision = download_onnx(ref(VISION))
        decoder = download_onnx(ref(DECODER))

    assert vision.commit == decoder.commit == commit
    assert vision.path == cache / "snapshots" / commit / VISION
    assert (vision.repo_id, vision.filename, vision.revision) == (REPO, VISION, None)
    assert vision.sidecars == [cache / "snapshots" / commit / VISION_DATA]
    sidecar = vision.sidecars[0]
    # onnx refuses symlinked or hard-linked external data: the sidecar is a plain file
    assert not sidecar.is_symlink() and sidecar.stat().st_nlink == 1
    assert sidecar.read_bytes() == models[VISION_DATA]
    assert vision.path.read_bytes() == models[VISION]
    load_model(vision.path)  # onnx with external data, from the snapshot folder
    run_vision(vision.path, models["w"])

    assert decoder.sidecars == []
    x = np.array([[-1.0, 0.0, 1.0, 2.0]], dtype=np.float32)
    out = ort.InferenceSession(str(decoder.path)).run(None, {"x": x})[0]
    np.testing.assert_allclose(out, np.maximum(x + 0.5, 0))
    # the answer "no sidecar" is cached for the commit
    assert (cache / ".no_exist" / commit / (DECODER + "_data")).is_file()
    assert_clean_cache(cache)


def test_second_download_comes_from_the_cache(hub: LocalHub) -> None:
    first = download_onnx(ref(VISION))
    download_onnx(ref(DECODER))
    hub.requests.clear()
    again = download_onnx(ref(VISION))
    download_onnx(ref(DECODER))
    assert again == first
    assert hub.gets("/resolve/") == []  # no bytes fetched again
    # one HEAD per model (is `main` still at that commit?); none for the sidecars
    assert [r.method for r in hub.requests] == ["HEAD", "HEAD"]


def test_sidecar_blob_is_moved_not_copied(hub: LocalHub, cache: Path) -> None:
    vision = download_onnx(ref(VISION))
    # the freshly downloaded sidecar blob went into the snapshot: one copy on disk
    blobs = sorted(p.name for p in (cache / "blobs").iterdir())
    assert hashlib.sha256(vision.sidecars[0].read_bytes()).hexdigest() not in blobs
    assert vision.path.is_symlink()  # the model itself stays a normal cache symlink


def test_revision_tag_and_commit_sha(hub: LocalHub, models: dict, monkeypatch) -> None:
    v1 = hub.commit(REPO, "v1")
    tagged = download_onnx(ref(DECODER, "v1"))
    assert tagged.commit == v1 != hub.commit(REPO)
    assert tagged.revision == "v1"
    assert tagged.path.read_bytes() == models["decoder_v1"]
    assert tagged.pinned == HubOnnx(REPO, DECODER, v1)

    by_sha = download_onnx(ref(DECODER, v1))
    assert by_sha.path == tagged.path and by_sha.commit == v1
    main = download_onnx(ref(DECODER))
    assert main.path.read_bytes() == models[DECODER]

    # a revision passed beside the ref, as the catalog does
    assert classify(f"{REPO}/{DECODER}", revision="v1") == ref(DECODER, "v1")

    hub.stop()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert download_onnx(ref(DECODER, "v1")).path == tagged.path
    assert download_onnx(ref(DECODER, v1)).path == tagged.path


def test_moved_branch_fetches_the_new_commit(hub: LocalHub, models: dict) -> None:
    old_vision = download_onnx(ref(VISION))
    old_decoder = download_onnx(ref(DECODER))
    hub.add_file(REPO, "README.md", b"# moved\n")
    new_commit = hub.add_file(REPO, DECODER, models["decoder_v1"])
    new_vision = download_onnx(ref(VISION))
    new_decoder = download_onnx(ref(DECODER))
    assert new_vision.commit == new_decoder.commit == new_commit != old_vision.commit
    assert new_decoder.path.read_bytes() == models["decoder_v1"]
    assert old_decoder.path.read_bytes() == models[DECODER]  # old snapshot untouched
    for got in (old_vision, new_vision):  # each snapshot has its own loadable sidecar
        assert got.sidecars == [got.path.with_name("vision_encoder_int8.onnx_data")]
        load_model(got.path)
        run_vision(got.path, models["w"])


# --------------------------------------------------------------------------- offline


def test_offline_with_a_warm_cache(hub: LocalHub, monkeypatch) -> None:
    vision = download_onnx(ref(VISION))
    decoder = download_onnx(ref(DECODER))
    hub.stop()
    hub.requests.clear()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert download_onnx(ref(VISION)) == vision
        assert download_onnx(ref(DECODER)) == decoder  # known-missing sidecar: silent
    assert hub.requests == []


def test_offline_with_a_cold_cache(hub: LocalHub, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SourceError) as err:
        download_onnx(ref(VISION))
    msg = one_line_error(err)
    assert msg.startswith(f"{REPO}@main/{VISION} is not in the Hugging Face cache")
    assert "HF_HUB_OFFLINE is set" in msg
    assert f"hf download {REPO} --revision main --include '{VISION}*'" in msg
    assert hub.requests == []


def test_offline_known_missing_file(hub: LocalHub, monkeypatch) -> None:
    with pytest.raises(SourceError):
        download_onnx(ref("onnx/nope.onnx"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SourceError) as err:
        download_onnx(ref("onnx/nope.onnx"))
    assert one_line_error(err) == f"file not found in {REPO}@main: onnx/nope.onnx"


def test_offline_in_a_fresh_process(hub: LocalHub, tmp_path: Path) -> None:
    """HF_* set before huggingface_hub is imported, as for the CLI."""
    download_onnx(ref(VISION))
    hub.stop()
    script = textwrap.dedent(
        f"""
        import json
        from winml_recipes.sdk.errors import SourceError
        from winml_recipes.hub import download_onnx
        from winml_recipes.sources import classify
        f = download_onnx(classify("{REPO}/{VISION}"))
        print(json.dumps([str(f.path), f.commit, [str(p) for p in f.sidecars]]))
        try:
            download_onnx(classify("{REPO}/{DECODER}"))
        except SourceError as e:
            print("error:", e)
        """
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    path, commit, sidecars = json.loads(out[0])
    assert commit == hub.commit(REPO)
    assert Path(path).name == "vision_encoder_int8.onnx"
    assert [Path(p).name for p in sidecars] == ["vision_encoder_int8.onnx_data"]
    assert out[1].startswith(f"error: {REPO}@main/{DECODER} is not in the Hugging Face cache")
    assert len(out) == 2


# --------------------------------------------------------------------------- faults


def test_server_error_after_retries(
    hub: LocalHub, fast_retries: _FastTime, cache: Path, models: dict
) -> None:
    hub.fail_next(500, VISION, times=None)
    with pytest.raises(SourceError) as err:
        download_onnx(ref(VISION))
    msg = one_line_error(err)
    assert msg.startswith(f"could not fetch {REPO}@main/{VISION} from {hub.url}")
    assert "HTTP 500" in msg
    assert len(fast_retries.sleeps) >= 3  # huggingface_hub's retries ran (not waited)
    assert_clean_cache(cache)
    assert not (cache / "snapshots").exists() or not list((cache / "snapshots").rglob("*.onnx"))

    hub.clear_faults()
    assert download_onnx(ref(VISION)).path.read_bytes() == models[VISION]


def test_transient_server_error_recovers(hub: LocalHub, fast_retries: _FastTime) -> None:
    hub.fail_next(500, VISION, times=3)  # the probe, the first HEAD, its first retry
    assert download_onnx(ref(VISION)).commit == hub.commit(REPO)
    assert fast_retries.sleeps == [1]  # recovered by huggingface_hub's retry


def test_connection_refused_is_fast(hub: LocalHub) -> None:
    hub.stop()
    start = time.monotonic()
    with pytest.raises(SourceError) as err:
        download_onnx(ref(VISION))
    with pytest.raises(SourceError) as list_err:
        list_onnx(REPO)
    elapsed = time.monotonic() - start
    msg = one_line_error(err)
    assert msg.startswith(f"cannot reach the Hugging Face Hub at {hub.url}")
    assert "connection refused" in msg and "HF_HUB_OFFLINE=1" in msg
    assert "connection refused" in one_line_error(list_err)
    assert elapsed < 3, f"took {elapsed:.1f}s"


def test_connection_refused_with_a_warm_cache_uses_it(hub: LocalHub) -> None:
    first = download_onnx(ref(VISION))
    hub.stop()
    start = time.monotonic()
    assert download_onnx(ref(VISION)) == first
    assert time.monotonic() - start < 3


def test_missing_file(hub: LocalHub, cache: Path) -> None:
    with pytest.raises(SourceError) as err:
        download_onnx(ref("onnx/nope.onnx"))
    assert one_line_error(err) == f"file not found in {REPO}@main: onnx/nope.onnx"
    assert_clean_cache(cache)


def test_unknown_revision(hub: LocalHub) -> None:
    with pytest.raises(SourceError) as err:
        download_onnx(ref(VISION, "no-such-branch"))
    msg = one_line_error(err)
    assert msg.startswith(f"revision 'no-such-branch' not found in {REPO}")


def test_unknown_repo(hub: LocalHub) -> None:
    with pytest.raises(SourceError) as err:
        download_onnx(ref(VISION, repo="onnx-community/no-such-repo"))
    msg = one_line_error(err)
    assert msg.startswith(f"Hub repo not found: onnx-community/no-such-repo (at {hub.url})")
    assert "HF_TOKEN" in msg


def test_referenced_sidecar_missing_is_an_error(hub: LocalHub, models: dict) -> None:
    orphan = onnx.load_from_string(models[VISION])
    for entry in orphan.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = "weights/orphan.bin"  # not a conventional sidecar name
    hub.add_file(REPO, "onnx/orphan.onnx", orphan.SerializeToString())
    with pytest.raises(SourceError) as err:
        download_onnx(ref("onnx/orphan.onnx"))
    assert one_line_error(err) == (
        f"onnx/orphan.onnx references external data onnx/weights/orphan.bin which is not in "
        f"{REPO}@{hub.commit(REPO)[:12]}; the model cannot be loaded"
    )
    # referenced files are fetched whatever their name
    hub.add_file(REPO, "onnx/weights/orphan.bin", models[VISION_DATA])
    got = download_onnx(ref("onnx/orphan.onnx"))
    assert [p.name for p in got.sidecars] == ["orphan.bin"]
    run_vision(got.path, models["w"])


def test_optional_sidecar_failure_warns(hub: LocalHub, fast_retries: _FastTime) -> None:
    hub.fail_next(500, DECODER + "_data", times=None)
    with pytest.warns(SidecarWarning, match=r"prompt_encoder_mask_decoder_int8\.onnx_data"):
        got = download_onnx(ref(DECODER))
    assert got.sidecars == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hub.clear_faults()
        download_onnx(ref(DECODER))


def test_cut_download_is_resumed(hub: LocalHub, fast_retries: _FastTime, models: dict) -> None:
    hub.truncate(VISION_DATA, times=1)
    got = download_onnx(ref(VISION))
    assert got.sidecars[0].read_bytes() == models[VISION_DATA]
    assert len(hub.gets(VISION_DATA)) == 2  # cut once, then resumed with a Range request


def test_cut_download_fails_cleanly_then_recovers(
    hub: LocalHub, fast_retries: _FastTime, models: dict, cache: Path
) -> None:
    hub.truncate(VISION, times=None)  # every GET of the model and its sidecar is cut
    with pytest.raises(SourceError) as err:
        download_onnx(ref(VISION))
    msg = one_line_error(err)
    assert msg.startswith(f"download of {REPO}@main/{VISION} failed")
    assert "nothing was cached" in msg
    assert_clean_cache(cache)
    hub.clear_faults()
    got = download_onnx(ref(VISION))
    assert got.path.read_bytes() == models[VISION]
    run_vision(got.path, models["w"])


def test_short_download_is_an_error_and_leaves_no_file(
    hub: LocalHub, models: dict, cache: Path
) -> None:
    hub.truncate(VISION, times=1, mode="short")
    with pytest.raises(SourceError) as err:
        download_onnx(ref(VISION))
    size = len(models[VISION])
    msg = one_line_error(err)
    assert msg == (
        f"download of {REPO}@main/{VISION} was cut short (got {size // 2} of {size} bytes); "
        "nothing was cached, run again to retry"
    )
    assert_clean_cache(cache)
    assert not list(cache.rglob("vision_encoder_int8.onnx"))
    assert download_onnx(ref(VISION)).path.read_bytes() == models[VISION]


def test_progress_bars_only_on_request(hub: LocalHub, capfd, monkeypatch) -> None:
    monkeypatch.setenv("TQDM_POSITION", "-1")  # force bars on even without a TTY
    download_onnx(ref(VISION))
    assert "B/s" not in capfd.readouterr().err
    download_onnx(ref(DECODER), progress=True)
    assert "prompt_encoder_mask_decoder_int8.onnx" in capfd.readouterr().err


# --------------------------------------------------------------------------- discovery


def test_list_onnx(hub: LocalHub, models: dict) -> None:
    hub.add_file(REPO, "onnx/extra_fp16.ONNX", b"\x08\x0a")
    hub.add_file(REPO, "onnx/model.onnx", b"m" * 10)
    hub.add_file(REPO, "onnx/model.onnx_data", b"d" * 30)
    hub.add_file(REPO, "onnx/model.onnx_data_1", b"d" * 7)
    hub.add_file(REPO, "onnx/model.onnx.data", b"d" * 5)
    hub.add_file(REPO, "onnx/sub/model.onnx_data", b"x")  # another folder: not a sidecar
    commit = hub.commit(REPO)
    got = list_onnx(REPO)
    assert got == [
        HubEntry(REPO, "onnx/extra_fp16.ONNX", 2, {}, None, commit),
        HubEntry(
            REPO,
            "onnx/model.onnx",
            10,
            {"onnx/model.onnx.data": 5, "onnx/model.onnx_data": 30, "onnx/model.onnx_data_1": 7},
            None,
            commit,
        ),
        HubEntry(REPO, DECODER, len(models[DECODER]), {}, None, commit),
        HubEntry(
            REPO, VISION, len(models[VISION]), {VISION_DATA: len(models[VISION_DATA])}, None, commit
        ),
    ]
    assert got[1].total_size == 52
    assert got[3].ref == HubOnnx(REPO, VISION, None)
    tree = [r.path for r in hub.requests if "/tree/" in r.path]
    assert tree == [f"/api/models/{REPO}/tree/{commit}?recursive=true&expand=false"]


def test_list_onnx_paginates_and_takes_a_revision(hub: LocalHub, models: dict) -> None:
    for i in range(5):
        hub.add_file(REPO, f"onnx/part{i}.onnx", b"p")
    hub.page_size = 3
    paths = [e.path for e in list_onnx(REPO)]
    assert paths == sorted([DECODER, VISION, *(f"onnx/part{i}.onnx" for i in range(5))])
    assert len([r for r in hub.requests if "/tree/" in r.path]) > 1
    v1 = list_onnx(REPO, revision="v1")
    assert [(e.path, e.size, e.revision, e.commit) for e in v1] == [
        (DECODER, len(models["decoder_v1"]), "v1", hub.commit(REPO, "v1"))
    ]


def test_list_onnx_errors(hub: LocalHub, monkeypatch) -> None:
    with pytest.raises(SourceError) as err:
        list_onnx("onnx-community/no-such-repo")
    assert one_line_error(err).startswith("Hub repo not found: onnx-community/no-such-repo")
    with pytest.raises(SourceError) as err:
        list_onnx(REPO, revision="nope")
    assert one_line_error(err).startswith(f"revision 'nope' not found in {REPO}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SourceError) as err:
        list_onnx(REPO)
    assert "HF_HUB_OFFLINE is set" in one_line_error(err)
