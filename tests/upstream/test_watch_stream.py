"""The reflector's watch stream reader (``UpstreamClient.watch_into``) against a real socket.

The upstream here is a raw asyncio server, so each test decides exactly which bytes arrive in
which read: events split across reads and chunks, a Status answer, a stall, a stream cut short.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import orjson

from watchcache.resources import PODS
from watchcache.upstream.client import UpstreamClient, UpstreamError, WatchStalled
from watchcache.upstream.config import UpstreamConfig

Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


def event(rv: int) -> bytes:
    return orjson.dumps({"type": "ADDED", "object": {"metadata": {"name": f"p{rv}", "resourceVersion": str(rv)}}})


async def run(serve: Serve, *, stall: float = 5.0) -> tuple[list[list[bytes]], list[bytes], BaseException | None]:
    """Watch the server once; the batches handed over, the request it got, and how the watch ended."""
    requests: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        requests.append(await reader.readuntil(b"\r\n\r\n"))
        try:
            await serve(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = UpstreamClient(UpstreamConfig(server=f"http://127.0.0.1:{port}", token="t0k"))
    await client.start()
    batches: list[list[bytes]] = []
    error: BaseException | None = None
    try:
        await client.watch_into(PODS, {"resourceVersion": "5"}, batches.append, stall_timeout=stall)
    except Exception as e:
        error = e
    finally:
        await client.close()
        server.close()
    return batches, requests, error


def test_each_read_hands_over_its_complete_lines_in_order_and_the_end_of_the_stream_returns() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = event(6) + b"\n" + event(7)[:10]
        writer.write(HEAD + chunk(first))
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(chunk(event(7)[10:] + b"\n"))  # the rest of the line, in the next read
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(chunk(event(8) + b"\n") + b"0\r\n\r\n")

    batches, requests, error = asyncio.run(run(serve))
    assert error is None
    assert batches == [[event(6)], [event(7)], [event(8)]]
    head = requests[0].decode()
    assert head.startswith("GET /api/v1/pods?watch=1&resourceVersion=5 HTTP/1.1\r\n")
    assert "Authorization: Bearer t0k\r\n" in head and "Accept: application/json\r\n" in head
    assert "Host: 127.0.0.1:" in head  # not the scheme's default port: named


def test_a_status_answer_is_an_upstream_error_with_its_status() -> None:
    status = {"kind": "Status", "apiVersion": "v1", "code": 410, "reason": "Expired", "message": "too old"}

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        body = orjson.dumps(status)
        writer.write(b"HTTP/1.1 410 Gone\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
        writer.write(body)

    batches, _, error = asyncio.run(run(serve))
    assert isinstance(error, UpstreamError) and error.code == 410 and error.reason == "Expired"
    assert batches == []


def test_a_silent_stream_is_stalled_after_the_stall_timeout() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(HEAD + chunk(event(6) + b"\n"))
        await writer.drain()
        await asyncio.sleep(5)

    async def timed() -> tuple[float, BaseException | None, list[list[bytes]]]:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        batches, _, error = await run(serve, stall=0.3)
        return loop.time() - t0, error, batches

    elapsed, error, batches = asyncio.run(timed())
    assert isinstance(error, WatchStalled)
    assert batches == [[event(6)]]
    assert 0.25 < elapsed < 2.0


def test_data_keeps_a_slow_stream_alive_past_the_stall_timeout() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(HEAD)
        for rv in range(6, 12):
            await asyncio.sleep(0.1)
            writer.write(chunk(event(rv) + b"\n"))
            await writer.drain()
        writer.write(b"0\r\n\r\n")

    batches, _, error = asyncio.run(run(serve, stall=0.25))
    assert error is None
    assert [line for batch in batches for line in batch] == [event(rv) for rv in range(6, 12)]


def test_a_stream_cut_short_is_a_connection_error() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(HEAD + chunk(event(6) + b"\n"))
        await writer.drain()

    batches, _, error = asyncio.run(run(serve))
    assert isinstance(error, ConnectionError)
    assert batches == [[event(6)]]


def test_what_the_consumer_raises_ends_the_watch_with_it() -> None:
    class Gone(Exception):
        pass

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(HEAD + chunk(event(6) + b"\n"))
        await writer.drain()
        await asyncio.sleep(5)

    async def main() -> BaseException | None:
        server = await asyncio.start_server(lambda r, w: _served(r, w, serve), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = UpstreamClient(UpstreamConfig(server=f"http://127.0.0.1:{port}"))
        await client.start()

        def on_lines(lines: list[bytes]) -> None:
            raise Gone("410 in an ERROR event")

        try:
            await client.watch_into(PODS, {}, on_lines, stall_timeout=5.0)
        except Gone as e:
            return e
        finally:
            await client.close()
            server.close()
        return None

    assert isinstance(asyncio.run(main()), Gone)


async def _served(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, serve: Serve) -> None:
    await reader.readuntil(b"\r\n\r\n")
    try:
        await serve(reader, writer)
    finally:
        writer.close()


def test_a_garbled_answer_is_a_connection_error_the_reflector_backs_off_from() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")

    _, _, error = asyncio.run(run(serve))
    assert isinstance(error, ConnectionError)
