"""Every response from a Hugging Face Hub server is checked before huggingface_hub uses it.

huggingface_hub 2.4 builds cache paths from response headers without checking them:
`blobs/<ETag>`, `snapshots/<X-Repo-Commit>/` and, for a 404, `.no_exist/<X-Repo-Commit>/`.
A server answering `ETag: "../../x"` writes wherever it likes. It also reads bodies without
bounds: an endless chunked body, endless `Link` pagination or a 300 MB listing hang it.

The checks sit in the one place every huggingface_hub request goes through: its shared
`httpx2.Client`, built by `set_client_factory` with a request and a response hook. Each
response is checked as huggingface_hub receives it, so a server cannot answer one request
well and the next one badly. Hooks rather than a custom transport: the client keeps its
own transport setup (HTTPS_PROXY and friends).

- Requests ask for uncompressed bodies, and a compressed answer is refused: a few kB of
  gzip could inflate past every byte limit.
- Headers: `X-Repo-Commit` is 40 hex digits; on a HEAD, `ETag` / `X-Linked-Etag` are hex
  (optionally quoted, optionally weak); sizes are decimal; `X-Xet-Hash` is dropped so that
  file bytes always come through this client (hf_xet downloads outside it, unchecked).
- Bodies: a file body stops at the size its HEAD announced (`X-Linked-Size` or
  `Content-Length`), any other body (JSON, errors) at `untrusted.MAX_JSON_BYTES`.
- Listings (`/api/.../tree/...`): a page must be a JSON array of entries with a safe
  repo-relative `path`, an integer `size`, ...; pages and entries are counted.
- Time: a download or a listing has a total deadline (`WINML_HUB_TIMEOUT` seconds, else
  5 minutes plus 1 s per MB announced), checked on every request and every chunk.

A violation raises `UntrustedInputError` (exit 2) naming the file and the header or field.
Limits apply inside `budget(...)`; outside one, headers are still checked and bodies bounded.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import httpx2

from winml_recipes.sdk.errors import SourceError
from winml_recipes.untrusted import MAX_JSON_BYTES, UntrustedInputError, loads_bounded, printable

TIMEOUT_ENV = "WINML_HUB_TIMEOUT"
BASE_TIMEOUT = 300.0  # seconds for a listing, or for a download on top of its size
MIN_RATE = 1 << 20  # bytes per second a download may not fall below on average
# The largest file a model repo holds: ONNX external data of a big LLM is tens of GB.
MAX_FILE_BYTES = 64 << 30
# A real tree page holds up to 1000 entries; model repos hold hundreds of files.
MAX_LISTING_PAGES = 1000
MAX_LISTING_ENTRIES = 200_000

_COMMIT = re.compile(r"[0-9a-f]{40}")
_ETAG = re.compile(r'(?:W/)?("?)[0-9a-fA-F]{32,128}\1')
_DECIMAL = re.compile(r"[0-9]{1,20}")
_CONTENT_RANGE = re.compile(r"bytes (?:[0-9]{1,20}-[0-9]{1,20}|\*)/[0-9]{1,20}")
_TREE_URL = re.compile(r"/api/(?:models|datasets|spaces)/[^/]+/[^/]+/tree/")
_DRIVE = re.compile(r"[A-Za-z]:")
_UNSAFE_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\\]")
MAX_PATH_CHARS = 1024


@dataclass
class Budget:
    """Limits of one download (one file) or one listing; `label` names it in errors."""

    label: str
    kind: str  # "download" | "listing"
    started: float
    fixed_timeout: float | None
    expected_size: int | None = None
    pages: int = 0
    entries: int = 0

    @property
    def timeout(self) -> float:
        if self.fixed_timeout is not None:
            return self.fixed_timeout
        return BASE_TIMEOUT + (self.expected_size or 0) / MIN_RATE

    def check_time(self) -> None:
        elapsed = time.monotonic() - self.started
        if elapsed > self.timeout:
            raise UntrustedInputError(
                f"{printable(self.label)}: the Hub server did not finish within "
                f"{self.timeout:.0f} s; try again later, or raise {TIMEOUT_ENV} (seconds)"
            )


_BUDGET: ContextVar[Budget | None] = ContextVar("winml_hub_budget", default=None)
_INSTALL_LOCK = threading.Lock()
_installed = False


def _timeout_from_env() -> float | None:
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise SourceError(f"{TIMEOUT_ENV}={printable(raw)}: expected a number of seconds")
    return value


@contextlib.contextmanager
def budget(label: str, kind: str) -> Iterator[Budget]:
    """Apply the limits of one download or listing to every Hub request made inside."""
    install()
    current = Budget(label, kind, time.monotonic(), _timeout_from_env())
    token = _BUDGET.set(current)
    try:
        yield current
    finally:
        _BUDGET.reset(token)


def install() -> None:
    """Make huggingface_hub's shared client check every response (idempotent)."""
    global _installed
    with _INSTALL_LOCK:
        if _installed:
            return
        from huggingface_hub.utils import _http

        _http.set_client_factory(_guarded_client)
        _installed = True


def _guarded_client() -> Any:
    """huggingface_hub's default client plus the checks (same options otherwise)."""
    from huggingface_hub.utils._http import hf_request_event_hook

    return httpx2.Client(
        event_hooks={"request": [hf_request_event_hook, _on_request], "response": [_on_response]},
        follow_redirects=True,
        timeout=None,
    )


# --------------------------------------------------------------------------- hooks


def _on_request(request: Any) -> None:
    # Byte limits count what arrives: a compressed body could inflate far past them.
    request.headers["Accept-Encoding"] = "identity"
    current = _BUDGET.get()
    if current is not None:
        current.check_time()
        if current.kind == "listing" and _TREE_URL.search(request.url.path):
            current.pages += 1
            if current.pages > MAX_LISTING_PAGES:
                raise UntrustedInputError(
                    f"{printable(current.label)}: the Hub server's file listing goes on for more "
                    f"than {MAX_LISTING_PAGES} pages; refused"
                )


def _on_response(response: Any) -> None:
    current = _BUDGET.get()
    label = current.label if current is not None else _url_label(response.request.url)
    if current is not None:
        current.check_time()
    headers = response.headers
    _check_headers(response, label)
    # hf_xet would fetch the bytes with its own HTTP stack, past every check here; without
    # this header huggingface_hub downloads through this client (the Hub serves both).
    headers.pop("X-Xet-Hash", None)
    method = response.request.method
    ok = 200 <= response.status_code < 300
    path = response.request.url.path
    is_file = "/resolve/" in path or "/api/" not in path
    announces = ok or (response.is_redirect and "X-Linked-Size" in headers)
    if method == "HEAD" and announces and current is not None and current.kind == "download":
        current.expected_size = _announced_size(headers, response.is_redirect, label)
    file_body = method == "GET" and ok and is_file
    if file_body and current is not None and current.expected_size is not None:
        limit = current.expected_size
    else:
        limit = MAX_FILE_BYTES if file_body else MAX_JSON_BYTES
    tree = method == "GET" and ok and bool(_TREE_URL.search(path))
    response.stream = _Bounded(response.stream, limit, label, current, tree, file_body)


def _url_label(url: Any) -> str:
    return f"{url.scheme}://{url.host}{url.path}"


def _check_headers(response: Any, label: str) -> None:
    """The headers huggingface_hub builds paths or sizes from, read as it reads them
    (`headers.get`: repeated headers are joined, so they fail the check)."""
    headers = response.headers

    def bad(name: str, value: str, expected: str) -> UntrustedInputError:
        return UntrustedInputError(
            f"{printable(label)}: the Hub server sent {name}: '{printable(value)[:120]}', "
            f"not {expected}; refusing to use it"
        )

    encoding = headers.get("Content-Encoding", "identity")
    if encoding.strip().lower() != "identity":
        raise bad("Content-Encoding", encoding, "identity (this tool asks for uncompressed bodies)")
    commit = headers.get("X-Repo-Commit")
    if commit is not None and not _COMMIT.fullmatch(commit):
        raise bad("X-Repo-Commit", commit, "a 40-hex commit sha")
    for name in ("Content-Length", "X-Linked-Size"):
        value = headers.get(name)
        if value is not None and not _DECIMAL.fullmatch(value):
            raise bad(name, value, "a byte count")
    value = headers.get("Content-Range")
    if value is not None and not _CONTENT_RANGE.fullmatch(value):
        raise bad("Content-Range", value, "a byte range")
    if response.request.method == "HEAD" and not _followed_redirect(response):
        # huggingface_hub names the blob after X-Linked-Etag, or ETag without it.
        name = "X-Linked-Etag" if headers.get("X-Linked-Etag") else "ETag"
        value = headers.get(name)
        if value is not None and not _ETAG.fullmatch(value):
            raise bad(name, value, "a hex digest")


def _followed_redirect(response: Any) -> bool:
    """A redirect to the same origin: huggingface_hub follows it and ignores its headers."""
    if not response.is_redirect:
        return False
    try:
        target = response.request.url.join(response.headers["Location"])
    except (KeyError, httpx2.InvalidURL):
        return False
    url = response.request.url
    return (target.scheme, target.host, target.port) == (url.scheme, url.host, url.port)


def _announced_size(headers: Any, redirect: bool, label: str) -> int:
    """The file size a HEAD announces, as huggingface_hub reads it; it caps the body."""
    raw = headers.get("X-Linked-Size") or (None if redirect else headers.get("Content-Length"))
    if raw is None:
        raise UntrustedInputError(
            f"{printable(label)}: the Hub server announced no size (X-Linked-Size or "
            "Content-Length); refusing to download an unbounded file"
        )
    size = int(raw)
    if size > MAX_FILE_BYTES:
        raise UntrustedInputError(
            f"{printable(label)}: the Hub server announced {size:,} bytes (X-Linked-Size / "
            f"Content-Length), more than the {MAX_FILE_BYTES:,} this tool downloads"
        )
    return size


class _Bounded(httpx2.SyncByteStream):
    """A response body that stops at `limit` bytes and at the budget's deadline; a tree
    listing page is also checked (and counted) once it is complete."""

    def __init__(
        self,
        stream: Any,
        limit: int,
        label: str,
        current: Budget | None,
        tree: bool,
        file_body: bool,
    ) -> None:
        self._stream = stream
        self._file_body = file_body
        self._limit = limit
        self._label = label
        self._budget = current
        self._tree = tree

    def __iter__(self) -> Iterator[bytes]:
        seen = 0
        kept: list[bytes] = []
        for chunk in self._stream:
            seen += len(chunk)
            if seen > self._limit:
                what = (
                    "the file size it announced (X-Linked-Size / Content-Length)"
                    if self._file_body
                    else "what this tool reads from a Hub API answer"
                )
                raise UntrustedInputError(
                    f"{printable(self._label)}: the Hub server sent more than {self._limit:,} "
                    f"bytes, {what}; reading stopped"
                )
            if self._budget is not None:
                self._budget.check_time()
            if self._tree:
                kept.append(chunk)
            yield chunk
        if self._tree:
            count = check_tree_page(b"".join(kept), self._label)
            if self._budget is not None:
                self._budget.entries += count
                if self._budget.entries > MAX_LISTING_ENTRIES:
                    raise UntrustedInputError(
                        f"{printable(self._label)}: the Hub server's file listing has more than "
                        f"{MAX_LISTING_ENTRIES:,} entries; refused"
                    )

    def close(self) -> None:
        self._stream.close()


# --------------------------------------------------------------------------- content


def repo_path_problem(path: object) -> str | None:
    """Why `path` is not a safe repo-relative file path (None when it is).

    Safe: a non-empty str of `/`-separated parts, none empty, `.` or `..`, no leading `/`,
    no backslash, drive letter or control character, at most MAX_PATH_CHARS characters.
    """
    if not isinstance(path, str):
        return f"is a {type(path).__name__}, not a string"
    if not path or len(path) > MAX_PATH_CHARS:
        return f"is {len(path)} characters long"
    if _UNSAFE_CHARS.search(path):
        return "has a control character or a backslash"
    if path.startswith("/"):
        return "is absolute"
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "has an empty, '.' or '..' part"
    if _DRIVE.match(parts[0]):
        return "starts with a drive letter"
    return None


def check_tree_page(body: bytes, label: str) -> int:
    """A tree listing page: a JSON array of file/directory entries. Returns its length."""
    page = loads_bounded(body, f"{label} (file listing)")
    if not isinstance(page, list):
        raise UntrustedInputError(
            f"{printable(label)}: the Hub server's file listing is a JSON "
            f"{_JSON_KIND.get(type(page), 'value')}, not an array of entries"
        )
    for index, entry in enumerate(page):
        problem = _entry_problem(entry)
        if problem is not None:
            raise UntrustedInputError(
                f"{printable(label)}: file listing entry {index}: {problem}; refusing the listing"
            )
    return len(page)


def _entry_problem(entry: object) -> str | None:
    if not isinstance(entry, dict):
        return f"is a JSON {_JSON_KIND.get(type(entry), 'value')}, not an object"
    kind = entry.get("type")
    if kind not in ("file", "directory"):
        return f"type '{printable(kind)[:40]}' is not 'file' or 'directory'"
    problem = repo_path_problem(entry.get("path"))
    if problem is not None:
        return f"path '{printable(entry.get('path'))[:80]}' {problem}"
    if kind == "directory":
        return None
    if not _is_count(entry.get("size")):
        return f"size '{printable(entry.get('size'))[:40]}' is not a byte count"
    if not isinstance(entry.get("oid"), str):
        return "oid is missing or not a string"
    lfs = entry.get("lfs")
    if lfs is not None and not (
        isinstance(lfs, dict)
        and _is_count(lfs.get("size"))
        and _is_count(lfs.get("pointerSize"))
        and isinstance(lfs.get("oid"), str)
    ):
        return "lfs is not an object with size, oid and pointerSize"
    return None


_JSON_KIND = {dict: "object", list: "array", str: "string", int: "number", float: "number"}


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_FILE_BYTES


def is_commit(value: object) -> bool:
    """A full 40-hex commit sha (what the Hub names commits with)."""
    return isinstance(value, str) and bool(_COMMIT.fullmatch(value))
