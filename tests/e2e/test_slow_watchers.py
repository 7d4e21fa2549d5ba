"""A watcher whose client stops reading never delays others nor grows memory without bound;
when it reads again it is caught up from history, without gap or duplicate."""

from __future__ import annotations

import functools
import json
import socket
import time
import urllib.request
from collections.abc import Callable

from harness.processes import start
from harness.waiting import wait_until


def open_watch(host_port: str, path: str, rcvbuf: int | None = None) -> socket.socket:
    host, port = host_port.split(":")
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.connect((host, int(port)))
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return s


class ChunkedEvents:
    """A raw watch socket's events, parsed as they arrive (chunk framing stripped)."""

    def __init__(self, s: socket.socket) -> None:
        self.s = s
        self.raw = b""
        self.body = b""
        self.events: list[dict] = []
        self.ended = False

    def _parse(self) -> None:
        if not self.body and b"\r\n\r\n" in self.raw:
            self.raw = self.raw.split(b"\r\n\r\n", 1)[1]
            self.body = b" "  # headers seen
        if not self.body:
            return
        data = b""
        while True:
            size_line, sep, rest = self.raw.partition(b"\r\n")
            if not sep:
                break
            size = int(size_line, 16)
            if size == 0:
                self.ended = True
                break
            if len(rest) < size + 2:
                break
            data += rest[:size]
            self.raw = rest[size + 2 :]
        lines = (self.body[1:] + data).split(b"\n")
        self.body = b" " + lines.pop()
        self.events += [json.loads(line) for line in lines if line.strip()]

    def read_until(self, done: Callable[[list[dict]], bool], timeout: float = 30.0) -> list[dict]:
        """Read until ``done(events)`` holds (checked at least every 0.2 s) or the stream ends."""
        self.s.settimeout(0.2)
        deadline = time.monotonic() + timeout
        while not done(self.events) and not self.ended:
            assert time.monotonic() < deadline, f"not done within {timeout}s; {len(self.events)} events"
            try:
                chunk = self.s.recv(1 << 20)
            except TimeoutError:
                continue
            if not chunk:
                self.ended = True
                break
            self.raw += chunk
            self._parse()
        return self.events


def slow_outcomes(url: str) -> tuple[float, float]:
    """How often pods watchers lagged, and caught up."""
    return metric(url, "watchcache_slow_watchers_total", "lagged"), metric(
        url, "watchcache_slow_watchers_total", "caught_up"
    )


def wait_until_expired_in_waiting(url: str) -> None:
    """Until the lagging pods watcher can only be ended with 410 once it reads again.

    While the kernel's buffers still take bytes, a watcher lags and catches up in turns; once it
    lags and the history has moved past the cache's rv of that moment with no catch-up in between,
    what it missed is gone."""

    def past(lagged_at: int, caught_up: float) -> bool:
        return pods_cache(url)["oldest_rv"] > lagged_at or slow_outcomes(url)[1] > caught_up

    while True:
        wait_until(lambda: slow_outcomes(url)[0] > slow_outcomes(url)[1])  # lagging now
        caught_up = slow_outcomes(url)[1]
        lagged_at = pods_cache(url)["rv"]  # it took no event after this rv
        wait_until(functools.partial(past, lagged_at, caught_up))
        if slow_outcomes(url)[1] == caught_up:
            return


def pods_cache(url: str) -> dict:
    return json.loads(urllib.request.urlopen(url + "/debug/cache", timeout=5).read())["resources"]["pods"]


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
        "--simulated",
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
        fast = ChunkedEvents(open_watch(proc.host_port, path))
        # The slow one reads nothing meanwhile: its buffer overflows, it lags.
        fast_events = fast.read_until(
            lambda events: len(events) > 600 and metric(proc.url, "watchcache_slow_watchers_total", "lagged") >= 1
        )
        fast_rv = int(fast_events[-1]["object"]["metadata"]["resourceVersion"])
        slow_events = ChunkedEvents(slow).read_until(
            lambda events: bool(events) and int(events[-1]["object"]["metadata"]["resourceVersion"]) >= fast_rv
        )
        assert metric(proc.url, "watchcache_slow_watchers_total", "caught_up") >= 1
        seen = [int(e["object"]["metadata"]["resourceVersion"]) for e in slow_events]
        assert seen == sorted(set(seen)), "rvs strictly increasing, no duplicate"
        # Over the range both saw, the slow reader got exactly what the fast reader got.
        last = min(seen[-1], fast_rv)
        key = lambda e: (e["type"], e["object"]["metadata"]["name"], e["object"]["metadata"]["resourceVersion"])  # noqa: E731
        want = [key(e) for e in fast_events if int(e["object"]["metadata"]["resourceVersion"]) <= last]
        got = [key(e) for e in slow_events if int(e["object"]["metadata"]["resourceVersion"]) <= last]
        assert len(want) > 500
        assert got == want
        slow.close()
        fast.s.close()
    finally:
        proc.stop()


def test_reader_stalled_past_the_history_window_gets_410():
    proc = start(
        "serve",
        "--simulated",
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
        wait_until_expired_in_waiting(proc.url)
        events = ChunkedEvents(slow).read_until(lambda events: bool(events) and events[-1]["type"] == "ERROR")
        assert events and events[-1]["type"] == "ERROR"
        assert events[-1]["object"]["code"] == 410 and events[-1]["object"]["reason"] == "Expired"
        assert metric(proc.url, "watchcache_slow_watchers_total", "expired") >= 1
        # ... and the server is still serving others
        assert urllib.request.urlopen(proc.url + "/readyz", timeout=5).status == 200
        slow.close()
    finally:
        proc.stop()


def scalar(url: str, name: str) -> float:
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + " "))


def test_many_stalled_readers_are_held_to_the_process_budget_and_caught_up():
    # 40 watches whose clients do not read, under a 1 MiB budget for all watchers' unsent bytes
    # (each watcher's own cap is the default 16 MiB, never reached here).
    proc = start(
        "serve", "--simulated", "--sim-objects", "60", "--sim-namespaces", "2", "--sim-churn", "400",
        "--max-watch-buffer-total-bytes", str(1 << 20),
    )  # fmt: skip
    try:
        rv = json.loads(urllib.request.urlopen(proc.url + "/api/v1/pods?limit=1", timeout=5).read())["metadata"][
            "resourceVersion"
        ]
        path = f"/api/v1/pods?watch=1&resourceVersion={rv}"
        stalled = [open_watch(proc.host_port, path, rcvbuf=4096) for _ in range(40)]
        fast = ChunkedEvents(open_watch(proc.host_port, path))
        budget_bytes: list[float] = []

        def all_sent_to_catch_up() -> bool:
            budget_bytes.append(scalar(proc.url, "watchcache_watch_budget_bytes"))
            return scalar(proc.url, "watchcache_watch_budget_lagged_total") >= 40

        # The fast reader reads meanwhile; the stalled ones fall behind until the budget lags them all.
        fast_events = fast.read_until(lambda events: len(events) > 600 and all_sent_to_catch_up())
        assert max(budget_bytes) <= 1 << 20
        # Lagged by the budget, not by their own cap: every lag is a budget lag.
        assert metric(proc.url, "watchcache_slow_watchers_total", "lagged") == scalar(
            proc.url, "watchcache_watch_budget_lagged_total"
        )
        # A stalled reader that reads again is caught up from history: what the fast one got.
        fast_rv = int(fast_events[-1]["object"]["metadata"]["resourceVersion"])
        slow_events = ChunkedEvents(stalled[0]).read_until(
            lambda events: bool(events) and int(events[-1]["object"]["metadata"]["resourceVersion"]) >= fast_rv
        )
        seen = [int(e["object"]["metadata"]["resourceVersion"]) for e in slow_events]
        assert seen == sorted(set(seen)), "rvs strictly increasing, no duplicate"
        key = lambda e: (e["type"], e["object"]["metadata"]["name"], e["object"]["metadata"]["resourceVersion"])  # noqa: E731
        want = [key(e) for e in fast_events if int(e["object"]["metadata"]["resourceVersion"]) <= fast_rv]
        assert [key(e) for e in slow_events if int(e["object"]["metadata"]["resourceVersion"]) <= fast_rv] == want
        for s in [*stalled, fast.s]:
            s.close()
    finally:
        proc.stop()
