"""Short requests on pooled connections (``upstream/exchange.py``) against a real local server.

The server is a raw asyncio one whose answers each test scripts byte for byte, so the framing
cases the pass-through meets (Content-Length, chunked, unframed until close, interim 1xx, a
keep-alive connection the server closed while it idled) are exercised on real sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest

from watchcache.upstream import exchange as ex
from watchcache.upstream.client import UpstreamClient
from watchcache.upstream.config import UpstreamConfig
from watchcache.upstream.exchange import Exchanges
from watchcache.upstream.identity import Route

Script = Callable[[bytes, int], list[bytes] | None]


def sync(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Runs an async test on its own loop (the suite runs no asyncio plugin)."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


class Server:
    """Answers each request (read up to its blank line) with what ``script(request, n)`` returns:
    the chunks to write (a final ``b""`` closes the connection), None to close without a word."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[bytes] = []
        self.connections = 0
        self.server: asyncio.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.requests.append(head)
                chunks = self.script(head, len(self.requests))
                if chunks is None:
                    writer.close()
                    return
                for chunk in chunks:
                    if chunk == b"":
                        writer.close()
                        return
                    writer.write(chunk)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def dial(self, protocol: asyncio.Protocol) -> object:
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        return await asyncio.get_running_loop().create_connection(lambda: protocol, "127.0.0.1", port)


@contextlib.asynccontextmanager
async def serving(script: Script) -> AsyncIterator[Server]:
    srv = Server(script)
    srv.server = await asyncio.start_server(srv.handle, "127.0.0.1", 0)
    try:
        yield srv
    finally:
        for w in srv.writers:
            w.close()
        srv.server.close()
        await srv.server.wait_closed()


def ok(body: bytes, extra: bytes = b"") -> list[bytes]:
    return [
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        + extra
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    ]


REQUEST = b"GET /api/v1/namespaces/a/configmaps/b HTTP/1.1\r\nHost: x\r\n\r\n"


async def read_all(answer: ex.Answer) -> bytes:
    out = []
    while chunks := await answer.more():
        out.extend(chunks)
    return b"".join(out)


@sync
async def test_a_connection_is_reused_for_the_next_request() -> None:
    async with serving(lambda req, n: ok(b'{"n":%d}' % n)) as srv:
        pool = Exchanges()
        for n in (1, 2, 3):
            answer = await pool.request("r", srv.dial, REQUEST)
            await answer.settle()
            assert answer.complete and answer.status == 200
            assert b"".join(answer.chunks) == b'{"n":%d}' % n
            assert (b"content-type", b"application/json") in [(k.lower(), v) for k, v in answer.headers]
            pool.finish(answer)
        assert srv.connections == 1
        assert srv.requests == [REQUEST] * 3


@sync
async def test_a_reused_connection_closed_before_answering_is_retried_once_on_a_new_one() -> None:
    # The pooled connection is closed by the server when the second request arrives (an idle
    # timeout racing the request): that request goes out again on a new connection.
    def script(req: bytes, n: int) -> list[bytes] | None:
        return None if n == 2 else ok(b"answer %d" % n)

    async with serving(script) as srv:
        pool = Exchanges()
        answer = await pool.request("r", srv.dial, REQUEST)
        assert await read_all(answer) == b"answer 1"
        pool.finish(answer)
        answer = await pool.request("r", srv.dial, REQUEST)
        assert await read_all(answer) == b"answer 3"
        assert srv.connections == 2 and len(srv.requests) == 3


@sync
async def test_a_new_connection_that_fails_is_not_retried() -> None:
    async with serving(lambda req, n: None) as srv:
        pool = Exchanges()
        with pytest.raises(ConnectionError):
            await pool.request("r", srv.dial, REQUEST)
        assert srv.connections == 1


@sync
async def test_chunked_and_interim_answers() -> None:
    chunked = [
        b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-A: 1\r\n\r\n",
        b"3\r\nabc\r\n",
        b"2\r\nde\r\n0\r\n\r\n",
    ]
    async with serving(lambda req, n: chunked) as srv:
        pool = Exchanges()
        answer = await pool.request("r", srv.dial, REQUEST)
        assert answer.status == 200
        assert [k for k, _ in answer.headers] == [b"Transfer-Encoding", b"X-A"]  # not the 103's Link
        assert await read_all(answer) == b"abcde"
        pool.finish(answer)
        answer = await pool.request("r", srv.dial, REQUEST)  # and the connection is still good
        assert await read_all(answer) == b"abcde"
        assert srv.connections == 1


@sync
async def test_an_unframed_body_ends_with_the_connection_which_is_not_reused() -> None:
    async with serving(lambda req, n: [b"HTTP/1.1 200 OK\r\n\r\n", b"until ", b"close", b""]) as srv:
        pool = Exchanges()
        answer = await pool.request("r", srv.dial, REQUEST)
        assert await read_all(answer) == b"until close"
        pool.finish(answer)
        answer = await pool.request("r", srv.dial, REQUEST)
        assert await read_all(answer) == b"until close"
        assert srv.connections == 2


@sync
async def test_a_connection_closed_mid_body_is_an_error_for_the_reader() -> None:
    async with serving(lambda req, n: [b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial", b""]) as srv:
        pool = Exchanges()
        answer = await pool.request("r", srv.dial, REQUEST)
        with pytest.raises(ConnectionError):
            await read_all(answer)


@sync
async def test_a_large_answer_pauses_reading_and_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ex, "BUFFERED_MAX", 64 * 1024)
    body = bytes(range(256)) * 4096  # 1 MiB
    pieces = [body[i : i + 16384] for i in range(0, len(body), 16384)]
    async with serving(lambda req, n: [b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body), *pieces]) as srv:
        pool = Exchanges()
        answer = await pool.request("r", srv.dial, REQUEST)
        await answer.settle()
        assert not answer.complete  # held up to the limit, then reading paused
        conn = answer.connection
        assert conn is not None and conn.paused
        assert answer.buffered < 2 * 64 * 1024
        assert await read_all(answer) == body
        pool.finish(answer)
        assert srv.connections == 1


@sync
async def test_a_large_answer_that_ends_while_reading_is_paused_leaves_a_reusable_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The whole answer arrives in one read, past the limit: reading pauses and the message ends in the
    # same read. The pooled connection must read again, or the next request's answer never comes.
    monkeypatch.setattr(ex, "BUFFERED_MAX", 1024)
    body = b"x" * 8192
    async with serving(lambda req, n: ok(body + b"%d" % n)) as srv:
        pool = Exchanges()
        for n in (1, 2, 3):
            answer = await asyncio.wait_for(pool.request("r", srv.dial, REQUEST), 5)
            assert await asyncio.wait_for(read_all(answer), 5) == body + b"%d" % n
            pool.finish(answer)
        assert srv.connections == 1


@sync
async def test_an_answer_left_midway_closes_its_connection() -> None:
    async with serving(lambda req, n: [b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n12345"]) as srv:
        pool = Exchanges()
        answer = await pool.request("r", srv.dial, REQUEST)
        pool.finish(answer)  # the caller gave up (its client left, its deadline passed)
        conn = answer.connection
        assert conn is not None and not conn.open
        assert pool.pools["r"].idle == []


@sync
async def test_a_garbled_answer_is_a_connection_error() -> None:
    async with serving(lambda req, n: [b"NOT HTTP AT ALL\r\n\r\n"]) as srv:
        pool = Exchanges()
        with pytest.raises(ConnectionError):
            await pool.request("r", srv.dial, REQUEST)


@sync
async def test_idle_connections_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ex, "IDLE_MAX", 2)
    async with serving(lambda req, n: ok(b"x")) as srv:
        pool = Exchanges()
        answers = await asyncio.gather(*(pool.request("r", srv.dial, REQUEST) for _ in range(5)))
        for a in answers:
            await a.settle()
            pool.finish(a)
        assert srv.connections == 5
        assert len(pool.pools["r"].idle) == 2


@sync
async def test_a_steady_concurrency_above_the_old_idle_bound_dials_no_more_connections() -> None:
    """64 concurrent exchanges, round after round: each round's answers come back together, and a
    pool that kept 32 of them idle dialed 32 new connections each round (a TLS handshake each)."""
    async with serving(lambda req, n: ok(b"x")) as srv:
        pool = Exchanges()
        for _ in range(4):
            answers = await asyncio.gather(*(pool.request("r", srv.dial, REQUEST) for _ in range(64)))
            for a in answers:
                await a.settle()
                pool.finish(a)
        assert srv.connections == 64
        assert len(pool.pools["r"].idle) == 64


@sync
async def test_connections_a_burst_left_idle_age_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ex, "IDLE_SECONDS", 0.3)
    async with serving(lambda req, n: ok(b"x")) as srv:
        pool = Exchanges()

        async def one() -> ex.Answer:
            a = await pool.request("r", srv.dial, REQUEST)
            await a.settle()
            pool.finish(a)
            return a

        burst = await asyncio.gather(*(pool.request("r", srv.dial, REQUEST) for _ in range(10)))
        for a in burst:
            await a.settle()
            pool.finish(a)
        assert len(pool.pools["r"].idle) == 10
        await asyncio.sleep(0.2)
        kept = (await one()).connection  # the most recently used, still fresh: reused
        await asyncio.sleep(0.15)
        assert (await one()).connection is kept
        # Its return closed the 9 others, idle 0.35 s by then: past IDLE_SECONDS.
        assert srv.connections == 10
        assert pool.pools["r"].idle == [kept]
        assert sum(c.connection.open for c in burst if c.connection is not None) == 1


@sync
async def test_the_client_writes_the_request_line_host_and_header_lines_as_given() -> None:
    async with serving(lambda req, n: ok(b"{}")) as srv:
        assert srv.server is not None
        port = srv.server.sockets[0].getsockname()[1]
        client = UpstreamClient(UpstreamConfig(server=f"http://user@127.0.0.1:{port}/prefix/"))
        lines = [("accept", "application/json"), ("impersonate-user", "jos\xe9"), ("x-b", "1"), ("x-b", "2")]
        answer = await client._exchange(Route.CLIENT, None, "/api/v1/namespaces?limit=1", lines)
        assert await read_all(answer) == b"{}"
        client.exchanges.finish(answer)  # type: ignore[union-attr]
        assert srv.requests == [
            b"GET /prefix/api/v1/namespaces?limit=1 HTTP/1.1\r\nHost: 127.0.0.1:%d\r\naccept: application/json\r\n"
            b"impersonate-user: jos\xc3\xa9\r\nx-b: 1\r\nx-b: 2\r\n\r\n" % port  # a value beyond ASCII: UTF-8
        ]
        client.exchanges.close()  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("name", "value"), [("x-a", "1\r\nx-injected: 1"), ("x-a", "a\nb"), ("x-a", "a\x00b"), ("x-\xe9", "v")]
)
def test_a_header_line_that_cannot_be_written_is_refused_before_any_connection(name: str, value: str) -> None:
    client = UpstreamClient(UpstreamConfig(server="http://127.0.0.1:1"))
    lines = [("accept", "application/json"), ("x-fine", "jos\xe9"), (name, value)]
    with pytest.raises(ValueError, match=f"header {name!r} has a value that cannot be written"):
        asyncio.run(client._exchange(Route.CLIENT, None, "/api", lines))


@sync
async def test_send_now_goes_out_only_on_an_idle_pooled_connection_and_never_dials() -> None:
    async with serving(lambda req, n: ok(b"answer %d" % n)) as srv:
        pool = Exchanges()
        assert pool.send_now("r", REQUEST) is None  # no pool yet: nothing dialed, nothing sent
        answer = await pool.request("r", srv.dial, REQUEST)
        assert await read_all(answer) == b"answer 1"
        pool.finish(answer)  # (complete: its connection went back to the pool as it ended)
        early = pool.send_now("r", REQUEST)
        assert early is not None  # written at once, before anything awaits it
        assert pool.send_now("r", REQUEST) is None  # its one connection is busy with it
        assert await pool.answer_of(early) is early and await read_all(early) == b"answer 2"
        assert srv.connections == 1 and srv.requests == [REQUEST] * 2


@sync
async def test_an_early_answer_whose_pooled_connection_was_closed_is_sent_again_on_a_new_one() -> None:
    # As ``request`` retries: the server closes the pooled connection as the early request arrives.
    def script(req: bytes, n: int) -> list[bytes] | None:
        return None if n == 2 else ok(b"answer %d" % n)

    async with serving(script) as srv:
        assert srv.server is not None
        port = srv.server.sockets[0].getsockname()[1]
        client = UpstreamClient(UpstreamConfig(server=f"http://127.0.0.1:{port}"))
        lines = [("accept", "application/json")]
        answer = await client.exchange(Route.CLIENT, "/api/v1/namespaces/a/configmaps/b", lines)
        assert await read_all(answer) == b"answer 1"
        client.exchanges.finish(answer)  # type: ignore[union-attr]
        early = client.exchange_now(Route.CLIENT, "/api/v1/namespaces/a/configmaps/b", lines)
        assert early is not None
        assert await client.exchanges.answer_of(early) is None  # type: ignore[union-attr] # closed first
        answer = await client.exchange(Route.CLIENT, "/api/v1/namespaces/a/configmaps/b", lines, early=early)
        assert answer is not early and await read_all(answer) == b"answer 3"
        assert srv.connections == 2 and len(srv.requests) == 3
        client.exchanges.close()  # type: ignore[union-attr]


def test_exchange_now_refuses_an_unwritable_header_without_sending() -> None:
    client = UpstreamClient(UpstreamConfig(server="http://127.0.0.1:1"))
    assert client.exchange_now(Route.CLIENT, "/api", [("x-a", "1\r\nx-injected: 1")]) is None
