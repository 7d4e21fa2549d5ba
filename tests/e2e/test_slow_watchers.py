"""A watcher whose client stops reading never delays others nor grows memory without bound;
when it reads again it is caught up from history, without gap or duplicate."""

from __future__ import annotations

import json
import socket
import time
import urllib.request

from tests.e2e.conftest import start


def open_watch(host_port: str, path: str, rcvbuf: int | None = None) -> socket.socket:
    host, port = host_port.split(":")
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.connect((host, int(port)))
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return s


def read_events(s: socket.socket, seconds: float) -> list[dict]:
    """Read for ``seconds`` and parse the chunked stream's JSON lines (chunk framing stripped)."""
    s.settimeout(0.2)
    data = b""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            chunk = s.recv(1 << 20)
        except TimeoutError:
            continue
        if not chunk:
            break
        data += chunk
    body = data.split(b"\r\n\r\n", 1)[1]
    out = b""
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0 or len(rest) < size:
            out += rest[:size]
            break
        out += rest[:size]
        body = rest[size + 2 :]
    return [
        json.loads(line) for line in out.split(b"\n") if line.strip().startswith(b"{") and line.strip().endswith(b"}")
    ]


def metric(url: str, name: str, outcome: str) -> float:
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and f'outcome="{outcome}"' in line and 'resource="pods"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_stalled_reader_is_caught_up_from_history_and_matches_a_fast_reader():
    proc = start(
        "serve",
        "--sim-objects",
        "60",
        "--sim-namespaces",
        "2",
        "--sim-churn",
        "400",
        "--max-watch-buffer-bytes",
        "65536",
    )
    try:
        rv = json.loads(urllib.request.urlopen(proc.url + "/api/v1/pods?limit=1", timeout=5).read())["metadata"][
            "resourceVersion"
        ]
        path = f"/api/v1/pods?watch=1&resourceVersion={rv}"
        slow = open_watch(proc.host_port, path, rcvbuf=4096)
        fast = open_watch(proc.host_port, path)
        fast_events = read_events(fast, 3.0)  # the slow one reads nothing meanwhile: its buffer overflows
        assert metric(proc.url, "watchcache_slow_watchers_total", "lagged") >= 1
        slow_events = read_events(slow, 4.0)
        assert metric(proc.url, "watchcache_slow_watchers_total", "caught_up") >= 1
        seen = [int(e["object"]["metadata"]["resourceVersion"]) for e in slow_events]
        assert seen == sorted(set(seen)), "rvs strictly increasing, no duplicate"
        # Over the range both saw, the slow reader got exactly what the fast reader got.
        last = min(seen[-1], int(fast_events[-1]["object"]["metadata"]["resourceVersion"]))
        key = lambda e: (e["type"], e["object"]["metadata"]["name"], e["object"]["metadata"]["resourceVersion"])  # noqa: E731
        want = [key(e) for e in fast_events if int(e["object"]["metadata"]["resourceVersion"]) <= last]
        got = [key(e) for e in slow_events if int(e["object"]["metadata"]["resourceVersion"]) <= last]
        assert len(want) > 500
        assert got == want
        slow.close()
        fast.close()
    finally:
        proc.stop()


def test_reader_stalled_past_the_history_window_gets_410():
    proc = start(
        "serve",
        "--sim-objects",
        "60",
        "--sim-churn",
        "400",
        "--max-watch-buffer-bytes",
        "65536",
        "--history-max-events",
        "200",
    )
    try:
        rv = json.loads(urllib.request.urlopen(proc.url + "/api/v1/pods?limit=1", timeout=5).read())["metadata"][
            "resourceVersion"
        ]
        slow = open_watch(proc.host_port, f"/api/v1/pods?watch=1&resourceVersion={rv}", rcvbuf=4096)
        time.sleep(3.0)  # 1,200 writes: far more than the 200 events of history
        events = read_events(slow, 3.0)
        assert events and events[-1]["type"] == "ERROR"
        assert events[-1]["object"]["code"] == 410 and events[-1]["object"]["reason"] == "Expired"
        assert metric(proc.url, "watchcache_slow_watchers_total", "expired") >= 1
        # ... and the server is still serving others
        assert urllib.request.urlopen(proc.url + "/readyz", timeout=5).status == 200
        slow.close()
    finally:
        proc.stop()
