"""A malicious Hugging Face Hub on 127.0.0.1, for the tests that play the attacker.

It speaks just enough of the Hub protocol for `inspect org/repo/m.onnx` and `hub ls org/repo`
(see tests/hubserver.py for the honest one) and lies in the way `attack` says:

- `etag_up` / `etag_abs`: the file's ETag is a path (`"../../../../x/PWNED"`, or absolute);
- `commit_404`: the model is fine, its sidecars are 404s whose `X-Repo-Commit` is a path;
- `commit_up`: the file's `X-Repo-Commit` is `../../x/PWNED_dir`;
- `endless_body`: HEAD announces 1000 bytes, GET sends a chunked body that never ends;
- `slow_body`: HEAD announces 10 MB, GET drips a few bytes at a time, forever;
- `gzip_bomb`: HEAD announces 250 kB, GET sends 200 kB of gzip that inflates to 200 MB;
- `escape_reason`: a 403 whose reason phrase carries terminal escapes;
- `endless_pages`: every tree page links to a next one;
- `wide_pages`: the same with 1000 entries a page (entries run out before pages do);
- `huge_listing`: one tree page of 3,000,000 entries (about 250 MB, streamed);
- `listing_object` / `listing_big` / `listing_newline`: a tree listing that is an object,
  that has size "big", or whose path holds a newline and a forged line.

Every body that "never ends" stops when the client hangs up, or after 60 s.
"""

from __future__ import annotations

import functools
import hashlib
import json
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

COMMIT = hashlib.sha1(b"hostile").hexdigest()
ATTACKS = (
    "etag_up",
    "etag_abs",
    "commit_404",
    "commit_up",
    "endless_body",
    "slow_body",
    "gzip_bomb",
    "escape_reason",
    "endless_pages",
    "wide_pages",
    "huge_listing",
    "listing_object",
    "listing_big",
    "listing_newline",
)
FOREVER = 60.0  # seconds an endless body runs at most, if nobody hangs up


def tiny_model() -> bytes:
    """A valid ONNX model: y = relu(x), x float[1, 4], no external data."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model.SerializeToString()


class HostileHub:
    """Serves `attack` (one of ATTACKS) on a free port; `root` is where its paths point."""

    def __init__(self, attack: str, root: Path) -> None:
        assert attack in ATTACKS, attack
        self.attack = attack
        self.root = root
        self.model = tiny_model()
        self.requests = 0
        hub = self

        class Handler(_Handler):
            server_hub = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,))
        self._thread.daemon = True
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _Handler(BaseHTTPRequestHandler):
    server_hub: HostileHub
    protocol_version = "HTTP/1.1"  # for chunked bodies; every response closes the connection

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_GET(self) -> None:
        self._route(head=False)

    # ------------------------------------------------------------------ routing

    def _route(self, *, head: bool) -> None:
        self.close_connection = True
        hub = self.server_hub
        hub.requests += 1
        split = urlsplit(self.path)
        parts = split.path.strip("/").split("/")
        if split.path == "/api/agent-harnesses":
            self._send(200, json.dumps({"standardEnvVars": [], "harnesses": {}}).encode(), head)
        elif len(parts) >= 5 and parts[2] == "resolve":
            self._resolve("/".join(parts[4:]), head)
        elif parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "tree":
            cursor = int(parse_qs(split.query).get("cursor", ["0"])[0])
            self._tree(split.path, cursor, head)
        elif parts[:2] == ["api", "models"] and len(parts) >= 4:
            info = {"_id": "0" * 24, "id": "org/repo", "modelId": "org/repo", "sha": COMMIT}
            self._send(200, json.dumps({**info, "private": False, "siblings": []}).encode(), head)
        else:
            self._send(404, b'{"error": "Not Found"}', head)

    def _resolve(self, path: str, head: bool) -> None:
        attack = self.server_hub.attack
        root = self.server_hub.root
        body = self.server_hub.model
        headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{hashlib.sha1(body).hexdigest()}"'}
        if path != "m.onnx":
            extra = {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": COMMIT}
            if attack == "commit_404":
                extra["X-Repo-Commit"] = str(root / "PWNED_dir")
            self._send(404, b'{"error": "Entry not found"}', head, extra)
            return
        if attack == "etag_up":
            headers["ETag"] = '"../../../../x/PWNED"'
        elif attack == "etag_abs":
            headers["ETag"] = f'"{root / "x" / "PWNED_ABS"}"'
        elif attack == "commit_up":
            headers["X-Repo-Commit"] = "../../x/PWNED_dir"
        elif attack == "escape_reason":
            self.send_response(403, "\x1b[2J\x1b]0;owned\x07Forbidden")
            self.send_header("Content-Length", "0")
            self.send_header("Connection", "close")
            self.end_headers()
            return
        elif attack == "gzip_bomb":
            headers["ETag"] = f'"{"f" * 64}"'
            extra = {"Content-Length": "250000"} if head else {"Content-Encoding": "gzip"}
            self._send(200, b"" if head else _gzip_zeros(200), head, {**headers, **extra})
            return
        elif attack in ("endless_body", "slow_body"):
            size = 1000 if attack == "endless_body" else 10_000_000
            headers["ETag"] = f'"{"e" * 64}"'
            if head:
                self._send(200, b"", head, {**headers, "Content-Length": str(size)})
            else:
                fast = attack == "endless_body"
                self._chunked(200, headers, _endless(b"\0" * 65536 if fast else b"x", fast))
            return
        self._send(200, body, head, headers)

    def _tree(self, route: str, cursor: int, head: bool) -> None:
        attack = self.server_hub.attack
        entry = {"type": "file", "oid": "1" * 40, "size": 4, "path": "m.onnx"}
        if attack in ("endless_pages", "wide_pages"):
            link = f'<{self.server_hub.url}{route}?recursive=true&cursor={cursor + 1}>; rel="next"'
            width = 1000 if attack == "wide_pages" else 1
            page = [{**entry, "path": f"p{cursor}/{i}.onnx"} for i in range(width)]
            self._send(200, json.dumps(page).encode(), head, {"Link": link})
        elif attack == "huge_listing":
            self._chunked(200, {"Content-Type": "application/json"}, _huge_listing(3_000_000))
        elif attack == "listing_object":
            self._send(200, json.dumps({"files": [entry]}).encode(), head)
        elif attack == "listing_big":
            self._send(200, json.dumps([{**entry, "size": "big"}]).encode(), head)
        elif attack == "listing_newline":
            forged = {**entry, "path": "m.onnx\nerror: forged line\x1b[31m.onnx"}
            self._send(200, json.dumps([entry, forged]).encode(), head)
        else:
            self._send(200, json.dumps([entry]).encode(), head)

    # ------------------------------------------------------------------ responses

    def _send(self, status: int, body: bytes, head: bool, extra: dict | None = None) -> None:
        self.send_response(status)
        headers = {"Content-Type": "application/json", "Content-Length": str(len(body))}
        for key, value in {**headers, **(extra or {})}.items():
            self.send_header(key, value)
        self.send_header("Connection", "close")
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _chunked(self, status: int, headers: dict, chunks) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        try:
            for chunk in chunks:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client hung up: what the tests want


@functools.cache
def _gzip_zeros(megabytes: int) -> bytes:
    """gzip of `megabytes` MB of zero bytes (about 1 kB per MB)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = b"\0" * (1 << 20)
    return b"".join(packer.compress(zeros) for _ in range(megabytes)) + packer.flush()


def _endless(chunk: bytes, fast: bool):
    stop = time.monotonic() + FOREVER
    while time.monotonic() < stop:
        yield chunk
        if not fast:
            time.sleep(0.1)


def _huge_listing(count: int):
    yield b"["
    batch = 10_000
    for start in range(0, count, batch):
        entries = (
            json.dumps({"type": "file", "oid": "1" * 40, "size": 4, "path": f"d/f{i}.onnx"})
            for i in range(start, min(start + batch, count))
        )
        yield ("," if start else "").encode() + ",".join(entries).encode()
    yield b"]"
