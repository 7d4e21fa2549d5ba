"""Upgrade requests at the HTTP layer: the handler switches protocols or answers, and the
connection is never parsed as HTTP again (server on a uvloop thread: tests/support/serverthread.py)."""

from __future__ import annotations

import asyncio
import socket
from typing import BinaryIO

from tests.support.http1 import GET, Reply, at_eof, exchange, read_reply
from tests.support.serverthread import Serve, ServerThread
from watchcache.http.flowcontrol import ConnectionClosed
from watchcache.http.request import Request
from watchcache.http.response import Response

UPGRADE = b"GET /echo HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n"
SWITCHED = b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n"


class Echo(asyncio.Protocol):
    """The switched protocol: upper-cases what it receives; answers EOF with "BYE" and closes."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.done = asyncio.get_running_loop().create_future()
        self.paused = 0

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data.upper())

    def eof_received(self) -> bool:
        assert self.transport is not None
        self.transport.write(b"BYE")
        self.transport.close()  # a half-closed transport never closes by itself
        return True

    def pause_writing(self) -> None:
        self.paused += 1

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


async def switching(req: Request, resp: Response) -> None:
    if req.upgrade is None:
        resp.send(200, b'{"upgrade":null}')
        return
    if req.upgrade != "echo":
        resp.send(400, b'{"kind":"Status"}')
        return
    echo = Echo()
    echo.transport, early = resp.switch_protocols(SWITCHED, echo)
    if early:
        echo.data_received(early)
    await echo.done


def test_switch_protocols_forwards_early_bytes_then_echoes_and_half_closes(serve: Serve) -> None:
    srv = serve(switching)
    sock = srv.connect()
    # The first tunnel bytes travel in the same packet as the request head.
    sock.sendall(UPGRADE % b"echo" + b"early ")
    f: BinaryIO = sock.makefile("rb")
    reply = read_reply(f, head_only=True)
    assert reply.status == 101 and reply.headers["upgrade"] == "echo"
    assert f.read(6) == b"EARLY "
    sock.sendall(b"GET / HTTP/1.1\r\n\r\n")  # not HTTP any more: echoed, not answered
    assert f.read(18) == b"GET / HTTP/1.1\r\n\r\n"
    sock.shutdown(socket.SHUT_WR)
    assert f.read() == b"BYE"


def test_an_upgrade_answered_without_switching_closes_the_connection(serve: Serve) -> None:
    srv = serve(switching)
    # Pipelined: a plain request first (kept alive), then an upgrade refused, then bytes after it.
    raw = GET % b"/plain" + UPGRADE % b"other" + GET % b"/never"
    sock = srv.connect()
    sock.sendall(raw)
    f: BinaryIO = sock.makefile("rb")
    first = read_reply(f)
    assert first.status == 200 and first.body == b'{"upgrade":null}'
    second = read_reply(f)
    assert second.status == 400 and second.headers["connection"] == "close"
    assert at_eof(f)  # what followed the upgrade head was never parsed as a request


def test_upgrade_with_a_body_or_connect_is_400(serve: Serve) -> None:
    srv = serve(switching)
    body = b"POST /echo HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: echo\r\nContent-Length: 3\r\n\r\nabc"
    reply, f = exchange(srv, body)
    assert reply.status == 400 and b"cannot carry a body" in reply.body
    assert at_eof(f)
    reply, _ = exchange(srv, b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com\r\n\r\n")
    assert reply.status == 400 and b"CONNECT" in reply.body


def test_upgrade_header_without_connection_upgrade_is_a_plain_request(serve: Serve) -> None:
    reply, _ = exchange(serve(switching), b"GET / HTTP/1.1\r\nUpgrade: echo\r\n\r\n")
    assert reply == Reply(reply.status, reply.headers, b'{"upgrade":null}')
    assert "connection" not in reply.headers


def test_a_client_gone_before_the_switch_is_seen_by_the_switched_protocol(serve: Serve) -> None:
    """Reading pauses after an upgrade head, so the close is noticed once the new protocol reads."""
    seen: list[str] = []

    async def slow(req: Request, resp: Response) -> None:
        await asyncio.sleep(0.3)
        echo = Echo()
        try:
            echo.transport, _ = resp.switch_protocols(SWITCHED, echo)
        except ConnectionClosed:
            seen.append("closed before the switch")
            return
        await asyncio.wait_for(echo.done, 5)
        seen.append("lost after the switch")

    srv: ServerThread = serve(slow)
    sock = srv.connect()
    sock.sendall(UPGRADE % b"echo")
    sock.close()

    async def wait() -> None:
        while not seen:
            await asyncio.sleep(0.01)

    srv.call(wait())
    assert seen in (["lost after the switch"], ["closed before the switch"])
