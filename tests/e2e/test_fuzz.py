"""Hostile input against a running server: generated requests must get a Status (4xx), never a 5xx,
a traceback, a hang or unbounded memory. Short in CI; WATCHCACHE_FUZZ_LONG=1 for the long run."""

from __future__ import annotations

import http.client
import json
import os
import random
import socket
import subprocess
import time
from urllib.parse import quote

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.processes import Proc, rss_kb, start

LONG = os.environ.get("WATCHCACHE_FUZZ_LONG") == "1"
STRUCTURED = 10_000 if LONG else 1_500
RAW = 20_000 if LONG else 10_000

SEGMENTS = [
    "api",
    "apis",
    "v1",
    "apps",
    "namespaces",
    "ns-0",
    "default",
    "pods",
    "configmaps",
    "nodes",
    "watch",
    "status",
    "log",
    "..",
    ".",
    "%2F",
    "%2e%2e",
    "%00",
    "x" * 300,
    "",
    "deployments",
    "exec",
    "portforward",
]
BASES = [
    "/api/v1/pods",
    "/api/v1/namespaces/ns-0/pods",
    "/api/v1/namespaces/ns-1/configmaps",
    "/apis/apps/v1/deployments",
    "/api/v1/nodes",
    "/api/v1/namespaces/ns-0/pods/x",
    "/api",
    "",
    "",
    "",
]
PARAMS = [
    "limit",
    "continue",
    "resourceVersion",
    "resourceVersionMatch",
    "labelSelector",
    "fieldSelector",
    "watch",
    "timeoutSeconds",
    "allowWatchBookmarks",
    "sendInitialEvents",
    "bogus",
]
VALUES = st.one_of(
    st.sampled_from(
        [
            "0",
            "-1",
            "1",
            "abc",
            "99999999999999999999999",
            "Exact",
            "NotOlderThan",
            "true",
            "false",
            "a=b",
            "a in (b",
            "metadata.name=x",
            "spec.bogus=1",
            "!a",
            "",
            "%00",
            "1e9",
        ]
    ),
    st.text(max_size=40),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
)


class Client:
    """One keep-alive connection, reopened when the server closes it (as it may for bad input)."""

    def __init__(self, proc: Proc) -> None:
        self.host, port = proc.host_port.split(":")
        self.port = int(port)
        self.conn: http.client.HTTPConnection | None = None
        self.statuses: dict[int, int] = {}

    def send(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            self.conn.request(method, path, body=body or None, headers=headers)
            resp = self.conn.getresponse()
            streaming = resp.getheader("Transfer-Encoding") == "chunked"
            # A stream (a watch) is not read to its end: its head is the answer we judge.
            data = b"" if streaming or method == "HEAD" else resp.read()
            if streaming or resp.will_close:
                self.conn.close()
                self.conn = None
            self.statuses[resp.status] = self.statuses.get(resp.status, 0) + 1
            return resp.status, data
        except (http.client.HTTPException, OSError):
            self.conn.close()
            self.conn = None
            return 0, b""


def sockets_of(port: int) -> str:
    """Both ends of every TCP connection to ``port`` (states, queues), to tell which side holds a
    connection when the server's gauge says one is left."""
    try:
        out = subprocess.run(
            ["ss", "-tnoi", "state", "all", f"( sport = :{port} or dport = :{port} )"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as e:
        return f"(ss: {e})"
    return out.stdout[-4000:]


def assert_no_server_error(status: int, body: bytes, what: str) -> None:
    assert status < 500 or status in (503, 504), f"{status} for {what}: {body[:300]!r}"
    if status >= 400 and body[:1] == b"{":
        assert json.loads(body)["kind"] == "Status", (what, body[:200])


def test_generated_requests_get_status_errors_never_5xx_and_the_server_survives():
    proc = start("serve", "--simulated", "--sim-objects", "20", "--sim-namespaces", "2", "--max-watchers", "50")
    try:
        pid = proc.process.pid
        client = Client(proc)
        rss_before = rss_kb(pid)
        attempts: list[int] = []

        @settings(max_examples=STRUCTURED, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(
            method=st.sampled_from(["GET", "GET", "GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]),
            base=st.sampled_from(BASES),
            segments=st.lists(st.sampled_from(SEGMENTS), max_size=7),
            raw_segment=st.text(max_size=20),
            params=st.dictionaries(st.sampled_from(PARAMS), VALUES, max_size=5),
            accept=st.sampled_from(["application/json", "application/vnd.kubernetes.protobuf", "*/*", "text/html", ""]),
            content_type=st.sampled_from(
                ["application/json", "application/merge-patch+json", "application/json-patch+json", "text/plain", ""]
            ),
            body=st.one_of(st.binary(max_size=200), st.just(b'{"metadata":{"name":"fz"}}'), st.just(b"[]")),
            # Connection upgrades (no Sec-WebSocket-Key: never switched, so http.client can read the answer).
            upgrade=st.sampled_from(["", "", "", "websocket", "SPDY/3.1", "h2c"]),
        )
        def one(method, base, segments, raw_segment, params, accept, content_type, body, upgrade):
            attempts.append(1)
            path = base or "/" + "/".join([*segments, quote(raw_segment, safe="")])
            query = "&".join(f"{k}={quote(v, safe='')}" for k, v in params.items())
            if params.get("watch") not in (None, "0", "false", ""):
                query += "&timeoutSeconds=1"
            headers = {k: v for k, v in (("Accept", accept), ("Content-Type", content_type)) if v}
            if upgrade:
                headers.update({"Connection": "Upgrade", "Upgrade": upgrade})
            status, data = client.send(method, path + ("?" + query if query else ""), headers, body)
            assert_no_server_error(status, data, f"{method} {path}?{query}")

        one()

        # Raw bytes: request lines and headers mutated at random, on fresh connections.
        rng = random.Random(7)
        base = b"GET /api/v1/namespaces/ns-0/pods?limit=5 HTTP/1.1\r\nHost: x\r\nAccept: application/json\r\n\r\n"
        extras = [
            b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
            b"Content-Length: 1\r\nContent-Length: 2\r\n",
            b"X: " + b"a" * 70_000 + b"\r\n",
            b"Transfer-Encoding: gzip\r\n",
            b"\x00\xff\r\n",
            b"Connection: Upgrade\r\nUpgrade: websocket\r\n",
        ]
        host, port = proc.host_port.split(":")
        for i in range(RAW):
            data = bytearray(base)
            for _ in range(rng.randint(1, 4)):
                pos = rng.randrange(len(data))
                choice = rng.random()
                if choice < 0.4:
                    data[pos] = rng.randrange(256)
                elif choice < 0.7:
                    del data[pos : pos + rng.randint(1, 5)]
                else:
                    data[pos:pos] = rng.choice(extras) if rng.random() < 0.2 else bytes([rng.randrange(256)])
            with socket.create_connection((host, int(port)), timeout=5) as s:
                answer = b""
                try:
                    # The server may answer 400 and close before the whole request is sent: that is fine.
                    s.sendall(bytes(data))
                    s.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                try:
                    while chunk := s.recv(65536):
                        answer += chunk
                except OSError:
                    pass
            if answer.startswith(b"HTTP/1."):
                code = int(answer.split(b" ", 2)[1])
                assert code < 500 or code in (503, 504), (i, bytes(data)[:200], answer[:300])

        # Still serving, no traceback, memory bounded.
        check = http.client.HTTPConnection(host, int(port), timeout=5)
        check.request("GET", "/readyz")
        assert check.getresponse().status == 200
        time.sleep(0.3)
        log = "".join(proc.log)
        assert "Traceback" not in log, log[-3000:]
        rss_after = rss_kb(pid)
        assert rss_after < rss_before + 200_000, (rss_before, rss_after)  # < 200 MB of growth
        assert len(attempts) >= STRUCTURED * 0.9, len(attempts)
        assert sum(client.statuses.values()) >= len(attempts) * 0.8, client.statuses
        assert client.statuses.get(200, 0) > 50, client.statuses  # the fuzz reaches real reads too
        # Every byte and connection the fuzz held is released (watches it left end within 1 s):
        # only this scrape's own connection and head remain.
        if client.conn is not None:
            client.conn.close()
        check.close()
        deadline = time.monotonic() + 10
        while True:
            scrape = http.client.HTTPConnection(host, int(port), timeout=5)
            scrape.request("GET", "/metrics")
            text = scrape.getresponse().read().decode()
            scrape.close()
            gauges = {
                line.split(" ")[0]: float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith(("watchcache_http_connections ", "watchcache_http_request_buffer_bytes "))
            }
            if gauges["watchcache_http_connections"] == 1 and gauges["watchcache_http_request_buffer_bytes"] < 200:
                break
            assert time.monotonic() < deadline, (gauges, sockets_of(int(port)))
            time.sleep(0.2)
    finally:
        proc.stop()
