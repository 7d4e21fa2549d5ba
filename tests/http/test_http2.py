"""HTTP/2 (``--http2``) over real TLS sockets: an ``h2`` client connection against the server's H2Protocol.

The handler is the real ApiHandler over a pods cache (tests/support/handlers.py), so each stream
goes through the same routing, cached reads, watches and errors as HTTP/1.1 requests.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from h2.errors import ErrorCodes

from harness.pki import Pair, Pki
from tests.support.echo_upstream import EchoUpstream
from tests.support.h2client import H2Client, client_context
from tests.support.handlers import MODIFIED, Harness, arun
from watchcache.http.admission import Admission
from watchcache.http.h2protocol import create_h2_factory
from watchcache.http.limits import H2Limits, HttpLimits
from watchcache.http.request import Handler, Request
from watchcache.http.response import Response
from watchcache.http.server import start_server
from watchcache.http.tls import ServingCert
from watchcache.server import passthrough
from watchcache.upstream.client import UpstreamClient
from watchcache.upstream.config import from_flags

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> Pair:
    pki = Pki(Path(tmp_path_factory.mktemp("h2pki")))
    ca = pki.ca("ca", "/CN=h2-test-ca")
    return pki.issue(ca, "server", "/CN=watchcache", ip_san="127.0.0.1")


class Server:
    def __init__(self, server: asyncio.AbstractServer, admission: Admission) -> None:
        self.server = server
        self.admission = admission
        self.port: int = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

    async def client(self, **kw: Any) -> H2Client:
        return await H2Client.connect("127.0.0.1", self.port, **kw)


@asynccontextmanager
async def h2_server(
    cert: Pair, handler: Handler, limits: HttpLimits | None = None, h2limits: H2Limits | None = None
) -> AsyncIterator[Server]:
    limits = limits or HttpLimits()
    admission = limits.admission()
    tls = ServingCert(str(cert.crt), str(cert.key), http2=True)
    h2 = create_h2_factory(handler, limits, h2limits or H2Limits(), admission)
    server = await start_server(handler, "127.0.0.1", 0, limits=limits, ssl=tls.context, admission=admission, h2=h2)
    try:
        yield Server(server, admission)
    finally:
        server.close()


def names(stream: Any) -> list[str]:
    return [item["metadata"]["name"] for item in stream.json()["items"]]


# ------------------------------------------------------------------ reads


@arun
async def test_get_list_and_watch_are_served_from_the_cache_on_streams_of_one_connection(cert: Pair) -> None:
    h = Harness()
    async with h2_server(cert, h.handler) as srv:
        c = await srv.client()
        assert c.alpn == "h2"
        got = await c.get("/api/v1/namespaces/default/pods/p1")
        assert got.status == 200 and got.json()["metadata"]["name"] == "p1"
        assert got.headers["content-type"] == "application/json"
        listed = await c.get("/api/v1/namespaces/default/pods?limit=2")
        assert names(listed) == ["p0", "p1"] and listed.json()["metadata"]["continue"]
        missing = await c.get("/api/v1/namespaces/default/pods/nope")
        assert missing.status == 404 and missing.json()["reason"] == "NotFound"
        watch = c.request("/api/v1/namespaces/default/pods?watch=1&resourceVersion=10")
        await c.until(lambda: watch.status == 200)
        await asyncio.sleep(0.05)
        h.write(MODIFIED, "p2", labels={"x": "y"})
        await c.until(lambda: len(watch.events()) == 1)
        event = watch.events()[0]
        assert event["type"] == "MODIFIED" and event["object"]["metadata"]["resourceVersion"] == "11"
        assert srv.admission.h2_connections == 1 and srv.admission.h2_streams == 1
        await c.close()


@arun
async def test_http1_clients_are_still_served_when_http2_is_offered(cert: Pair) -> None:
    h = Harness()
    async with h2_server(cert, h.handler) as srv:
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port, ssl=client_context(("http/1.1",)))
        assert writer.get_extra_info("ssl_object").selected_alpn_protocol() == "http/1.1"
        writer.write(b"GET /api/v1/namespaces/default/pods/p0 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = await reader.read()
        assert answer.startswith(b"HTTP/1.1 200 OK")
        writer.close()


@arun
async def test_twelve_watches_multiplexed_on_one_connection_each_get_every_event(cert: Pair) -> None:
    h = Harness()
    async with h2_server(cert, h.handler) as srv:
        c = await srv.client()
        watches = [c.request(f"/api/v1/namespaces/default/pods?watch=1&resourceVersion=10&w={i}") for i in range(12)]
        await c.until(lambda: len(h.cacher.dispatcher) == 12)
        for i in range(20):
            h.write(MODIFIED, f"p{i % 5}", labels={"n": str(i)})
        await c.until(lambda: all(len(w.events()) == 20 for w in watches))
        for w in watches:
            assert [e["object"]["metadata"]["resourceVersion"] for e in w.events()] == [str(11 + i) for i in range(20)]
        assert srv.admission.h2_streams == 12
        await c.close()


@arun
async def test_a_stream_with_a_closed_window_does_not_block_the_others_and_its_watcher_takes_the_slow_path(
    cert: Pair,
) -> None:
    # A watcher cap of 64 KiB and stream queues of 16 KiB: the stalled stream's client window
    # (64 KiB) fills, then its queue, then its watcher lags and is caught up from history.
    h = Harness(max_events=10_000, watch_max_pending_bytes=64 << 10)
    limits = HttpLimits(high_water=16 << 10, low_water=4 << 10)
    async with h2_server(cert, h.handler, limits) as srv:
        c = await srv.client()
        stalled = c.request("/api/v1/namespaces/default/pods?watch=1&resourceVersion=10", ack=False)
        live = c.request("/api/v1/namespaces/default/pods?watch=1&resourceVersion=10")
        await c.until(lambda: len(h.cacher.dispatcher) == 2)
        blob = "x" * 60  # labels are short; many events make the bytes
        n = 1500
        for i in range(n):  # ~500 KB per watcher
            h.write(MODIFIED, f"p{i % 5}", labels={"n": str(i), "blob": blob})
            if i % 20 == 19:
                await asyncio.sleep(0.005)
        await c.until(lambda: len(live.events()) == n)
        assert len(stalled.data) <= 65535  # the client's window: not a byte more
        assert h.cacher.watchers_lagged >= 1  # exactly the HTTP/1.1 slow path
        c.ack(stalled)  # the client reads again: caught up from history, nothing lost or repeated
        await c.until(lambda: len(stalled.data) > 65535 and len(stalled.events()) == n, timeout=10)
        rvs = [e["object"]["metadata"]["resourceVersion"] for e in stalled.events()]
        assert rvs == [str(11 + i) for i in range(n)]
        await c.close()


@arun
async def test_pass_through_over_http2_forwards_the_body_and_drops_hop_by_hop_headers(cert: Pair) -> None:
    with EchoUpstream() as upstream:
        client = UpstreamClient(from_flags(upstream.url))
        await client.start()

        async def handler(request: Request, response: Response) -> None:
            await passthrough.forward(client, request, response)

        try:
            async with h2_server(cert, handler) as srv:
                c = await srv.client()
                body = json.dumps({"kind": "ConfigMap"}).encode()
                got = await c.get(
                    "/api/v1/namespaces/default/configmaps",
                    method="POST",
                    headers=[("content-type", "application/json"), ("authorization", "Bearer t")],
                    body=body,
                )
                assert got.status == 200, got.data
                echoed = got.json()
                assert echoed["method"] == "POST" and echoed["body"] == body.decode()
                assert ["authorization", "Bearer t"] in echoed["lines"]
                # Hop-by-hop answers of the upstream never reach an HTTP/2 client (h2 would refuse them).
                assert "connection" not in got.headers and "keep-alive" not in got.headers
                assert got.headers["x-upstream"] == "kept"
                await c.close()
        finally:
            await client.close()


@pytest.mark.parametrize("path", ["forward", "exchange"])
@arun
async def test_a_304_over_http2_has_no_content_type_when_the_upstreams_had_none(cert: Pair, path: str) -> None:
    """As over HTTP/1.1 (tests/server/test_passthrough.py): kube's 304 has no Content-Type, and an
    HTTP cache merges a 304's headers into the answer it kept (kubectl's discovery cache)."""
    with EchoUpstream() as upstream:
        client = UpstreamClient(from_flags(upstream.url))
        await client.start()

        async def handler(request: Request, response: Response) -> None:
            if path == "exchange":
                assert passthrough.exchangeable(client, request)
                await passthrough.exchange(client, request, response)
            else:
                await passthrough.forward(client, request, response)

        try:
            async with h2_server(cert, handler) as srv:
                c = await srv.client()
                got = await c.get("/api", headers=[("if-none-match", '"e1"')])
                assert got.status == 304 and not got.data, got.headers
                assert "content-type" not in got.headers, got.headers
                assert got.headers["etag"] == '"e1"'
                # The upstream's Cache-Control alone (kube's discovery says public), never ours beside it.
                assert [v for n, v in got.header_lines if n == "cache-control"] == ["public"]
                await c.close()
        finally:
            await client.close()


@arun
async def test_every_answer_carries_kubes_audit_id_over_http2_too(cert: Pair) -> None:
    """As over HTTP/1.1 (tests/http/test_http.py): the client's own Audit-ID, else a new UUID; the
    handler's own (a passed-through answer's: the upstream's) instead, never beside it."""

    async def handler(request: Request, response: Response) -> None:
        own = request.query_value("own")
        response.send(200, b"{}", headers=(("Audit-Id", own),) if own else ())

    async with h2_server(cert, handler) as srv:
        c = await srv.client()
        made = [(await c.get("/a")).header_lines for _ in range(2)]
        ids = [v for lines in made for n, v in lines if n == "audit-id"]
        assert len(ids) == 2 and ids[0] != ids[1] and all(uuid.UUID(i).version == 4 for i in ids), made
        mine = await c.get("/a", headers=[("audit-id", "mine-2")])
        assert [v for n, v in mine.header_lines if n == "audit-id"] == ["mine-2"]
        own = await c.get("/a?own=upstream", headers=[("audit-id", "mine-2")])
        assert [v for n, v in own.header_lines if n == "audit-id"] == ["upstream"]
        await c.close()


# ------------------------------------------------------------------ limits


@arun
async def test_the_stream_limit_is_advertised_in_settings(cert: Pair) -> None:
    # A client over it gets its extra streams reset, not the connection: tests/server/test_hardening.py.
    h = Harness()
    async with h2_server(cert, h.handler, h2limits=H2Limits(max_concurrent_streams=4)) as srv:
        c = await srv.client()
        await c.until(lambda: c.conn.remote_settings.max_concurrent_streams == 4)
        await c.close()


@arun
async def test_a_header_list_over_the_limit_gets_431_and_the_connection_goes_on(cert: Pair) -> None:
    h = Harness()
    async with h2_server(cert, h.handler, HttpLimits(max_header_bytes=4096)) as srv:
        c = await srv.client()
        big = await c.get("/api/v1/namespaces/default/pods/p0", headers=[("x-big", "a" * 5000)])
        assert big.status == 431 and big.json()["reason"] == "RequestHeaderFieldsTooLarge"
        assert srv.admission.rejected["http2_header_list"] == 1
        ok = await c.get("/api/v1/namespaces/default/pods/p0")
        assert ok.status == 200
        await c.close()


@arun
async def test_a_body_over_the_limit_gets_413_and_a_slow_body_408(cert: Pair) -> None:
    h = Harness()
    async with h2_server(cert, h.handler, HttpLimits(max_body_bytes=1000, body_timeout=0.3)) as srv:
        c = await srv.client()
        big = await c.get("/api/v1/namespaces/default/configmaps", method="POST", body=b"x" * 2000)
        assert big.status == 413 and big.json()["reason"] == "RequestEntityTooLarge"
        announced = await c.get(
            "/api/v1/namespaces/default/configmaps", method="POST", headers=[("content-length", "5000")], end=False
        )
        assert announced.status == 413
        slow = c.request("/api/v1/namespaces/default/configmaps", method="POST", body=b"{", end=False)
        await c.response(slow)
        assert slow.status == 408 and slow.json()["reason"] == "Timeout"
        assert srv.admission.rejected["body_timeout"] == 1
        assert srv.admission.buffered == 0  # nothing held once answered
        await c.close()


@arun
async def test_request_bytes_over_the_process_buffer_get_429(cert: Pair) -> None:
    h = Harness()
    async with h2_server(cert, h.handler, HttpLimits(max_request_buffer_bytes=3000, max_body_bytes=10_000)) as srv:
        c = await srv.client()
        held = c.request("/api/v1/namespaces/default/configmaps", method="POST", body=b"x" * 2500, end=False)
        await asyncio.sleep(0.1)
        refused = await c.get("/api/v1/namespaces/default/configmaps", method="POST", body=b"y" * 1000)
        assert refused.status == 429 and refused.headers["retry-after"] == "1"
        assert srv.admission.rejected["request_buffer"] == 1
        assert held.status == 0  # still being received
        probe = await c.get("/readyz")  # probes are answered whatever others hold
        assert probe.status == 200
        await c.close()


@arun
async def test_every_stream_takes_an_inflight_slot_as_an_http1_request(cert: Pair) -> None:
    # No room to wait without a seat: the held pass-through keeps its seat (server/seats.py).
    h = Harness(max_requests_inflight=1, max_requests_waiting=0)
    h.upstream.hold = asyncio.Event()
    async with h2_server(cert, h.handler) as srv:
        c = await srv.client()
        first = c.request("/api/v1/namespaces/default/configmaps")  # passed through, held
        await c.until(lambda: h.handler.active == 1)
        second = await c.get("/api/v1/namespaces/default/configmaps")
        assert second.status == 429 and second.json()["reason"] == "TooManyRequests"
        # A watch of a cached resource is long-running: once registered it gives its slot back.
        h.upstream.hold.set()
        await c.response(first)
        watch = c.request("/api/v1/namespaces/default/pods?watch=1")
        await c.until(lambda: len(h.cacher.dispatcher) == 1)
        after = await c.get("/api/v1/namespaces/default/pods/p0")
        assert after.status == 200 and watch.reset is None
        await c.close()


@arun
async def test_an_upgrade_request_gets_400_saying_exec_needs_http1(cert: Pair) -> None:
    h = Harness()
    async with h2_server(cert, h.handler) as srv:
        c = await srv.client()
        c.conn.config.validate_outbound_headers = False  # send what kubectl's SPDY/WebSocket dialer would
        c.conn.config.normalize_outbound_headers = False
        got = await c.get(
            "/api/v1/namespaces/default/pods/p0/exec?command=ls",
            headers=[("connection", "Upgrade"), ("upgrade", "websocket"), ("sec-websocket-version", "13")],
        )
        assert got.status == 400
        status = got.json()
        assert status["kind"] == "Status" and status["reason"] == "BadRequest"
        assert "HTTP/1.1" in status["message"] and "not valid in HTTP/2" in status["message"]
        assert srv.admission.rejected["http2_upgrade"] == 1
        assert h.upstream.forwarded == []  # never reached the tunnel or the upstream
        await c.close()


@arun
async def test_rapid_reset_ends_the_connection_with_enhance_your_calm(cert: Pair) -> None:
    h = Harness()
    h2limits = H2Limits(reset_burst=20, reset_rate=1.0)
    async with h2_server(cert, h.handler, h2limits=h2limits) as srv:
        c = await srv.client()
        for _ in range(60):
            stream = c.request("/api/v1/namespaces/default/pods?watch=1")
            c.conn.reset_stream(stream.sid, ErrorCodes.CANCEL)
            c.flush()
        await c.until(lambda: c.goaway is not None or c.closed.is_set())
        assert c.goaway is not None and c.goaway.error_code == ErrorCodes.ENHANCE_YOUR_CALM
        assert srv.admission.rejected["http2_rapid_reset"] == 1
        await c.until(lambda: srv.admission.h2_streams == 0 and h.handler.active == 0)
        await c.close()


@arun
async def test_a_ping_flood_ends_the_connection_with_enhance_your_calm(cert: Pair) -> None:
    h = Harness()
    async with h2_server(cert, h.handler, h2limits=H2Limits(control_burst=50, control_rate=1.0)) as srv:
        c = await srv.client()
        for i in range(200):
            c.conn.ping(i.to_bytes(8, "big"))
        c.flush()
        await c.until(lambda: c.goaway is not None or c.closed.is_set())
        assert c.goaway is not None and c.goaway.error_code == ErrorCodes.ENHANCE_YOUR_CALM
        assert srv.admission.rejected["http2_control_flood"] == 1
        await c.close()


@arun
async def test_after_an_unauthenticated_request_the_connection_gets_goaway_and_serves_no_new_stream(
    cert: Pair,
) -> None:
    h = Harness()

    async def handler(request: Request, response: Response) -> None:
        if request.path == "/anonymous":
            request.close_connection = True  # what the auth gate sets for an anonymous user on HTTP/2
            response.send(200, b"{}")
            return
        await h.handler(request, response)

    async with h2_server(cert, handler) as srv:
        c = await srv.client()
        watch = c.request("/api/v1/namespaces/default/pods?watch=1&resourceVersion=10")
        await c.until(lambda: len(h.cacher.dispatcher) == 1)
        anonymous = await c.get("/anonymous")
        assert anonymous.status == 200
        await c.until(lambda: c.goaway is not None)
        assert c.goaway is not None and c.goaway.error_code == ErrorCodes.NO_ERROR
        assert c.goaway.last_stream_id == anonymous.sid
        # The streams already open finish; a new one is refused.
        h.write(MODIFIED, "p1", labels={"after": "goaway"})
        await c.until(lambda: len(watch.events()) == 1)
        # A client that opens a stream anyway (the test client lets it) is refused.
        late = await c.get("/api/v1/namespaces/default/pods/p0")
        assert late.reset == ErrorCodes.REFUSED_STREAM
        assert srv.admission.rejected["http2_unauthenticated"] == 1
        await c.close()


@arun
async def test_a_401_on_http2_is_the_connections_last_request(cert: Pair) -> None:
    async def handler(request: Request, response: Response) -> None:
        response.send(401, b'{"kind":"Status","code":401}')

    async with h2_server(cert, handler) as srv:
        c = await srv.client()
        got = await c.get("/api/v1/pods")
        assert got.status == 401
        await c.until(lambda: c.goaway is not None)
        await c.until(lambda: c.closed.is_set())  # no stream left open: closed
        await c.close()


@arun
async def test_a_handler_header_value_with_a_line_break_gets_a_500_status_as_on_http1(cert: Pair) -> None:
    async def handler(request: Request, response: Response) -> None:
        response.send(200, b"{}", headers=[("X-Note", "a\r\nSet-Cookie: evil=1")])

    async with h2_server(cert, handler) as srv:
        c = await srv.client()
        got = await c.get("/x")
        assert got.reset is None and got.status == 500
        assert got.json()["reason"] == "InternalError" and "set-cookie" not in got.headers
        after = await c.get("/x")  # the connection goes on
        assert after.status == 500
        await c.close()


@arun
async def test_a_connection_that_sends_no_request_is_closed_after_the_head_timeout(cert: Pair) -> None:
    h = Harness()
    async with h2_server(cert, h.handler, HttpLimits(header_timeout=0.2)) as srv:
        c = await srv.client()
        await asyncio.wait_for(c.closed.wait(), 3)
        assert srv.admission.rejected["header_timeout"] == 1
        await c.close()
