"""Short requests to the upstream on pooled keep-alive connections: one write out, one parse in.

A consistent GET goes to the upstream (kube-apiserver reads it from etcd), so what the proxy adds to
it is all its client's cost; so do discovery, uncached kinds and the other short pass-throughs.
aiohttp's client cost ~190 µs of CPU per TLS GET here (headers built through multidicts, the
request written in two TLS records, the answer read through its stream classes), ~40 % of the
proxy's CPU for a passed-through GET (py-spy; docs/performance.md, "Consistent GETs"). This path
writes the request as one buffer and parses the answer with httptools (llhttp) in the protocol's
own callbacks, as the reflectors' watch streams do (``upstream/client.py`` ``_WatchStream``).

What it is for: requests without a body that end (no watch, no ``logs -f``), on a direct
connection (through an http(s)/socks proxy, aiohttp's path stays). The answer is held (up to
``BUFFERED_MAX`` bytes, reading paused beyond) so a small one goes to the client whole, with a
Content-Length, in one write; a larger one is streamed as it comes.

A connection taken from the pool may have been closed by the upstream in the meantime (its idle
timeout); a request that fails on one before any byte of the answer came is sent once more on a
new connection, as Go's transport retries an idempotent request (``shouldRetryRequest``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field

import httptools

__all__ = ["Answer", "Exchanges"]

#: Bytes of an answer held before reading pauses (and a small answer is sent whole).
BUFFERED_MAX = 1 << 20
#: How long a connection idles before it is closed (as connections come back) or not reused; and a
#: bound on the idle connections kept per route besides that age. Not a tight bound: a connection is
#: dialed only when every pooled one is busy, so the pool holds at most the exchanges that were in
#: flight at once in the last IDLE_SECONDS. A tight one (it was 32) closed connections that the
#: next moment dialed again: 64 concurrent pass-throughs dialed a TLS connection for 18% of their
#: requests (docs/performance.md, "Noisy neighbour").
IDLE_SECONDS = 30.0
IDLE_MAX = 1024

#: Opens a connection to the upstream for this protocol instance.
Dial = Callable[[asyncio.Protocol], Awaitable[object]]


@dataclass(eq=False, slots=True)
class Answer:
    """One response as it arrives: its head, then its body's chunks (read with ``settle``/``more``)."""

    status: int = 0
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    chunks: list[bytes] = field(default_factory=list)
    buffered: int = 0
    complete: bool = False
    error: BaseException | None = None
    connection: _Connection | None = None
    waiter: asyncio.Future[None] | None = None
    has_head: bool = False

    def framed(self) -> bool:
        """Transfer-Encoding or Content-Length: without either the body ends with the connection.
        Asked only when the connection ends mid-answer, so not worked out per header line."""
        return any(name.lower() in (b"content-length", b"transfer-encoding") for name, _ in self.headers)

    def wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def _wait(self) -> asyncio.Future[None]:
        """A future for ``wake`` to complete (awaited as it is: no coroutine per wait). One left done
        or cancelled is harmless: ``wake`` skips it, the next wait replaces it."""
        # The connection's loop (this runs on it): get_running_loop() costs a getpid() system call.
        conn = self.connection
        waiter = self.waiter = (asyncio.get_running_loop() if conn is None else conn.loop).create_future()
        return waiter

    async def head(self) -> None:
        """Until the status line and headers came (raises the connection's error)."""
        while not self.has_head and self.error is None:
            await self._wait()
        if not self.has_head and self.error is not None:
            raise self.error

    async def settle(self) -> None:
        """Until the answer is complete or ``BUFFERED_MAX`` bytes of it are held."""
        while not self.complete and self.error is None and self.buffered < BUFFERED_MAX:
            await self._wait()

    async def more(self) -> list[bytes]:
        """The chunks held (reading resumed if it was paused), waiting for one; ``[]`` at the end.
        Raises the connection's error if it ended the answer early."""
        while not self.chunks and not self.complete and self.error is None:
            await self._wait()
        if self.chunks:
            out, self.chunks, self.buffered = self.chunks, [], 0
            conn = self.connection
            if conn is not None and conn.answer is self:
                conn.resume()
            return out
        if self.error is not None and not self.complete:
            raise self.error
        return []


class _Connection(asyncio.Protocol):
    """One keep-alive connection: at most one exchange at a time (no pipelining, as Go's transport)."""

    def __init__(self, pool: _Pool) -> None:
        self.pool = pool
        self.loop = asyncio.get_running_loop()
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.answer: Answer | None = None
        self.open = False
        self.paused = False
        self.reused = False
        self.idle_since = 0.0

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.open = True

    def data_received(self, data: bytes) -> None:
        answer = self.answer
        if answer is None:  # nothing asked: an idle connection does not talk (a 408 before closing)
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(ConnectionError("the upstream switched protocols on a request that asked for none"))
        except httptools.HttpParserError as e:
            self._fail(ConnectionError(f"bad answer from the upstream: {e}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        self.pool.discard(self)
        answer = self.answer
        if answer is not None and not answer.complete:
            if answer.has_head and not answer.framed():
                answer.complete = True  # an unframed body ends with the connection
                answer.wake()
            else:
                answer.error = ConnectionResetError(f"upstream closed the connection: {exc or 'EOF'}")
                answer.wake()

    # -- httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.answer.headers.append((name, value))  # type: ignore[union-attr] # (asked: ``data_received``)

    def on_headers_complete(self) -> None:
        answer = self.answer
        assert answer is not None
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # interim (103 Early Hints): its headers are not the answer's
            answer.headers.clear()
            return
        answer.status = status
        answer.has_head = True
        answer.wake()

    def on_body(self, body: bytes) -> None:
        answer = self.answer
        assert answer is not None
        answer.chunks.append(body)
        answer.buffered += len(body)
        if answer.buffered >= BUFFERED_MAX and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        answer.wake()

    def on_message_complete(self) -> None:
        answer = self.answer
        assert answer is not None
        if not answer.has_head:
            return
        answer.complete = True
        keep = self.parser.should_keep_alive()
        answer.wake()
        self.answer = None
        if keep and self.open:
            # Its body is held in the answer now: reading resumes for the next request (a connection
            # pooled paused would never see that request's answer).
            self.resume()
            self.pool.put(self)
        else:
            self.close()

    # --
    def send(self, request: bytes, answer: Answer) -> None:
        assert self.transport is not None
        self.answer = answer
        answer.connection = self
        self.transport.write(request)

    def resume(self) -> None:
        if self.paused and self.transport is not None and self.open:
            self.paused = False
            self.transport.resume_reading()

    def _fail(self, error: BaseException) -> None:
        if self.answer is not None and not self.answer.complete:
            self.answer.error = error
            self.answer.wake()
        self.close()

    def close(self) -> None:
        self.open = False
        self.pool.discard(self)
        if self.transport is not None:
            self.transport.close()


class _Pool:
    """The idle connections of one route, least recently used first (taken from the end)."""

    def __init__(self) -> None:
        self.idle: list[_Connection] = []

    def take(self, now: float) -> _Connection | None:
        while self.idle:
            conn = self.idle.pop()
            if conn.open and now - conn.idle_since < IDLE_SECONDS:
                return conn
            conn.close()
        return None

    def put(self, conn: _Connection) -> None:
        now = conn.idle_since = time.monotonic()
        conn.reused = True
        idle = self.idle
        idle.append(conn)
        # Those a burst left behind age out (the least recently used, at the front, first).
        while len(idle) > IDLE_MAX or now - idle[0].idle_since >= IDLE_SECONDS:
            idle.pop(0).close()

    def discard(self, conn: _Connection) -> None:
        with contextlib.suppress(ValueError):
            self.idle.remove(conn)

    def close(self) -> None:
        while self.idle:
            self.idle.pop().close()


class Exchanges:
    """Pooled keep-alive connections per route (a TLS identity), and requests on them."""

    def __init__(self, connect_timeout: float = 10.0) -> None:
        self.connect_timeout = connect_timeout
        self.pools: dict[Hashable, _Pool] = {}

    async def request(self, route: Hashable, dial: Dial, request: bytes) -> Answer:
        """Send ``request`` (a whole HTTP/1.1 request without a body) and return once its answer's
        head came. The caller reads the body (``Answer.settle``/``more``) and calls ``finish``.

        Raises ``OSError``/``ConnectionError`` when the upstream cannot be reached or ends the
        connection before answering, ``TimeoutError`` when connecting takes ``connect_timeout``.
        """
        pool = self.pools.get(route)
        if pool is None:
            pool = self.pools[route] = _Pool()
        conn = pool.take(time.monotonic())
        for attempt in (0, 1):
            if conn is None:
                conn = _Connection(pool)
                async with asyncio.timeout(self.connect_timeout):
                    await dial(conn)
            answer = Answer()
            conn.send(request, answer)
            try:
                await answer.head()
                return answer
            except ConnectionError:
                # Closed under a reused connection before any answer: once more on a new one.
                if attempt or not conn.reused:
                    raise
                conn = None
            except BaseException:
                conn.close()
                raise
        raise AssertionError("unreachable")

    def send_now(self, route: Hashable, request: bytes) -> Answer | None:
        """``request`` sent at once on an idle pooled connection of ``route``, without waiting: its
        answer (awaited with ``answer_of``), or None when no connection is idle (none is dialed)."""
        pool = self.pools.get(route)
        conn = None if pool is None else pool.take(time.monotonic())
        if conn is None:
            return None
        answer = Answer()
        conn.send(request, answer)
        return answer

    @staticmethod
    async def answer_of(answer: Answer) -> Answer | None:
        """``answer`` (of ``send_now``) once its head came; None when its pooled connection had been
        closed before any of it came: the caller sends the request once more (``request``)."""
        try:
            await answer.head()
            return answer
        except ConnectionError:
            return None
        except BaseException:
            if answer.connection is not None:
                answer.connection.close()
            raise

    @staticmethod
    def finish(answer: Answer) -> None:
        """The caller is done with ``answer``: a connection left mid-answer is closed, not reused."""
        conn = answer.connection
        if conn is not None and conn.answer is answer:
            conn.close()

    def close(self) -> None:
        for pool in self.pools.values():
            pool.close()
        self.pools.clear()
