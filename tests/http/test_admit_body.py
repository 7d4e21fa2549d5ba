"""Admission before the body (``http.request.Admit``): a request whose body is to come waits for its grant
holding its head only; HTTP/1.1 pauses reading, HTTP/2 withholds the stream's window.

Real sockets against ``start_server`` with a handler and an ``Admit`` the test controls: each
admission waits on a future the test resolves (a grant, or a 429 answered through the response).
HTTP/1.1 runs on both event loops (uvloop in production: its pause_reading and write_eof differ).
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import uvloop

from harness.pki import Pair, Pki
from tests.support.h2client import H2Client, client_context
from watchcache.http import h1gate, reads
from watchcache.http.admission import Admission
from watchcache.http.h2protocol import create_h2_factory
from watchcache.http.limits import H2Limits, HttpLimits
from watchcache.http.request import Admitted, Request
from watchcache.http.response import Response
from watchcache.http.server import start_server
from watchcache.http.tls import ServingCert

pytestmark = pytest.mark.timeout(60)

MIB = 1 << 20
WINDOW = H2Limits().initial_window_size


class Grant:
    def __init__(self) -> None:
        self.released = 0

    def release(self) -> None:
        self.released += 1


class Gate:
    """The handler's side: an ``Admit`` whose waits the test ends, and a handler that echoes the body size."""

    def __init__(self) -> None:
        self.waiting: list[tuple[Request, Response, asyncio.Future[Admitted | None]]] = []
        self.cancelled = 0
        self.handled: list[tuple[int, Admitted | None]] = []
        self.entered = asyncio.Event()

    async def admit(self, request: Request, response: Response) -> Admitted | None:
        future: asyncio.Future[Admitted | None] = asyncio.get_running_loop().create_future()
        self.waiting.append((request, response, future))
        self.entered.set()
        try:
            return await future
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    def grant(self, i: int = 0) -> Grant:
        grant = Grant()
        self.waiting[i][2].set_result(grant)
        return grant

    def refuse(self, i: int = 0) -> None:
        _, response, future = self.waiting[i]
        response.send(429, b"Too many requests, please try again later.\n", content_type="text/plain",
                      headers=(("Retry-After", "1"),))  # fmt: skip
        future.set_result(None)

    async def handler(self, request: Request, response: Response) -> None:
        self.handled.append((len(request.body), request.admitted))
        response.send(201, b"%d" % len(request.body), content_type="text/plain")


async def until(check: Callable[[], Any], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.01)


LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


def run(loop: str, coro: Callable[[], Awaitable[None]]) -> None:
    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        runner.run(coro())  # type: ignore[arg-type]


@asynccontextmanager
async def h1_server(
    gate: Gate, limits: HttpLimits | None = None, ssl: Any = None
) -> AsyncIterator[tuple[int, Admission]]:
    limits = limits or HttpLimits()
    admission = limits.admission()
    server = await start_server(
        gate.handler, "127.0.0.1", 0, limits=limits, admission=admission, admit=gate.admit, ssl=ssl
    )
    try:
        yield server.sockets[0].getsockname()[1], admission
    finally:
        server.close()


def head(length: int, extra: str = "") -> bytes:
    return f"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: {length}\r\n{extra}\r\n".encode()


async def read_answer(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One response: (head, body)."""
    raw_head = await reader.readuntil(b"\r\n\r\n")
    length = int(raw_head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    return raw_head, await reader.readexactly(length)


# ------------------------------------------------------------------ HTTP/1.1


@pytest.mark.parametrize("loop", LOOPS)
def test_h1_a_queued_request_holds_its_head_and_its_body_is_read_after_its_grant(loop: str) -> None:
    async def main() -> None:
        gate = Gate()
        async with h1_server(gate) as (port, admission):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(head(MIB))
            await asyncio.wait_for(gate.entered.wait(), 5)
            writer.write(b"x" * MIB)  # the client sends it all; the server does not read it
            await asyncio.sleep(0.3)
            # Held: the head (and what came with it in one read), not the announced MiB. Before
            # admission before the body, Content-Length was held up front: head + 1 MiB.
            assert 0 < admission.buffered < 1024, admission.buffered
            assert gate.handled == [] and len(gate.waiting) == 1
            grant = gate.grant()
            raw_head, body = await read_answer(reader)
            assert raw_head.startswith(b"HTTP/1.1 201") and body == b"%d" % MIB
            assert gate.handled == [(MIB, grant)] and grant.released == 1
            assert b"connection: close" not in raw_head.lower()
            # Kept alive: the next request on the same connection, its body to come, admitted too.
            writer.write(head(3))
            await until(lambda: len(gate.waiting) == 2)
            gate.grant(1)
            writer.write(b"abc")
            raw_head, body = await read_answer(reader)
            assert body == b"3" and gate.handled[-1][1] is not None
            # A body that came whole with its head is in already: its handler admits it (no grant here).
            writer.write(head(3) + b"def")
            raw_head, body = await read_answer(reader)
            assert body == b"3" and gate.handled[-1] == (3, None) and len(gate.waiting) == 2
            assert admission.buffered == 0
            writer.close()

    run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_h1_a_refusal_is_answered_without_reading_the_body_and_the_connection_closes(loop: str) -> None:
    async def main() -> None:
        gate = Gate()
        async with h1_server(gate) as (port, admission):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(head(2 * MIB) + b"y" * MIB)
            await asyncio.wait_for(gate.entered.wait(), 5)
            await asyncio.sleep(0.2)
            # Sent with its head, the body is not read: the head's read (4 KiB, as Go's bufio) is all held.
            assert 0 < admission.buffered <= reads.HEAD_READ, admission.buffered
            gate.refuse()
            raw_head, _ = await read_answer(reader)
            assert raw_head.startswith(b"HTTP/1.1 429") and b"connection: close" in raw_head.lower()
            assert b"retry-after: 1" in raw_head.lower()
            assert await asyncio.wait_for(reader.read(), 5) == b""  # then closed: nothing more is read
            assert gate.handled == []
            await until(lambda: admission.buffered == 0 and admission.connections == 0)
            writer.close()

    run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_h1_expect_100_continue_is_sent_at_the_grant_not_before(loop: str) -> None:
    async def main() -> None:
        gate = Gate()
        async with h1_server(gate) as (port, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(head(5, "Expect: 100-continue\r\n"))
            await asyncio.wait_for(gate.entered.wait(), 5)
            with pytest.raises(TimeoutError):  # queued: no 100 Continue yet
                await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 0.3)
            gate.grant()
            assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == b"HTTP/1.1 100 Continue\r\n\r\n"
            writer.write(b"hello")
            raw_head, body = await read_answer(reader)
            assert raw_head.startswith(b"HTTP/1.1 201") and body == b"5"
            writer.close()

    run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("how", ["close", "reset"])
def test_h1_a_client_gone_while_queued_leaves_its_queue(loop: str, how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(h1gate, "GONE_CHECK", 0.05)

    async def main() -> None:
        gate = Gate()
        async with h1_server(gate) as (port, admission):
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(head(MIB) + b"z" * 1000)
            await asyncio.wait_for(gate.entered.wait(), 5)
            if how == "reset":
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
            await until(lambda: gate.cancelled == 1)
            await until(lambda: admission.connections == 0 and admission.buffered == 0)
            assert gate.handled == []

    run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_h1_the_body_clock_stops_while_queued(loop: str) -> None:
    async def main() -> None:
        gate = Gate()
        async with h1_server(gate, HttpLimits(body_timeout=0.3)) as (port, admission):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(head(4) + b"ab")
            await asyncio.wait_for(gate.entered.wait(), 5)
            await asyncio.sleep(0.8)  # queued longer than the body timeout: not the client's fault
            gate.grant()
            await asyncio.sleep(0.1)
            writer.write(b"cd")
            raw_head, body = await read_answer(reader)
            assert raw_head.startswith(b"HTTP/1.1 201") and body == b"4"
            # Once granted, the clock runs: a body that stops comes to 408, and the grant goes back.
            writer.write(head(4) + b"ab")
            await until(lambda: len(gate.waiting) == 2)
            grant = gate.grant(1)
            raw_head, body = await read_answer(reader)
            assert raw_head.startswith(b"HTTP/1.1 408") and grant.released == 1
            assert admission.rejected["body_timeout"] == 1
            writer.close()

    run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_h1_pipelined_requests_keep_their_order_and_bodyless_ones_are_not_admitted_here(loop: str) -> None:
    async def main() -> None:
        gate = Gate()
        order: list[str] = []
        release_first = asyncio.Event()

        async def handler(request: Request, response: Response) -> None:
            order.append(request.raw_path.decode())
            if request.raw_path == b"/first":
                await release_first.wait()
            response.send(200, request.raw_path + b":" + request.body, content_type="text/plain")

        gate.handler = handler  # type: ignore[method-assign]
        async with h1_server(gate) as (port, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /first HTTP/1.1\r\nHost: t\r\n\r\n" + head(3))
            await until(lambda: order == ["/first"])
            await asyncio.sleep(0.1)
            assert gate.waiting == []  # the POST waits for the answers before it, then for its grant
            release_first.set()
            _, body = await read_answer(reader)
            assert body == b"/first:"
            await asyncio.wait_for(gate.entered.wait(), 5)
            writer.write(b"abc" + b"GET /last HTTP/1.1\r\nHost: t\r\n\r\n")
            await asyncio.sleep(0.1)
            assert order == ["/first"]  # nothing read while the POST is queued
            gate.grant()
            assert (await read_answer(reader))[1] == b"/x:abc"
            assert (await read_answer(reader))[1] == b"/last:"
            assert order == ["/first", "/x", "/last"] and len(gate.waiting) == 1
            writer.close()

    run(loop, main)


def test_h1_a_chunked_body_waits_for_its_grant_too() -> None:
    async def main() -> None:
        gate = Gate()
        async with h1_server(gate) as (port, admission):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
            await asyncio.wait_for(gate.entered.wait(), 5)
            writer.write(b"5\r\nhello\r\n" * 2000)
            await asyncio.sleep(0.2)
            assert admission.buffered < 1024 and gate.handled == []
            grant = gate.grant()
            writer.write(b"0\r\n\r\n")
            raw_head, body = await read_answer(reader)
            assert raw_head.startswith(b"HTTP/1.1 201") and body == b"10000" and gate.handled == [(10000, grant)]
            writer.close()

    run("uvloop", main)


def test_h1_over_tls_a_queued_body_is_not_read_and_a_refusal_closes(cert: Pair) -> None:
    async def main() -> None:
        gate = Gate()
        tls = ServingCert(str(cert.crt), str(cert.key), http2=True)
        async with h1_server(gate, ssl=tls.context) as (port, admission):
            client = client_context(("http/1.1",))
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
            writer.write(head(MIB) + b"t" * MIB)
            await asyncio.wait_for(gate.entered.wait(), 5)
            await asyncio.sleep(0.2)
            assert 0 < admission.buffered <= 2 * reads.HEAD_READ, admission.buffered
            grant = gate.grant()
            raw_head, body = await read_answer(reader)
            assert raw_head.startswith(b"HTTP/1.1 201") and body == b"%d" % MIB and grant.released == 1
            writer.write(head(MIB) + b"u" * MIB)
            await until(lambda: len(gate.waiting) == 2)
            gate.refuse(1)
            raw_head, _ = await read_answer(reader)
            assert raw_head.startswith(b"HTTP/1.1 429") and b"connection: close" in raw_head.lower()
            assert gate.handled == [(MIB, grant)]
            await until(lambda: admission.connections == 0 and admission.buffered == 0)
            writer.close()

    run("uvloop", main)


def test_h1_a_switched_connection_reads_large_again() -> None:
    # Reads are 4 KiB only while a head is read: a tunnel (exec, port-forward) is not held to them.
    async def main() -> None:
        gate = Gate()
        chunks: list[int] = []
        ended = asyncio.Event()

        class Sink(asyncio.Protocol):
            def data_received(self, data: bytes) -> None:
                chunks.append(len(data))
                if sum(chunks) >= MIB:
                    ended.set()

        async def handler(request: Request, response: Response) -> None:
            response.switch_protocols(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: sink\r\n\r\n", Sink())
            await ended.wait()

        gate.handler = handler  # type: ignore[method-assign]
        async with h1_server(gate) as (port, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /x HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: sink\r\n\r\n")
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 101")
            writer.write(b"s" * MIB)
            await asyncio.wait_for(ended.wait(), 5)
            assert max(chunks) > reads.HEAD_READ, chunks[:20]
            assert gate.waiting == []
            writer.close()

    run("uvloop", main)


# ------------------------------------------------------------------ HTTP/2


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> Pair:
    pki = Pki(Path(tmp_path_factory.mktemp("admit-pki")))
    ca = pki.ca("ca", "/CN=admit-test-ca")
    return pki.issue(ca, "server", "/CN=watchcache", ip_san="127.0.0.1")


class H2Server:
    def __init__(self, port: int, admission: Admission, connections: Any) -> None:
        self.port = port
        self.admission = admission
        self._connections = connections

    def withheld(self) -> int:
        """The connection window not given back (neither announced nor to be): what queued streams hold.

        ``h2`` announces what was acknowledged in batches (half the window, or at once when it is
        closed), so the client's view lags; the server's books do not."""
        (proto,) = list(self._connections._live)  # the one connection of the test
        manager = proto._conn._inbound_flow_control_window_manager
        return int(manager.max_window_size - manager.current_window_size - manager._bytes_processed)


@asynccontextmanager
async def h2_server(cert: Pair, gate: Gate) -> AsyncIterator[H2Server]:
    limits = HttpLimits()
    admission = limits.admission()
    tls = ServingCert(str(cert.crt), str(cert.key), http2=True)
    h2 = create_h2_factory(gate.handler, limits, H2Limits(), admission, admit=gate.admit)
    server = await start_server(
        gate.handler, "127.0.0.1", 0, limits=limits, ssl=tls.context, admission=admission, h2=h2, admit=gate.admit
    )
    try:
        yield H2Server(server.sockets[0].getsockname()[1], admission, h2)
    finally:
        server.close()


def post(c: H2Client, length: int) -> Any:
    return c.request("/x", method="POST", headers=[("content-length", str(length))], end=False)


def send(c: H2Client, stream: Any, data: bytes, end: bool = False) -> None:
    size = c.conn.max_outbound_frame_size
    for i in range(0, len(data), size):
        c.conn.send_data(stream.sid, data[i : i + size], end_stream=end and i + size >= len(data))
    c.flush()


def test_h2_a_queued_stream_holds_its_head_and_at_most_its_window(cert: Pair) -> None:
    async def main() -> None:
        gate = Gate()
        async with h2_server(cert, gate) as srv:
            admission = srv.admission
            c = await H2Client.connect("127.0.0.1", srv.port)
            await c.until(lambda: c.conn.remote_settings.initial_window_size == WINDOW)
            queued = post(c, MIB)
            await asyncio.wait_for(gate.entered.wait(), 5)
            send(c, queued, b"q" * WINDOW)  # all the stream window lets it send
            await asyncio.sleep(0.3)
            # Not acknowledged while queued: the client may send nothing more on it.
            assert c.conn.local_flow_control_window(queued.sid) == 0 and srv.withheld() == WINDOW
            assert WINDOW <= admission.buffered < WINDOW + 1024, admission.buffered  # head + the window, not 1 MiB
            # Another stream of the connection is not stalled by it.
            other = post(c, 3)
            await until(lambda: len(gate.waiting) == 2)
            gate.grant(1)
            send(c, other, b"abc", end=True)
            await c.response(other)
            assert other.status == 201 and other.data == b"3"
            # Granted: the window reopens, the rest comes, the handler has the whole body and the grant.
            grant = gate.grant(0)
            await c.until(lambda: c.conn.local_flow_control_window(queued.sid) > 0)
            rest = MIB - WINDOW
            while rest:
                await c.until(lambda: c.conn.local_flow_control_window(queued.sid) > 0)
                n = min(rest, c.conn.local_flow_control_window(queued.sid), c.conn.max_outbound_frame_size)
                rest -= n
                send(c, queued, b"q" * n, end=not rest)
            await c.response(queued)
            assert queued.status == 201 and queued.data == b"%d" % MIB
            assert (MIB, grant) in gate.handled and grant.released == 1
            await until(lambda: admission.buffered == 0)
            await c.close()

    asyncio.run(main())


def test_h2_a_refused_stream_is_answered_and_its_window_given_back(cert: Pair) -> None:
    async def main() -> None:
        gate = Gate()
        async with h2_server(cert, gate) as srv:
            admission = srv.admission
            c = await H2Client.connect("127.0.0.1", srv.port)
            await c.until(lambda: c.conn.remote_settings.initial_window_size == WINDOW)
            refused = post(c, MIB)
            await asyncio.wait_for(gate.entered.wait(), 5)
            send(c, refused, b"r" * WINDOW)
            await asyncio.sleep(0.1)
            gate.refuse()
            await c.response(refused)
            assert refused.status == 429 and gate.handled == []
            assert srv.withheld() == 0  # the connection's window is given back for what it sent
            await until(lambda: admission.buffered == 0)
            # The connection goes on.
            after = c.request("/y", method="POST", body=b"abcd", headers=[("content-length", "4")])
            await until(lambda: len(gate.waiting) == 2)
            gate.grant(1)
            await c.response(after)
            assert after.status == 201 and after.data == b"4"
            await c.close()

    asyncio.run(main())


def test_h2_a_stream_reset_while_queued_leaves_its_queue(cert: Pair) -> None:
    async def main() -> None:
        gate = Gate()
        async with h2_server(cert, gate) as srv:
            admission = srv.admission
            c = await H2Client.connect("127.0.0.1", srv.port)
            await c.until(lambda: c.conn.remote_settings.initial_window_size == WINDOW)
            stream = post(c, MIB)
            await asyncio.wait_for(gate.entered.wait(), 5)
            send(c, stream, b"s" * 1000)
            c.conn.reset_stream(stream.sid)
            c.flush()
            await until(lambda: gate.cancelled == 1)
            assert srv.withheld() == 0
            await until(lambda: admission.buffered == 0 and admission.h2_streams == 0)
            assert gate.handled == []
            await c.close()

    asyncio.run(main())
