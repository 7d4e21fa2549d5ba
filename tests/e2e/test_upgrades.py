"""Connection upgrades through `watchcache serve` in front of a fake upstream on a real socket
(tests/support/upgrade_upstream.py): WebSocket and SPDY tunnels, flow control, half-close, refusals,
limits and metrics."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from harness.processes import Proc, rss_kb, start
from tests.support.httpkube import get
from tests.support.metrics import scrape, total
from tests.support.upgrade_upstream import FakeUpstream
from tests.support.upgrading import WebSocket, raw_upgrade

MB = 1 << 20


@pytest.fixture
def fake() -> Iterator[FakeUpstream]:
    upstream = FakeUpstream()
    yield upstream
    upstream.stop()


def proxy(fake: FakeUpstream, *args: str) -> Proc:
    return start("serve", "--upstream", fake.url, "--workers", "1", *args)


@pytest.fixture
def front(fake: FakeUpstream) -> Iterator[Proc]:
    proc = proxy(fake)
    yield proc
    proc.stop()


def wait_for(condition, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def metric(proc: Proc, name: str, **labels: str) -> float:
    return total(scrape(proc.url)[1], name, **labels)


def test_spdy_tunnel_relays_both_ways_with_early_bytes_and_the_clients_identity(fake, front) -> None:
    token = {"Authorization": "Bearer client-token", "X-Stream-Protocol-Version": "v4.channel.k8s.io"}
    # Bytes sent right behind the request head (httptools stops there) must reach the upstream.
    up = raw_upgrade(front.url, "/spdy/echo?greet=1", headers=token, early=b"early:")
    assert up.head.status == 101
    assert up.head.headers["upgrade"] == "SPDY/3.1" and up.head.headers["connection"] == "Upgrade"
    assert up.recv_exactly(5) == b"HELLO"  # sent by the upstream in the same packet as its 101
    assert up.recv_exactly(6) == b"early:"
    for size in (1, 1000, 300_000):
        payload = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
        up.sock.sendall(payload)
        assert up.recv_exactly(len(payload)) == payload
    up.close()
    head = fake.upgrade_heads()[-1]
    assert head.method == "POST" and head.target == "/spdy/echo?greet=1"
    # The client's credentials and headers as given; this hop's own replaced.
    assert head.get("authorization") == "Bearer client-token"
    assert head.get("x-stream-protocol-version") == "v4.channel.k8s.io"
    assert head.get("x-forwarded-for") == "127.0.0.1"
    assert head.get("connection") == "Upgrade" and head.get("upgrade") == "SPDY/3.1"
    assert head.get("host") == f"127.0.0.1:{fake.port}"
    # Counted as a request with code 101, but as long-running: no latency observation.
    wait_for(lambda: metric(front, "apiserver_request_total", verb="POST", code="101") == 1)
    assert metric(front, "apiserver_request_duration_seconds_count", verb="POST") == 0


def test_half_close_is_passed_on_and_the_answer_still_arrives(fake, front) -> None:
    up = raw_upgrade(front.url, "/spdy/echo")
    assert up.head.status == 101
    up.sock.sendall(b"abc")
    assert up.recv_exactly(3) == b"abc"
    up.sock.shutdown(socket.SHUT_WR)  # kubectl's stdin ends; the command's output has not
    assert up.recv_until_closed() == b"EOF:3"
    up.close()


def test_websocket_tunnel_negotiates_end_to_end_and_moves_large_messages(fake, front) -> None:
    ws = WebSocket(
        front.url,
        "/ws/echo",
        subprotocols=["v5.channel.k8s.io", "v4.channel.k8s.io"],
        headers={"Authorization": "Bearer ws-token"},
    )
    assert ws.accepted and ws.subprotocol == "v5.channel.k8s.io"  # Sec-WebSocket-Accept checked by wsproto
    ws.send(b"\x00hello")
    assert ws.receive() == b"\x00hello"
    big = bytes(range(256)) * (4 * MB // 256)
    ws.send(big)
    assert ws.receive(timeout=30) == big
    ws.send("text")
    assert ws.receive() == "text"
    ws.close()
    head = fake.upgrade_heads()[-1]
    assert head.get("authorization") == "Bearer ws-token"
    assert head.get("sec-websocket-protocol") == "v5.channel.k8s.io, v4.channel.k8s.io"


def test_upstream_refusal_reaches_the_client_unchanged(fake, front) -> None:
    up = raw_upgrade(front.url, "/forbidden", "websocket", method="GET", headers={"Sec-WebSocket-Key": "x"})
    assert up.head.status == 403
    assert up.head.headers["content-type"] == "application/json"
    assert up.head.headers["audit-id"] == "fake"
    assert up.head.headers["connection"] == "close"
    status = up.json()
    assert status["kind"] == "Status" and status["reason"] == "Forbidden"
    assert 'User "nobody"' in status["message"]
    assert up.recv_until_closed() == b""  # and the connection ends there
    up.close()
    wait_for(lambda: metric(front, "watchcache_tunnels_total", protocol="websocket", outcome="refused") == 1)


def test_an_upstream_304_without_content_type_comes_back_without_one(fake, front) -> None:
    # As pass-through answers it (passthrough.bodyless_type): an HTTP cache merges a 304's headers
    # into the answer it kept, so a made-up application/json would relabel that answer.
    up = raw_upgrade(front.url, "/not-modified", "websocket", method="GET", headers={"Sec-WebSocket-Key": "x"})
    assert up.head.status == 304
    assert "content-type" not in up.head.headers
    assert up.head.headers["etag"] == '"x"' and up.head.headers["cache-control"] == "public"
    up.close()


def test_a_slow_client_holds_the_upstream_back_and_memory_stays_bounded(fake, front) -> None:
    pid = front.process.pid
    before = rss_kb(pid)
    size = 256 * MB
    up = raw_upgrade(front.url, f"/spdy/flood?bytes={size}")
    assert up.head.status == 101
    time.sleep(2.0)  # the client reads nothing: the upstream must be paused, not buffered
    stalled = fake.flood_written
    assert stalled < 48 * MB, f"upstream wrote {stalled / MB:.0f} MB into a client that reads nothing"
    assert rss_kb(pid) - before < 40_000
    received = len(up.buffered)
    up.buffered.clear()
    peak = 0
    up.sock.settimeout(30)
    while received < size:
        data = up.sock.recv(1 << 20)
        assert data, f"closed after {received} bytes"
        received += len(data)
        if received % (32 * MB) < len(data):
            peak = max(peak, rss_kb(pid) - before)
    assert received == size and fake.flood_written == size
    assert peak < 40_000, f"proxy RSS grew {peak} KB while relaying {size // MB} MB"
    up.close()
    wait_for(lambda: metric(front, "watchcache_tunnel_bytes_total", direction="to_client") >= size)


def test_an_upstream_that_does_not_read_holds_the_client_back(fake, front) -> None:
    pid = front.process.pid
    before = rss_kb(pid)
    up = raw_upgrade(front.url, "/spdy/sink")
    assert up.head.status == 101
    up.sock.setblocking(False)
    sent = 0
    chunk = b"z" * 65536
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        try:
            sent += up.sock.send(chunk)
        except BlockingIOError:
            time.sleep(0.01)
    assert sent < 48 * MB, f"the client pushed {sent / MB:.0f} MB into an upstream that reads nothing"
    assert rss_kb(pid) - before < 40_000
    up.close()


def test_an_unreachable_upstream_is_503(fake) -> None:
    fake.stop()
    proc = proxy(fake)
    try:
        up = raw_upgrade(proc.url, "/spdy/echo")
        assert up.head.status == 503 and up.json()["reason"] == "ServiceUnavailable"
        up.close()
    finally:
        proc.stop()


def test_idle_and_total_limits_close_tunnels(fake) -> None:
    proc = proxy(fake, "--tunnel-idle-timeout", "1", "--tunnel-max-duration", "4")
    try:
        # Traffic keeps a tunnel open past the idle timeout; silence closes it.
        up = raw_upgrade(proc.url, "/spdy/echo")
        started = time.monotonic()
        for _ in range(6):
            up.sock.sendall(b"k")
            assert up.recv_exactly(1) == b"k"
            time.sleep(0.3)
        assert up.recv_until_closed(timeout=5) == b""
        assert 2.0 < time.monotonic() - started < 4.0
        up.close()
        wait_for(lambda: metric(proc, "watchcache_tunnel_ends_total", reason="idle-timeout") == 1)
        # Busy all along, a tunnel still ends at its maximum duration.
        up = raw_upgrade(proc.url, "/spdy/echo")
        started = time.monotonic()
        with pytest.raises((ConnectionError, OSError)):
            while time.monotonic() - started < 10:
                up.sock.sendall(b"k")
                assert up.recv_exactly(1) == b"k"
                time.sleep(0.2)
        assert 3.5 < time.monotonic() - started < 6.0
        up.close()
        wait_for(lambda: metric(proc, "watchcache_tunnel_ends_total", reason="max-duration") == 1)
        # An upstream that never answers the upgrade is also cut by the idle timeout.
        up = raw_upgrade(proc.url, "/slow-head")
        assert up.head.status == 504 and up.json()["reason"] == "Timeout"
        up.close()
    finally:
        proc.stop()


def test_the_tunnel_cap_answers_429_and_tunnels_hold_no_inflight_slot(fake) -> None:
    proc = proxy(fake, "--max-tunnels", "2", "--max-requests-inflight", "1")
    try:
        first = raw_upgrade(proc.url, "/spdy/echo")
        second = WebSocket(proc.url, "/ws/echo")
        assert first.head.status == 101 and second.accepted
        # Two hours-long tunnels open, and ordinary requests are still admitted.
        assert get(proc.url, "/version").status == 404  # the fake's answer, not a 429
        third = raw_upgrade(proc.url, "/spdy/echo")
        assert third.head.status == 429
        assert third.head.headers["retry-after"] == "1"
        assert third.json()["reason"] == "TooManyRequests"
        third.close()
        first.sock.shutdown(socket.SHUT_WR)
        assert first.recv_until_closed() == b"EOF:0"
        first.close()
        wait_for(lambda: metric(proc, "watchcache_tunnels_open", protocol="spdy") == 0)
        again = raw_upgrade(proc.url, "/spdy/echo")
        assert again.head.status == 101
        again.close()
        second.close()
        _, samples = scrape(proc.url)
        assert total(samples, "watchcache_tunnels_total", protocol="spdy", outcome="rejected") == 1
        assert total(samples, "watchcache_rejected_requests_total", limit="tunnels") == 1
        assert total(samples, "watchcache_tunnels_total", protocol="spdy", outcome="switched") == 2
        assert total(samples, "watchcache_tunnels_total", protocol="websocket", outcome="switched") == 1
    finally:
        proc.stop()


def test_sigterm_cuts_open_tunnels_and_the_proxy_exits_promptly(fake) -> None:
    proc = proxy(fake)
    up = raw_upgrade(proc.url, "/spdy/echo")
    assert up.head.status == 101
    up.sock.sendall(b"x")
    assert up.recv_exactly(1) == b"x"
    started = time.monotonic()
    assert proc.stop(timeout=15) == 0
    assert time.monotonic() - started < 10
    assert up.recv_until_closed(timeout=5) == b""  # the client sees its tunnel end
    up.close()
    assert "Traceback" not in "".join(proc.log)
