"""Issue 21 (hardening, second round): hostile header bytes, forwarded header bytes, absolute-form
targets and HTTP/2 stream errors, over real sockets (HTTP/1.1 and HTTP/2 on TLS).

Each test here was seen failing before its fix (the issue's item number is in its name).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from h2.errors import ErrorCodes
from h2.settings import SettingCodes

from harness.pki import Pair, Pki
from tests.support.echo_upstream import EchoUpstream
from tests.support.factories import FakeResponse
from tests.support.h2client import H2Client
from tests.support.handlers import Harness, arun
from watchcache import apierrors
from watchcache.http.admission import Admission
from watchcache.http.h2protocol import create_h2_factory
from watchcache.http.limits import H2Limits, HttpLimits
from watchcache.http.request import Handler, Prestart, Request
from watchcache.http.response import Response
from watchcache.http.server import start_server
from watchcache.http.tls import ServingCert
from watchcache.server import passthrough
from watchcache.upstream.client import UpstreamClient
from watchcache.upstream.config import from_flags

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> Pair:
    pki = Pki(Path(tmp_path_factory.mktemp("hardpki")))
    ca = pki.ca("ca", "/CN=hardening-ca")
    return pki.issue(ca, "server", "/CN=watchcache", ip_san="127.0.0.1")


class Server:
    def __init__(self, server: asyncio.AbstractServer, admission: Admission) -> None:
        self.server = server
        self.admission = admission
        self.port: int = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

    async def client(self, **kw: Any) -> H2Client:
        c = await H2Client.connect("127.0.0.1", self.port, **kw)
        c.conn.config.validate_outbound_headers = False  # send what a hostile client would
        c.conn.config.normalize_outbound_headers = False
        return c


@asynccontextmanager
async def serving(
    handler: Handler,
    cert: Pair | None = None,
    limits: HttpLimits | None = None,
    h2limits: H2Limits | None = None,
    prestart: Prestart | None = None,
) -> AsyncIterator[Server]:
    """``handler`` on a real socket: HTTP/1.1 in clear, or (``cert``) TLS offering h2 and HTTP/1.1."""
    limits = limits or HttpLimits()
    admission = limits.admission()
    if cert is None:
        server = await start_server(handler, "127.0.0.1", 0, limits=limits, admission=admission, prestart=prestart)
    else:
        tls = ServingCert(str(cert.crt), str(cert.key), http2=True)
        h2 = create_h2_factory(handler, limits, h2limits or H2Limits(), admission, prestart=prestart)
        server = await start_server(
            handler, "127.0.0.1", 0, limits=limits, ssl=tls.context, admission=admission, h2=h2, prestart=prestart
        )
    try:
        yield Server(server, admission)
    finally:
        server.close()


@asynccontextmanager
async def forwarding_to(url: str) -> AsyncIterator[Handler]:
    """A handler that passes every request through to ``url``, as the proxy's pass-through does."""
    client = UpstreamClient(from_flags(url))
    await client.start()

    async def handler(request: Request, response: Response) -> None:
        await passthrough.forward(client, request, response)

    try:
        yield handler
    finally:
        await client.close()


async def raw_http1(port: int, data: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
    """One request as raw bytes on a fresh connection; (status, headers with raw values, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ")[1])
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
    body = b""
    if b"content-length" in headers:
        body = await reader.readexactly(int(headers[b"content-length"]))
    elif headers.get(b"transfer-encoding") == b"chunked":
        while size := int((await reader.readline()).strip(), 16):
            body += await reader.readexactly(size)
            await reader.readline()
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()
    return status, headers, body


def no_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert errors == [], [r.getMessage() for r in errors]


# ------------------------------------------------------------------ item 2: HTTP/2 header bytes


@arun
async def test_item2_http2_control_characters_in_header_names_or_values_reset_that_stream_only(
    cert: Pair, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="watchcache")
    with EchoUpstream() as upstream:
        async with forwarding_to(upstream.url) as handler, serving(handler, cert) as srv:
            c = await srv.client()
            bad = [
                ("x-a", "a\r\nx-injected: 1"),
                ("x-a", "a\nb"),
                ("x-a", "a\x00b"),
                ("x-a", "a\x7fb"),
                ("x-a", "a\x01b"),
                ("x a", "b"),
                ("x-\u00e9", "b"),
                ("x:a", "b"),
                ("X-Upper", "b"),
            ]
            for name, value in bad:
                got = await c.get("/api/v1/namespaces/default/configmaps", headers=[(name, value)])
                assert got.reset == ErrorCodes.PROTOCOL_ERROR, (name, value, got.status, bytes(got.data))
            # httpguts allows a tab and bytes >= 0x80 in a value: forwarded as they came.
            ok = await c.get("/api/v1/namespaces/default/configmaps", headers=[("x-a", "a\tb")])
            assert ok.status == 200 and ["x-a", "a\tb"] in ok.json()["lines"]
            assert c.goaway is None  # stream errors: the connection went on
            assert len(upstream.seen) == 1
            assert srv.admission.rejected["http2_protocol"] == len(bad)
            await c.close()
    no_tracebacks(caplog)


@arun
async def test_item2_a_value_error_of_the_pass_through_client_is_a_400_status() -> None:
    """Whatever the protocols let through, a header aiohttp refuses is the client's fault (400), never a 500."""
    with EchoUpstream() as upstream:
        client = UpstreamClient(from_flags(upstream.url))
        await client.start()
        try:
            headers = {"x-a": "a\x01b"}
            request = Request("GET", b"/api/v1/configmaps", "/api/v1/configmaps", {}, headers, b"", "2", "1.2.3.4:5")
            with pytest.raises(apierrors.StatusError) as err:
                await passthrough.forward(client, request, FakeResponse())
            assert err.value.code == 400 and err.value.reason == "BadRequest"
            assert upstream.seen == []
        finally:
            await client.close()


# ------------------------------------------------------------------ item 3: forwarded header bytes


async def _answering(head: bytes) -> tuple[asyncio.AbstractServer, str, list[bytes]]:
    """An upstream that records each raw request head and answers with ``head`` (bytes as given) and '{}'."""
    seen: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                seen.append(await reader.readuntil(b"\r\n\r\n"))
                writer.write(head + b"Content-Length: 2\r\n\r\n{}")
                await writer.drain()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}", seen


@arun
async def test_item3_request_header_bytes_are_forwarded_byte_for_byte(cert: Pair) -> None:
    upstream, url, seen = await _answering(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
    try:
        async with forwarding_to(url) as handler, serving(handler) as srv:
            # kubectl --as josé: UTF-8 bytes on the wire, as Go sends them.
            status, _, _ = await raw_http1(
                srv.port,
                b"GET /api/v1/namespaces HTTP/1.1\r\nHost: x\r\nImpersonate-User: jos\xc3\xa9\r\n"
                b"User-Agent: kubectl/\xe2\x82\xac\r\n\r\n",
            )
            assert status == 200
            assert b"\r\nimpersonate-user: jos\xc3\xa9\r\n" in seen[-1]
            assert b"\r\nuser-agent: kubectl/\xe2\x82\xac\r\n" in seen[-1]
            # Bytes that are not UTF-8 cannot be written as they came by the client library: 400, not mangled.
            status, _, body = await raw_http1(
                srv.port, b"GET /api/v1/namespaces HTTP/1.1\r\nHost: x\r\nImpersonate-User: jos\xe9\r\n\r\n"
            )
            assert status == 400 and json.loads(body)["reason"] == "BadRequest"
            assert len(seen) == 1
        async with forwarding_to(url) as handler, serving(handler, cert) as srv:
            c = await srv.client()
            got = await c.get("/api/v1/namespaces", headers=[("impersonate-user", "jos\u00e9")])
            assert got.status == 200
            assert b"\r\nimpersonate-user: jos\xc3\xa9\r\n" in seen[-1]
            await c.close()
    finally:
        upstream.close()


@arun
async def test_item3_an_upstream_response_header_that_is_not_latin1_reaches_the_client_as_sent(cert: Pair) -> None:
    warning = b'Warning: 299 - "admission webhook says: 5 \xe2\x82\xac per pod"\r\n'
    upstream, url, _ = await _answering(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + warning)
    try:
        async with forwarding_to(url) as handler, serving(handler) as srv:
            status, headers, body = await raw_http1(srv.port, b"GET /api/v1/namespaces HTTP/1.1\r\nHost: x\r\n\r\n")
            assert status == 200 and body == b"{}"
            assert headers[b"warning"] == warning.partition(b": ")[2].strip()
        async with forwarding_to(url) as handler, serving(handler, cert) as srv:
            c = await srv.client()
            got = await c.get("/api/v1/namespaces")
            assert got.status == 200 and got.json() == {}
            assert got.headers["warning"] == warning.partition(b": ")[2].strip().decode("utf-8")
            await c.close()
    finally:
        upstream.close()


# ------------------------------------------------------------------ item 4: absolute-form and *


@arun
async def test_item4_absolute_form_targets_are_routed_and_forwarded_on_their_origin_form(cert: Pair) -> None:
    h = Harness()
    async with serving(h.handler) as srv:
        status, _, body = await raw_http1(
            srv.port, b"GET http://example.com/api/v1/namespaces/default/pods?limit=2 HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        assert status == 200, body
        items = json.loads(body)["items"]
        assert [i["metadata"]["name"] for i in items] == ["p0", "p1"]
        assert h.upstream.forwarded == []
        # `*` means the server itself: OPTIONS gets Go's empty 200, anything else a 400.
        status, _, body = await raw_http1(srv.port, b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == 200 and body == b""
        status, _, body = await raw_http1(srv.port, b"GET * HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == 400 and json.loads(body)["reason"] == "BadRequest"
    with EchoUpstream() as upstream:
        async with forwarding_to(upstream.url) as handler, serving(handler) as srv:
            status, _, body = await raw_http1(
                srv.port,
                b"POST https://example.com/api/v1/namespaces/default/configmaps?x=1 HTTP/1.1\r\n"
                b"Host: x\r\nContent-Length: 2\r\n\r\n{}",
            )
            assert status == 200, body
            assert json.loads(body)["path"] == "/api/v1/namespaces/default/configmaps?x=1"
    async with serving(h.handler, cert) as srv:
        c = await srv.client()
        # HTTP/2's :path is origin-form or `*` (RFC 9113 8.3.1): anything else is malformed, as Go.
        got = await c.get("http://example.com/api/v1/namespaces/default/pods")
        assert got.reset == ErrorCodes.PROTOCOL_ERROR
        got = await c.get("/api/v1/namespaces/default/pods/p0")
        assert got.status == 200
        await c.close()


# ------------------------------------------------------------------ item 6: HTTP/2 stream errors


@arun
async def test_item6_a_content_length_h2_rejects_is_a_stream_error(cert: Pair) -> None:
    with EchoUpstream() as upstream:
        async with forwarding_to(upstream.url) as handler, serving(handler, cert) as srv:
            c = await srv.client()
            path = "/api/v1/namespaces/default/configmaps"
            for length in ("abc", "-1", "1, 2"):
                got = await c.get(path, method="POST", headers=[("content-length", length)], body=b"x")
                assert got.reset == ErrorCodes.PROTOCOL_ERROR, length
            more = await c.get(path, method="POST", headers=[("content-length", "1")], body=b"xyz")
            assert more.reset == ErrorCodes.PROTOCOL_ERROR
            less = await c.get(path, method="POST", headers=[("content-length", "5")], body=b"xy")
            assert less.reset == ErrorCodes.PROTOCOL_ERROR
            assert c.goaway is None
            ok = await c.get(path, method="POST", headers=[("content-length", "2")], body=b"{}")
            assert ok.status == 200 and ok.json()["body"] == "{}"
            await c.close()


@arun
async def test_item6_streams_over_the_advertised_limit_are_reset_and_the_connection_goes_on(cert: Pair) -> None:
    h = Harness()
    async with serving(h.handler, cert, h2limits=H2Limits(max_concurrent_streams=4)) as srv:
        c = await srv.client(settings=False)  # has not read the server's SETTINGS: ignores the limit
        watches = [c.request(f"/api/v1/namespaces/default/pods?watch=1&w={i}") for i in range(5)]
        c.start()
        # Go: REFUSED_STREAM while the client has not acknowledged the SETTINGS (it may not know).
        await c.until(lambda: watches[4].reset is not None)
        assert watches[4].reset == ErrorCodes.REFUSED_STREAM
        assert srv.admission.rejected["http2_streams"] == 1
        await c.until(lambda: len(h.cacher.dispatcher) == 4)
        assert c.goaway is None and all(w.reset is None for w in watches[:4])
        # Once it has, a stream over the limit is a PROTOCOL_ERROR stream error, still not the connection's.
        await c.until(lambda: c.conn.remote_settings.max_concurrent_streams == 4)
        await asyncio.sleep(0.1)  # the server has our SETTINGS ack
        c.conn.remote_settings[SettingCodes.MAX_CONCURRENT_STREAMS] = 100  # a client that ignores it
        c.conn.remote_settings.acknowledge()
        extra = await c.get("/api/v1/namespaces/default/pods/p0")
        assert extra.reset == ErrorCodes.PROTOCOL_ERROR
        assert c.goaway is None and all(w.reset is None for w in watches[:4])
        await c.close()


@arun
async def test_item6_resets_the_server_sends_for_a_clients_errors_count_toward_the_reset_limit(cert: Pair) -> None:
    h = Harness()
    async with serving(h.handler, cert, h2limits=H2Limits(reset_burst=5, reset_rate=0.001)) as srv:
        c = await srv.client()
        for _ in range(8):
            c.request("/api/v1/namespaces/default/pods/p0", headers=[("x-a", "a\r\nb")])
        await c.until(lambda: c.goaway is not None)
        assert c.goaway is not None and c.goaway.error_code == ErrorCodes.ENHANCE_YOUR_CALM
        assert srv.admission.rejected["http2_rapid_reset"] == 1
        await c.close()


# ------------------------------------------------------------------ found by the HTTP/2 fuzz


@arun
async def test_a_frame_header_over_the_max_frame_size_is_refused_before_its_body(cert: Pair) -> None:
    h = Harness()
    async with serving(h.handler, cert) as srv:
        c = await srv.client()
        await c.until(lambda: c.conn.remote_settings.max_frame_size > 0)
        # A DATA frame announcing 16 MB - 1, of which 100 bytes are sent: h2 would wait for (and
        # buffer) the rest before checking the length.
        length = (1 << 24) - 1
        c.writer.write(length.to_bytes(3, "big") + b"\x00\x00\x00\x00\x00\x01" + b"x" * 100)
        await c.until(lambda: c.goaway is not None or c.closed.is_set())
        assert srv.admission.rejected["http2_protocol"] == 1
        await c.close()


@arun
async def test_the_prestart_hook_gets_each_bodyless_requests_task_which_ends_unrun_when_reset_at_once(
    cert: Pair,
) -> None:
    """What the hook started for a request is settled at its task's end (``ApiHandler.prestart``): a
    stream reset in the same read as its HEADERS cancels its task before its first step, so that end is
    the only one there is (no handler runs, no ``finally`` of its)."""
    handled: list[str] = []
    tasks: list[tuple[str, asyncio.Task[None]]] = []

    async def handler(request: Request, response: Response) -> None:
        handled.append(request.path)
        response.send(200, b"{}")

    def prestart(request: Request, task: asyncio.Task[None]) -> None:
        assert not handled or handled[-1] != request.path  # before the handler's first step
        tasks.append((request.path, task))

    for tls in (None, cert):
        handled.clear()
        tasks.clear()
        async with serving(handler, tls, prestart=prestart) as srv:
            if tls is None:
                reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
                writer.write(b"GET /one HTTP/1.1\r\nHost: t\r\n\r\n")
                assert (await reader.readuntil(b"{}")).startswith(b"HTTP/1.1 200")
                writer.close()
                assert [p for p, _ in tasks] == ["/one"] and handled == ["/one"]
                continue
            c = await srv.client()
            sid = c.conn.get_next_available_stream_id()
            fields = [(":method", "GET"), (":scheme", "https"), (":authority", "t"), (":path", "/reset")]
            c.conn.send_headers(sid, fields, end_stream=True)
            c.conn.reset_stream(sid)
            c.flush()  # HEADERS and RST_STREAM in one write
            assert (await c.get("/after")).status == 200
            await c.close()
        assert [p for p, _ in tasks] == ["/reset", "/after"], tasks
        assert tasks[0][1].cancelled() and handled == ["/after"]  # the reset one never ran


@arun
async def test_a_stream_the_client_resets_in_the_same_read_as_its_malformed_headers(
    cert: Pair, caplog: pytest.LogCaptureFixture
) -> None:
    h = Harness()
    async with serving(h.handler, cert) as srv:
        c = await srv.client()
        for headers, method in (([("x-a", "a\r\nb")], "GET"), ([], "CONNECT")):
            sid = c.conn.get_next_available_stream_id()
            fields = [(":method", method), (":scheme", "https"), (":authority", "t"), (":path", "/api"), *headers]
            c.conn.send_headers(sid, fields)
            c.conn.reset_stream(sid)
            c.flush()  # HEADERS and RST_STREAM in one write
        got = await c.get("/api/v1/namespaces/default/pods/p0")
        assert got.status == 200 and c.goaway is None
        await c.close()
    no_tracebacks(caplog)
