"""report.html from a hostile manifest (issue 36): a build folder travels, and its manifest
can say anything. Opened in headless Chromium (Debian's package), the page must load
nothing (a local HTTP server sees no request), show every FAIL cell, and not say every gate
passed, whatever markup the manifest's values carry."""

from __future__ import annotations

import http.server
import json
import threading
import time
from pathlib import Path

import pytest

from tests.chromium import INSTALL, Chromium, chromium_path
from tests.conftest import cli, make_mlp_onnx

HIDE = "<style>.fail,td:has(.fail),.verdict{display:none!important}</style>"


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[str]

    def do_GET(self) -> None:
        self.seen.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(b"<p>every gate passed</p>")

    def log_message(self, *args: object) -> None:
        pass


def _hostile(manifest: dict, port: int) -> int:
    """Plant markup in the values a page shows; mark one gate failed (a manifest that
    calls its component passed beside it). Returns the number of failed gate rows."""
    refresh = f'<meta http-equiv=refresh content="0;url=http://127.0.0.1:{port}/pwned">'
    failed = 0
    for record in manifest["components"].values():
        for step in record["steps"]:
            metrics = step.get("metrics") or {}
            if step["pass"] != "verify":
                continue
            metrics["placement"] = {
                "nodes": {"CPUExecutionProvider": refresh},
                "partitions": {"CPUExecutionProvider": HIDE},
                "fallback_nodes": [{"name": refresh, "op_type": HIDE}],
            }
            gate = {"output": HIDE, "metric": refresh, "value": 1.0, "threshold": 40.0,
                    "comparison": ">=", "margin": -39.0, "passed": False}  # fmt: skip
            metrics["gates"] = [*(metrics.get("gates") or []), gate]
            metrics["passed"] = True
            metrics["data_source"] = HIDE
            failed += sum(1 for g in metrics["gates"] if not g["passed"])
    manifest.setdefault("versions", {})["x" + HIDE] = refresh
    return failed


def test_a_hostile_manifest_cannot_load_restyle_or_pass(tmp_path: Path) -> None:
    if chromium_path() is None:
        pytest.fail(f"headless Chromium is needed for this test: {INSTALL}")
    model = make_mlp_onnx(tmp_path / "mlp.onnx")
    done = cli("build", "--onnx", model, "--device", "cpu", "--precision", "fp32",
               "-o", tmp_path / "o", "--json")  # fmt: skip
    assert done.exit_code == 0, done.stderr
    folder = next(p.parent for p in (tmp_path / "o").rglob("manifest.json"))
    _Recorder.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
        failed = _hostile(manifest, server.server_address[1])
        assert failed >= 1
        (folder / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
        done = cli("report", folder)
        assert done.exit_code == 0, done.stderr
        browser = Chromium(tmp_path / "profile")
        try:
            browser.open_page()
            page = (folder / "report.html").as_uri()
            browser.navigate(page)
            time.sleep(1.5)  # a 0 s refresh would have left by now
            state = json.loads(
                browser.evaluate(
                    "JSON.stringify({url: location.href, text: document.body.innerText,"
                    " styles: document.querySelectorAll('style').length,"
                    " metas: [...document.querySelectorAll('meta')].map(m => m.httpEquiv),"
                    " fails: [...document.querySelectorAll('td .fail')].map(e => {"
                    "  const s = getComputedStyle(e), r = e.getBoundingClientRect();"
                    "  return [e.textContent, s.display, s.visibility,"
                    "          r.width > 0 && r.height > 0, s.color];"
                    " })})"
                )
            )
            events = list(browser.events)
        finally:
            browser.close()
    finally:
        server.shutdown()
        server.server_close()
    assert _Recorder.seen == [], _Recorder.seen  # nothing reached the local server
    requests = [e["params"]["request"]["url"] for e in events
                if e["method"] == "Network.requestWillBeSent"]  # fmt: skip
    assert all(u.startswith(("file:", "data:")) for u in requests), requests
    assert state["url"] == page
    assert state["styles"] == 1 and "refresh" not in [m.lower() for m in state["metas"]]
    # every failed gate's cell is there and visible; the banner does not say it passed
    assert len(state["fails"]) == failed, state["fails"]
    # the page's own style applies (its CSP hash is right): FAIL in its red, nothing refused
    red = "rgb(179, 20, 27)"
    assert all(f == ["FAIL", "inline", "visible", True, red] for f in state["fails"]), state
    logged = [e["params"]["entry"] for e in events if e["method"] == "Log.entryAdded"]
    errors = [entry for entry in logged if entry["level"] == "error"]
    assert not errors, errors
    assert "every gate passed" not in state["text"] and "a gate FAILED" in state["text"]
    assert HIDE in state["text"]  # the planted markup shows as text
