"""A local stand-in for the Hugging Face Hub, for tests without internet.

It speaks the endpoints huggingface_hub 2.4 uses to download and list files:

- HEAD/GET `/{org}/{repo}/resolve/{rev}/{path}`: `X-Repo-Commit`, `ETag`, `Content-Length`,
  `Accept-Ranges`; LFS files (binary) also carry `X-Linked-Etag` / `X-Linked-Size` with the
  sha256 like the Hub, other files the git blob sha as ETag. `Range: bytes=N-[M]` gets a 206.
- GET `/api/models/{org}/{repo}[/revision/{rev}]`: model info with `sha` and `siblings`.
- GET `/api/models/{org}/{repo}/tree/{rev}[/{path}]?recursive=true`: the tree listing
  (directories and files, `lfs` for LFS files), paginated with a `Link: <...>; rel="next"`
  header when `page_size` is set.
- 404s carry `X-Error-Code`: `RepoNotFound`, `RevisionNotFound`, or `EntryNotFound` (with
  `X-Repo-Commit`, which huggingface_hub uses to cache the non-existence of a file).

Revisions (branch or tag names) point at 40-hex commit shas; every `add_file` is a new
commit, as on the Hub, and a commit sha works as a revision too. Fault switches:
`fail_next` (an HTTP status), `truncate` (a body cut short), `stop` (connection refused
until `start`). Every request is logged in `requests`; `/api/agent-harnesses` (huggingface_hub's
user-agent telemetry) answers an empty registry.

The server speaks HTTP/1.0 (one connection per request), so `stop()` leaves no keep-alive
connection behind and the next request really is refused.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import NamedTuple
from urllib.parse import parse_qs, quote, unquote, urlsplit

import pytest

TEXT_SUFFIXES = (".json", ".md", ".txt", ".gitattributes", ".py", ".yaml", ".yml")


class Request(NamedTuple):
    method: str
    path: str  # raw path with query string, as sent


@dataclass
class _File:
    data: bytes
    lfs: bool

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def git_sha(self) -> str:
        return hashlib.sha1(b"blob %d\0" % len(self.data) + self.data).hexdigest()

    def etag(self) -> str:
        return self.sha256 if self.lfs else self.git_sha


@dataclass
class _Fault:
    kind: str  # "status" | "cut" | "short"
    path_contains: str | None
    method: str | None
    times: int | None  # None: every matching request
    status: int = 500

    def matches(self, method: str, path: str) -> bool:
        if self.method is not None and method != self.method:
            return False
        return self.path_contains is None or self.path_contains in unquote(path)


@dataclass
class _Repo:
    revisions: dict[str, str] = field(default_factory=dict)  # name -> commit sha
    commits: dict[str, dict[str, _File]] = field(default_factory=dict)  # sha -> tree


class LocalHub:
    """State and fault switches of the fake Hub; `url` is what HF_ENDPOINT should be."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._repos: dict[str, _Repo] = {}
        self._faults: list[_Fault] = []
        self.requests: list[Request] = []
        self.page_size: int | None = None
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0
        self.start()

    # ------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Listen (again) on the same port; a fresh port on the first start."""
        if self._server is not None:
            return
        hub = self

        class Handler(_Handler):
            local_hub = hub

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Close the listening socket: further requests get "connection refused"."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        assert self._thread is not None
        self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    # ------------------------------------------------------------------ content

    def commit(self, repo_id: str, revision: str = "main") -> str:
        """The commit sha `revision` of `repo_id` points at now."""
        return self._repos[repo_id].revisions[revision]

    def add_file(
        self,
        repo_id: str,
        path: str,
        data: bytes,
        revision: str = "main",
        *,
        lfs: bool | None = None,
    ) -> str:
        """Commit `path` to `revision` (created if new): a new commit sha, like a push.

        Older commits stay reachable by their sha. Returns the new commit sha.
        """
        if lfs is None:
            lfs = not path.lower().endswith(TEXT_SUFFIXES)
        with self._lock:
            tree = dict(self._tree(repo_id, revision))
            tree[path] = _File(bytes(data), lfs)
            return self._commit(repo_id, revision, tree)

    def add_repo(self, repo_id: str, revision: str = "main") -> str:
        """An empty repo (or revision); returns its commit sha."""
        with self._lock:
            return self._commit(repo_id, revision, dict(self._tree(repo_id, revision)))

    def _tree(self, repo_id: str, revision: str) -> dict[str, _File]:
        repo = self._repos.get(repo_id)
        if repo is None or revision not in repo.revisions:
            return {}
        return repo.commits[repo.revisions[revision]]

    def _commit(self, repo_id: str, revision: str, tree: dict[str, _File]) -> str:
        repo = self._repos.setdefault(repo_id, _Repo())
        seed = f"{repo_id}\0{revision}\0{len(repo.commits)}"
        sha = hashlib.sha1(seed.encode()).hexdigest()
        repo.commits[sha] = tree
        repo.revisions[revision] = sha
        return sha

    # ------------------------------------------------------------------ faults

    def fail_next(
        self,
        status: int = 500,
        path_contains: str | None = None,
        *,
        times: int | None = 1,
        method: str | None = None,
    ) -> None:
        """Answer the next `times` matching requests (None: all) with `status`."""
        with self._lock:
            self._faults.append(_Fault("status", path_contains, method, times, status))

    def truncate(
        self, path_contains: str | None = None, *, times: int | None = 1, mode: str = "cut"
    ) -> None:
        """Cut the next `times` matching file GETs (None: all) short.

        mode "cut": send the full Content-Length but only half the bytes, then close the
        connection (the client sees a protocol error). mode "short": a well-formed response
        with half the bytes (its Content-Length disagrees with the size HEAD announced).
        """
        assert mode in ("cut", "short")
        with self._lock:
            self._faults.append(_Fault(mode, path_contains, "GET", times))

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def gets(self, path_contains: str) -> list[Request]:
        """Logged GETs whose (unquoted) path contains `path_contains`."""
        return [r for r in self.requests if r.method == "GET" and path_contains in unquote(r.path)]

    def _take_fault(self, method: str, path: str, kinds: tuple[str, ...]) -> _Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.kind in kinds and fault.matches(method, path):
                    if fault.times is not None:
                        fault.times -= 1
                        if fault.times <= 0:
                            self._faults.remove(fault)
                    return fault
        return None

    def _lookup(self, repo_id: str, revision: str) -> tuple[_Repo | None, str | None]:
        with self._lock:
            repo = self._repos.get(repo_id)
            if repo is None:
                return None, None
            if revision in repo.revisions:
                return repo, repo.revisions[revision]
            if revision in repo.commits:
                return repo, revision
            return repo, None


class _Handler(BaseHTTPRequestHandler):
    local_hub: LocalHub
    server_version = "LocalHub/1.0"

    def log_message(self, format: str, *args: object) -> None:  # silence stderr
        pass

    def do_HEAD(self) -> None:
        self._dispatch(head=True)

    def do_GET(self) -> None:
        self._dispatch(head=False)

    # ------------------------------------------------------------------ routing

    def _dispatch(self, *, head: bool) -> None:
        hub = self.local_hub
        hub.requests.append(Request(self.command, self.path))
        fault = hub._take_fault(self.command, self.path, ("status",))
        if fault is not None:
            self._error(fault.status, "InternalError" if fault.status >= 500 else None, head)
            return
        split = urlsplit(self.path)
        parts = split.path.strip("/").split("/")
        query = parse_qs(split.query)
        if split.path == "/api/agent-harnesses":  # huggingface_hub's user-agent telemetry
            self._json({"standardEnvVars": [], "harnesses": {}}, head)
        elif len(parts) >= 5 and parts[2] == "resolve":
            repo_id = f"{parts[0]}/{parts[1]}"
            path = unquote("/".join(parts[4:]))
            self._resolve(repo_id, unquote(parts[3]), path, head)
        elif len(parts) >= 4 and parts[:2] == ["api", "models"]:
            repo_id = f"{parts[2]}/{parts[3]}"
            rest = parts[4:]
            if not rest:
                self._info(repo_id, "main", head)
            elif rest[0] == "revision" and len(rest) >= 2:
                self._info(repo_id, unquote("/".join(rest[1:])), head)
            elif rest[0] == "tree" and len(rest) >= 2:
                sub = unquote("/".join(rest[2:]))
                recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
                cursor = int(query.get("cursor", ["0"])[0])
                self._tree(repo_id, unquote(rest[1]), sub, recursive, cursor, split.path, head)
            else:
                self._error(404, None, head)
        else:
            self._error(404, None, head)

    def _files(self, repo_id: str, revision: str, head: bool) -> tuple[str, dict] | None:
        repo, sha = self.local_hub._lookup(repo_id, revision)
        if repo is None:
            self._error(404, "RepoNotFound", head, message="Repository not found")
            return None
        if sha is None:
            self._error(404, "RevisionNotFound", head, message="Invalid rev id: " + revision)
            return None
        return sha, dict(repo.commits[sha])

    def _resolve(self, repo_id: str, revision: str, path: str, head: bool) -> None:
        found = self._files(repo_id, revision, head)
        if found is None:
            return
        sha, files = found
        file = files.get(path)
        if file is None:
            self._error(
                404, "EntryNotFound", head, message="Entry not found", extra={"X-Repo-Commit": sha}
            )
            return
        size = len(file.data)
        headers = {
            "X-Repo-Commit": sha,
            "ETag": f'"{file.etag()}"',
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        if file.lfs:
            headers["X-Linked-Etag"] = f'"{file.sha256}"'
            headers["X-Linked-Size"] = str(size)
        start, end = 0, size - 1
        status = 200
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            first, _, last = rng[len("bytes=") :].partition("-")
            start = int(first) if first else 0
            end = min(int(last), size - 1) if last else size - 1
            if start >= size:
                self._error(416, None, head, extra={"Content-Range": f"bytes */{size}"})
                return
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        body = file.data[start : end + 1]
        fault = None if head else self.local_hub._take_fault("GET", self.path, ("cut", "short"))
        if fault is not None and fault.kind == "short":
            body = body[: len(body) // 2]
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if head:
            return
        if fault is not None and fault.kind == "cut":
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body)

    def _info(self, repo_id: str, revision: str, head: bool) -> None:
        found = self._files(repo_id, revision, head)
        if found is None:
            return
        sha, files = found
        self._json(
            {
                "_id": hashlib.md5(repo_id.encode()).hexdigest()[:24],
                "id": repo_id,
                "modelId": repo_id,
                "sha": sha,
                "private": False,
                "disabled": False,
                "gated": False,
                "tags": ["onnx"],
                "siblings": [{"rfilename": p} for p in sorted(files)],
            },
            head,
        )

    def _tree(
        self,
        repo_id: str,
        revision: str,
        sub: str,
        recursive: bool,
        cursor: int,
        route: str,
        head: bool,
    ) -> None:
        found = self._files(repo_id, revision, head)
        if found is None:
            return
        _, files = found
        prefix = f"{sub.strip('/')}/" if sub.strip("/") else ""
        if prefix and not any(p.startswith(prefix) for p in files):
            self._error(404, "EntryNotFound", head, message=f"{sub} does not exist")
            return
        entries: dict[str, dict] = {}
        for path in sorted(files):
            if not path.startswith(prefix):
                continue
            rel = path[len(prefix) :].split("/")
            depth = len(rel) if recursive else 1
            for i in range(1, min(depth, len(rel))):
                folder = prefix + "/".join(rel[:i])
                entries.setdefault(folder, _dir_entry(folder))
            if recursive or len(rel) == 1:
                entries[path] = _file_entry(path, files[path])
        listing = [entries[k] for k in sorted(entries)]
        extra = {}
        size = self.local_hub.page_size
        if size:
            page = listing[cursor : cursor + size]
            if cursor + size < len(listing):
                query = f"recursive={str(recursive).lower()}&expand=false&cursor={cursor + size}"
                link = f"{self.local_hub.url}{quote(route)}?{query}"
                extra["Link"] = f'<{link}>; rel="next"'
            listing = page
        self._json(listing, head, extra=extra)

    # ------------------------------------------------------------------ responses

    def _json(self, value: object, head: bool, extra: dict[str, str] | None = None) -> None:
        body = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        for key, val in (extra or {}).items():
            self.send_header(key, val)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _error(
        self,
        status: int,
        code: str | None,
        head: bool,
        *,
        message: str | None = None,
        extra: dict[str, str] | None = None,
    ) -> None:
        message = message or ("Internal Error" if status >= 500 else "Not Found")
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        if code and status < 500:
            self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        for key, val in (extra or {}).items():
            self.send_header(key, val)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)


def _dir_entry(path: str) -> dict:
    return {
        "type": "directory",
        "oid": hashlib.sha1(path.encode()).hexdigest(),
        "size": 0,
        "path": path,
    }


def _file_entry(path: str, file: _File) -> dict:
    entry: dict = {"type": "file", "oid": file.git_sha, "size": len(file.data), "path": path}
    if file.lfs:
        entry["lfs"] = {"oid": file.sha256, "size": len(file.data), "pointerSize": 134}
    return entry


@pytest.fixture
def local_hub() -> Iterator[LocalHub]:
    """A fresh fake Hub on a free 127.0.0.1 port; stopped after the test."""
    hub = LocalHub()
    try:
        yield hub
    finally:
        hub.stop()


def point_hf_at(hub: LocalHub, hf_home: Path, monkeypatch) -> None:
    """HF_* for this test: the local Hub, a private cache, online, no token, no telemetry."""
    from huggingface_hub import constants

    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
