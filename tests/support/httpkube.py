"""Plain-HTTP helpers for the e2e tests: one request, and a watch stream read line by line.

Every socket operation has a timeout, so a server that stops answering fails the test
instead of hanging it.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from typing import Any
from urllib.parse import urlencode

TIMEOUT = 5.0


class HttpResult:
    def __init__(self, status: int, headers: http.client.HTTPMessage, body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)

    def __repr__(self) -> str:
        return f"HttpResult({self.status}, {self.body[:300]!r})"


def _split(host_port: str) -> tuple[str, int]:
    host, _, port = host_port.removeprefix("http://").rpartition(":")
    return host, int(port)


def path_with(path: str, **query: Any) -> str:
    """``path?query`` with Python values (``True`` -> ``true``); ``None`` values are left out."""
    params = {k: ("true" if v is True else "false" if v is False else v) for k, v in query.items() if v is not None}
    return f"{path}?{urlencode(params)}" if params else path


def request(
    url: str,
    method: str,
    path: str,
    body: Any = None,
    *,
    content_type: str = "application/json",
    timeout: float = TIMEOUT,
) -> HttpResult:
    conn = http.client.HTTPConnection(*_split(url), timeout=timeout)
    try:
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            headers["Content-Type"] = content_type
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        return HttpResult(resp.status, resp.headers, resp.read())
    finally:
        conn.close()


def get(url: str, path: str, **query: Any) -> HttpResult:
    return request(url, "GET", path_with(path, **query))


def get_ok(url: str, path: str, **query: Any) -> Any:
    res = get(url, path, **query)
    assert res.status == 200, res
    return res.json()


def key_of(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta["name"]


def rv_of(obj: dict[str, Any]) -> int:
    return int(obj["metadata"]["resourceVersion"])


class WatchStream:
    """A watch response, read one JSON line at a time with a per-read deadline."""

    def __init__(self, url: str, path: str, *, timeout: float = TIMEOUT) -> None:
        self.conn = http.client.HTTPConnection(*_split(url), timeout=timeout)
        self.conn.connect()
        # Kept: http.client drops conn.sock on a "Connection: close" response, the stream lives on.
        self.sock: socket.socket = self.conn.sock
        self.conn.request("GET", path, headers={"Accept": "application/json"})
        self.resp = self.conn.getresponse()
        self.status = self.resp.status

    def next(self, timeout: float = TIMEOUT) -> dict[str, Any] | None:
        """The next event, or None when the server ended the stream; socket.timeout if none came."""
        self.sock.settimeout(max(timeout, 0.01))
        line = self.resp.readline()
        if not line:
            return None
        assert line.endswith(b"\n"), line
        return json.loads(line)

    def until(self, stop: Any, timeout: float = TIMEOUT) -> list[dict[str, Any]]:
        """Read events until ``stop(event)`` is true (that event included), within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        events: list[dict[str, Any]] = []
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no matching event within {timeout}s; got {summarize(events)}")
            try:
                event = self.next(left)
            except TimeoutError:
                raise TimeoutError(f"no matching event within {timeout}s; got {summarize(events)}") from None
            if event is None:
                raise AssertionError(f"watch ended before the expected event; got {summarize(events)}")
            events.append(event)
            if stop(event):
                return events
            if event.get("type") == "ERROR":
                raise AssertionError(f"watch ERROR event: {event.get('object')}")

    def close(self) -> None:
        self.resp.close()
        self.conn.close()
        self.sock.close()

    def __enter__(self) -> WatchStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def summarize(events: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    out = []
    for e in events:
        obj = e.get("object") or {}
        meta = obj.get("metadata") or {}
        out.append((e.get("type", "?"), meta.get("name", obj.get("reason", "")), meta.get("resourceVersion", "")))
    return out


def configmap(name: str, namespace: str, **data: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "data": dict(data),
    }


def pod(name: str, namespace: str, node: str = "node-0", labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {"app": "e2e"}},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "registry.example.com/e2e:v1"}]},
    }


def write(url: str, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
    res = request(url, method, path, body, content_type=content_type)
    assert res.status in (200, 201), res
    return res.json()


def cm_path(ns: str, name: str = "") -> str:
    return f"/api/v1/namespaces/{ns}/configmaps" + (f"/{name}" if name else "")


def pipelined(url: str, requests: list[tuple[str, str, Any, str]], timeout: float = 5.0) -> list[tuple[int, Any]]:
    """Send ``(method, path, body, content type)`` requests in one write on one connection (HTTP/1.1
    pipelining), so the server handles them back to back; returns ``(status, JSON body)`` in order."""
    host, _, port = url.removeprefix("http://").rpartition(":")
    wire = b""
    for method, path, body, content_type in requests:
        data = b"" if body is None else json.dumps(body).encode()
        wire += (
            f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAccept: application/json\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(data)}\r\n\r\n"
        ).encode() + data
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(wire)
        reader = sock.makefile("rb")
        out = []
        for _ in requests:
            status = int(reader.readline().split()[1])
            headers: dict[str, str] = {}
            while (line := reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            if headers.get("transfer-encoding") == "chunked":
                body_bytes = b""
                while size := int(reader.readline().split(b";")[0], 16):
                    body_bytes += reader.read(size)
                    reader.readline()
                reader.readline()
            else:
                body_bytes = reader.read(int(headers.get("content-length", "0")))
            out.append((status, json.loads(body_bytes) if body_bytes else None))
        return out


def call(url: str, path: str, token: str | None, method: str = "GET", body: dict | None = None) -> tuple[int, dict]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    headers = {"Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    try:
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        status = resp.status
        if "watch=1" in path and status == 200:
            first = resp.readline()  # one event is enough: the watch was admitted
            return status, json.loads(first) if first.strip() else {}
        return status, json.loads(resp.read() or b"{}")
    finally:
        conn.close()


def shard_views(url: str, token: str, tries: int = 300) -> dict[int, dict]:
    """/debug/shards of every worker (fresh connections: SO_REUSEPORT spreads them)."""
    seen: dict[int, dict] = {}
    for _ in range(tries):
        status, body = call(url, "/debug/shards", token)
        assert status == 200, body
        seen[body["worker"]] = body
        if len(seen) == body["workers"]:
            return seen
    raise AssertionError(f"only reached workers {sorted(seen)}")
