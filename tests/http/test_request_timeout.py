"""Issue 21 item 1: a client that never reads cannot hold the in-flight slots, over either protocol.

kube-apiserver ends a non-long-running request after --request-timeout (60 s), releasing its
max-in-flight seat even while its writer is blocked; watches and tunnels are long-running. Here
with a short timeout, over real sockets: LISTs larger than every buffer on the way, never read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from h2.errors import ErrorCodes

from harness.pki import Pair, Pki
from tests.support.factories import pod
from tests.support.h2client import H2Client, client_context
from tests.support.handlers import Harness, arun, until
from watchcache.http.admission import Admission
from watchcache.http.h2protocol import create_h2_factory
from watchcache.http.limits import H2Limits, HttpLimits
from watchcache.http.request import Request
from watchcache.http.response import Response
from watchcache.http.server import start_server
from watchcache.http.tls import ServingCert

pytestmark = pytest.mark.timeout(60)

TIMEOUT = 1.0
SLOTS = 4


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> Pair:
    pki = Pki(Path(tmp_path_factory.mktemp("timeoutpki")))
    ca = pki.ca("ca", "/CN=timeout-ca")
    return pki.issue(ca, "server", "/CN=watchcache", ip_san="127.0.0.1")


def big_harness(**config: Any) -> Harness:
    """Pods whose LIST is ~10 MB: more than the socket buffers, the transport's and a stream's queue."""
    h = Harness(max_requests_inflight=SLOTS, request_timeout=TIMEOUT, **config)
    h.cacher.replace([pod(f"p{i}", rv=i + 1, labels={"pad": "x" * 2500}) for i in range(4000)], 5000)
    h.upstream.rv = h.rv = 5000
    return h


@asynccontextmanager
async def serving(h: Harness, cert: Pair | None = None) -> AsyncIterator[tuple[int, Admission]]:
    limits = HttpLimits(send_timeout=TIMEOUT)
    admission = limits.admission()
    if cert is None:
        server = await start_server(h.handler, "127.0.0.1", 0, limits=limits, admission=admission)
    else:
        tls = ServingCert(str(cert.crt), str(cert.key), http2=True)
        h2 = create_h2_factory(h.handler, limits, H2Limits(), admission)
        server = await start_server(
            h.handler, "127.0.0.1", 0, limits=limits, ssl=tls.context, admission=admission, h2=h2
        )
    try:
        yield server.sockets[0].getsockname()[1], admission
    finally:
        server.close()


async def small_get(port: int, tls: bool = False) -> int:
    ctx = client_context(("http/1.1",)) if tls else None
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    writer.write(b"GET /api/v1/namespaces/default/pods/p0 HTTP/1.1\r\nHost: x\r\n\r\n")
    line = await reader.readline()
    writer.close()
    return int(line.split(b" ")[1])


async def until_served(port: int, within: float, tls: bool = False) -> float:
    """Seconds until another client's small GET gets 200 (not 429)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while (status := await small_get(port, tls)) != 200:
        assert status == 429
        assert loop.time() - start < within, "another client still gets 429"
        await asyncio.sleep(0.1)
    return loop.time() - start


@arun
async def test_item1_http1_lists_never_read_give_their_slots_back_at_the_deadline() -> None:
    h = big_harness()
    async with serving(h) as (port, _):
        hostile = []
        for _ in range(SLOTS):
            reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1024)
            writer.transport.pause_reading()  # type: ignore[attr-defined]
            writer.write(b"GET /api/v1/namespaces/default/pods HTTP/1.1\r\nHost: x\r\n\r\n")
            hostile.append((reader, writer))
        await until(lambda: h.handler.active == SLOTS)
        assert await small_get(port) == 429
        waited = await until_served(port, within=TIMEOUT + 5)
        assert waited > TIMEOUT / 2
        await until(lambda: h.handler.active == 0)
        assert h.handler.rejected.get("request_timeout") == SLOTS
        for _, writer in hostile:
            writer.close()


@arun
async def test_item1_http2_streams_with_closed_windows_give_their_slots_back_and_the_connection_closes(
    cert: Pair,
) -> None:
    h = big_harness()
    async with serving(h, cert) as (port, _):
        c = await H2Client.connect("127.0.0.1", port, settings=False)
        c.conn.update_settings({0x4: 0})  # SETTINGS_INITIAL_WINDOW_SIZE=0: no stream may be sent a byte
        c.flush()
        c.start()
        streams = [c.request("/api/v1/namespaces/default/pods", ack=False) for _ in range(SLOTS)]
        await until(lambda: h.handler.active == SLOTS)
        assert await small_get(port, tls=True) == 429
        await until_served(port, within=TIMEOUT + 5, tls=True)
        # Its streams were reset at the deadline (their answers abandoned); other clients were served.
        await c.until(lambda: all(s.reset == ErrorCodes.INTERNAL_ERROR for s in streams), timeout=TIMEOUT + 5)
        assert h.handler.rejected.get("request_timeout") == SLOTS
        await c.close()


@arun
async def test_item1_an_http2_connection_none_of_whose_bytes_move_is_closed(cert: Pair) -> None:
    """Answers whose handlers returned (a small GET queued on its stream), and a watch: all stuck
    behind windows the client never opens. Nothing holds a slot, but the streams, their queues and
    the connection would stay forever."""
    h = big_harness()
    async with serving(h, cert) as (port, admission):
        c = await H2Client.connect("127.0.0.1", port, settings=False)
        c.conn.update_settings({0x4: 0})
        c.flush()
        c.start()
        gets = [c.request("/api/v1/namespaces/default/pods/p1", ack=False) for _ in range(3)]
        watch = c.request("/api/v1/namespaces/default/pods?watch=1&resourceVersion=5000", ack=False)
        await until(lambda: len(h.cacher.dispatcher) == 1)
        h.write("MODIFIED", "p2")
        started = asyncio.get_running_loop().time()
        await c.until(c.closed.is_set, timeout=2 * TIMEOUT + 5)
        assert asyncio.get_running_loop().time() - started > TIMEOUT / 2
        assert admission.rejected["send_timeout"] == 1
        assert all(g.status == 200 and not g.ended for g in gets) and not watch.ended
        await until(lambda: len(h.cacher.dispatcher) == 0)
        await c.close()


@arun
async def test_item1_a_request_not_answered_within_the_deadline_gets_kubes_504() -> None:
    h = Harness(request_timeout=0.3)
    h.upstream.hold = asyncio.Event()  # a pass-through the upstream never answers
    got = await h.request("/api/v1/namespaces/default/configmaps")
    assert got.status == 504
    status = json.loads(got.body)
    assert status["reason"] == "Timeout"
    assert status["message"] == "Timeout: request did not complete within requested timeout - context deadline exceeded"
    assert h.handler.active == 0


@arun
async def test_item1_watches_outlive_the_deadline() -> None:
    h = Harness(request_timeout=0.2)
    stream = await h.open_watch()
    await asyncio.sleep(0.5)
    h.write("MODIFIED", "p1")
    got = await stream.close()
    assert got.status == 200 and got.events()[-1]["type"] == "MODIFIED"


@arun
async def test_item1_an_http1_connection_that_closes_with_an_answer_never_taken_is_cut_off() -> None:
    """The handler wrote its whole answer (it is in the transport's buffer) and returned: the
    keep-alive timeout closes the connection, and the close waits for the client at most
    --request-timeout, not forever."""
    size = 20 << 20

    answered = asyncio.Event()

    async def handler(request: Request, response: Response) -> None:
        response.send(200, b"x" * size)
        answered.set()

    limits = HttpLimits(send_timeout=TIMEOUT, keepalive_timeout=0.3)
    admission = limits.admission()
    server = await start_server(handler, "127.0.0.1", 0, limits=limits, admission=admission)
    port = server.sockets[0].getsockname()[1]
    try:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.wait_for(answered.wait(), 5)
        await until(lambda: admission.connections == 0, timeout=TIMEOUT + 5)
        assert admission.rejected["send_timeout"] == 1
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        got = 0
        with contextlib.suppress(ConnectionError):
            while chunk := await loop.sock_recv(sock, 1 << 20):
                got += len(chunk)
        assert got < size  # cut off, not completed
        sock.close()
    finally:
        server.close()


@arun
async def test_item1_an_answer_stuck_behind_a_closed_window_is_reset_while_its_connection_moves(cert: Pair) -> None:
    """The handler returned (a GET, queued), its stream's window stays closed, and the client reads
    another stream (a watch that keeps getting events): the connection stays, that stream is reset."""
    h = big_harness()
    async with serving(h, cert) as (port, admission):
        c = await H2Client.connect("127.0.0.1", port, settings=False)
        c.conn.update_settings({0x4: 0})
        c.flush()
        c.start()
        watch = c.request("/api/v1/namespaces/default/pods?watch=1&resourceVersion=5000")
        c.conn.increment_flow_control_window(1 << 24, stream_id=watch.sid)
        c.flush()
        stuck = c.request("/api/v1/namespaces/default/pods/p1", ack=False)
        await until(lambda: len(h.cacher.dispatcher) == 1)
        loop = asyncio.get_running_loop()
        started = loop.time()
        while stuck.reset is None:
            assert loop.time() - started < 3 * TIMEOUT + 5, "the stuck answer was never reset"
            h.write("MODIFIED", "p2")  # the watch's bytes move
            await asyncio.sleep(0.1)
        assert stuck.reset == ErrorCodes.CANCEL and loop.time() - started > TIMEOUT / 2
        assert not c.closed.is_set() and watch.reset is None and len(watch.events()) > 5
        assert admission.rejected["send_timeout"] == 1
        await c.close()
