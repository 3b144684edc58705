"""The Hub as an attacker: a malicious server on 127.0.0.1 (tests/hostilehub.py) against the
real CLI in a fresh process, HF_HOME inside the test's folder.

Whatever the server answers, `inspect org/repo/m.onnx` and `hub ls org/repo` must end with
exit 2, a short error (at most 3 lines, no traceback, no terminal escape), within 60 s,
and leave no file outside HF_HOME and the tool's cache, and no partial download.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO as REPO_ROOT
from tests.hostilehub import HostileHub

MODEL = "org/repo/m.onnx"

# attack -> (command, what the one-line error must say: the file/repo and the field)
CASES = {
    "etag_up": (["inspect", MODEL], ["org/repo@main/m.onnx", "ETag"]),
    "etag_abs": (["inspect", MODEL], ["org/repo@main/m.onnx", "ETag"]),
    "commit_404": (["inspect", MODEL], ["/m.onnx", "X-Repo-Commit"]),
    "commit_up": (["inspect", MODEL], ["org/repo@main/m.onnx", "X-Repo-Commit"]),
    "endless_body": (["inspect", MODEL], ["org/repo@main/m.onnx", "more than 1,000 bytes"]),
    "slow_body": (["inspect", MODEL], ["org/repo@main/m.onnx", "within 3 s"]),
    "gzip_bomb": (["inspect", MODEL], ["org/repo@main/m.onnx", "Content-Encoding: 'gzip'"]),
    "escape_reason": (["inspect", MODEL], ["org/repo@main/m.onnx", "HTTP 403"]),
    "endless_pages": (["hub", "ls", "org/repo"], ["org/repo@main", "more than 1000 pages"]),
    "wide_pages": (["hub", "ls", "org/repo"], ["org/repo@main", "more than 200,000 entries"]),
    "huge_listing": (["hub", "ls", "org/repo"], ["org/repo@main", "more than 16,777,216 bytes"]),
    "listing_object": (["hub", "ls", "org/repo"], ["org/repo@main", "JSON object, not an array"]),
    "listing_big": (["hub", "ls", "org/repo"], ["org/repo@main", "entry 0: size 'big'"]),
    "listing_newline": (
        ["hub", "ls", "org/repo"],
        ["org/repo@main", r"entry 1: path 'm.onnx\nerror: forged line\x1b[31m.onnx'"],
    ),
}


def _tree(top: Path) -> dict[str, str]:
    """Every path under `top` (links not followed) -> its kind (and a link's target)."""
    found = {}
    for folder, dirs, files in os.walk(top):
        for name in dirs + files:
            path = Path(folder, name)
            rel = str(path.relative_to(top))
            found[rel] = f"-> {os.readlink(path)}" if path.is_symlink() else path.is_dir() * "dir"
    return found


@pytest.fixture
def server(request, tmp_path: Path) -> Iterator[HostileHub]:
    hub = HostileHub(request.param, tmp_path / "root")
    yield hub
    hub.close()


@pytest.mark.parametrize("server", list(CASES), indirect=True)
def test_hostile_hub(server: HostileHub, tmp_path: Path) -> None:
    command, must_say = CASES[server.attack]
    hf_home = server.root / "hf"
    hf_home.mkdir(parents=True)
    allowed = (server.root / "hf", tmp_path / "cache")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(
        HF_HOME=str(hf_home),
        HF_ENDPOINT=server.url,
        HF_HUB_DISABLE_TELEMETRY="1",
        WINML_RECIPES_CACHE=str(tmp_path / "cache"),
        WINML_HUB_TIMEOUT="3" if server.attack == "slow_body" else "40",
        PYTHONPATH=str(REPO_ROOT),
        PYTHONUNBUFFERED="1",
    )
    before = _tree(tmp_path)
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "winml_recipes", *command],
        cwd=server.root,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    elapsed = time.monotonic() - start
    after = _tree(tmp_path)

    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert 1 <= len(err) <= 3, err
    assert "Traceback" not in proc.stderr
    assert "\x1b" not in proc.stderr + proc.stdout and "\x07" not in proc.stderr
    assert not any(line.startswith("error: forged") for line in proc.stdout.splitlines() + err)
    for text in must_say:
        assert text in err[-1], (text, err)
    assert elapsed < 60

    new = {p: kind for p, kind in after.items() if before.get(p) != kind}
    outside = [p for p in new if not any((tmp_path / p).is_relative_to(a) for a in allowed)]
    assert outside == [], f"written outside HF_HOME and the cache: {outside}"
    for path, kind in new.items():
        assert not path.endswith(".incomplete"), f"partial download left: {path}"
        if kind.startswith("-> "):  # a cache symlink must point inside HF_HOME
            target = (tmp_path / path).parent / kind[3:]
            assert target.resolve().is_relative_to(hf_home.resolve()), (path, kind)


# --------------------------------------------------------------------------- the checks


@pytest.mark.parametrize(
    "path",
    [
        "../x",
        "a/../../x",
        "/etc/passwd",
        "a\\..\\x",
        "C:/x",
        "c:x",
        "a//b",
        "./a",
        "a/.",
        "",
        "a\nb",
        "a\x1bb",
        "a\u202eb",
        "x" * 2000,
        3,
        None,
    ],
)
def test_unsafe_repo_paths_are_named(path: object) -> None:
    from winml_recipes.hubguard import repo_path_problem

    assert repo_path_problem(path) is not None


@pytest.mark.parametrize(
    "path", ["m.onnx", "onnx/model.onnx_data", "a b/ü.onnx", "d/.gitattributes"]
)
def test_ordinary_repo_paths_pass(path: str) -> None:
    from winml_recipes.hubguard import repo_path_problem

    assert repo_path_problem(path) is None


def _head(
    status: int,
    headers: dict[str, str],
    url: str = "https://huggingface.co/o/r/resolve/main/m.onnx",
):
    import httpx2

    return httpx2.Response(status, headers=headers, request=httpx2.Request("HEAD", url))


def test_real_hub_headers_pass() -> None:
    """The shapes huggingface.co answers with: a git-sha ETag, or an LFS redirect whose own
    ETag is the redirect page's (huggingface_hub uses X-Linked-Etag then)."""
    from winml_recipes.hubguard import _check_headers

    sha1, sha256 = "a" * 40, "b" * 64
    _check_headers(_head(200, {"ETag": f'"{sha1}"', "X-Repo-Commit": sha1}), "l")
    lfs = {
        "Location": "https://cas-bridge.xethub.hf.co/x?sig=1",
        "X-Repo-Commit": sha1,
        "X-Linked-Etag": f'"{sha256}"',
        "X-Linked-Size": "548105171",
        "ETag": 'W/"505-Qm9vL2Jhcg"',
    }
    _check_headers(_head(302, lfs), "l")
    # a redirect huggingface_hub follows (same host): its headers are not used
    _check_headers(_head(307, {"Location": "/o/r2/resolve/main/m.onnx", "ETag": "x/../y"}), "l")


@pytest.mark.parametrize(
    "headers",
    [
        {"ETag": '"../../x"'},
        {"ETag": "/tmp/x"},
        {"X-Linked-Etag": '"a/../b"', "ETag": f'"{"a" * 40}"'},
        {"X-Repo-Commit": "../" + "a" * 37},
        {"X-Repo-Commit": "A" * 40},
        {"X-Linked-Size": "-1"},
        {"Content-Range": "bytes 0-1/x"},
    ],
)
def test_hostile_headers_are_refused(headers: dict[str, str]) -> None:
    from winml_recipes.hubguard import _check_headers
    from winml_recipes.untrusted import UntrustedInputError

    response = _head(302, {"Location": "https://cdn.example/x", **headers})
    with pytest.raises(UntrustedInputError, match="the Hub server sent"):
        _check_headers(response, "org/repo@main/m.onnx")
