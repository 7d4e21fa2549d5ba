"""The reference tier's client-go reflector (``harness.reflector``) on the rules the tier's verdicts rest on.

A relist the harness counts must be one client-go would make: after a 429 to a watch (its status
or an ERROR event) client-go backs off and watches again from the same resourceVersion. A scripted
server on a real socket answers each request in turn.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from harness import reflector
from harness.metaclient import Target
from harness.reflector import FLAVORS, Informer
from harness.waiting import wait_until


def configmap(name: str, rv: int) -> dict[str, Any]:
    meta = {"name": name, "namespace": "ns", "uid": f"u-{name}", "resourceVersion": str(rv)}
    return {"kind": "ConfigMap", "apiVersion": "v1", "metadata": meta}


def status(code: int, reason: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason,
            "message": "retry", "details": {"retryAfterSeconds": 1}}  # fmt: skip


class Script(BaseHTTPRequestHandler):
    """LIST: a at 5. Watches, in turn: an ERROR 429 event, a 429 status, then b ADDED at 6, and quiet."""

    watches: list[str] = []
    lists: list[str] = []

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        query = parse_qs(urlsplit(self.path).query)
        if "watch" not in query:
            self.lists.append(self.path)
            page = {"kind": "ConfigMapList", "apiVersion": "v1", "metadata": {"resourceVersion": "5"},
                    "items": [configmap("a", 5)]}  # fmt: skip
            self._send(200, json.dumps(page).encode())
            return
        self.watches.append(query["resourceVersion"][0])
        turn = len(self.watches)
        if turn == 1:
            self._send(200, json.dumps({"type": "ERROR", "object": status(429, "TooManyRequests")}).encode() + b"\n")
        elif turn == 2:
            self._send(429, json.dumps(status(429, "TooManyRequests")).encode())
        else:
            event = {"type": "ADDED", "object": configmap("b", 6)} if turn == 3 else None
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            if event is not None:
                self.wfile.write(json.dumps(event).encode() + b"\n")
                self.wfile.flush()
            threading.Event().wait(2.0)  # not a "very short" watch


@pytest.fixture
def server() -> Iterator[str]:
    Script.watches, Script.lists = [], []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Script)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_a_429_to_a_watch_is_retried_from_the_same_rv_not_relisted(
    server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reflector, "RETRY_AFTER_429", 0.05)
    informer = Informer(Target(server), "/api/v1/configmaps", "ConfigMap", "v1", FLAVORS["typed-json"], watch_seconds=3)
    thread = threading.Thread(target=informer.run, daemon=True)
    thread.start()
    try:
        assert wait_until(lambda: "ns/b" in informer.store, 10), (informer, Script.watches, informer.errors)
    finally:
        informer.halt()
        thread.join(10)
    assert Script.watches[:3] == ["5", "5", "5"], Script.watches  # each retry from the list's rv
    assert (informer.lists, len(Script.lists), informer.retried, informer.expired) == (1, 1, 2, 0), informer
    assert informer.errors == [] and sorted(informer.store) == ["ns/a", "ns/b"]
