"""One HTTP/2 stream's answer: a :class:`~watchcache.http.response.Response` whose body queues as DATA.

Nothing here writes to the socket. ``write_chunk`` appends the handler's bytes (cached object
bytes, shared watch frames: never copied or re-encoded here) to the stream's queue and marks
the stream for the connection's next pump (:mod:`watchcache.http.h2protocol`), which cuts the
queue into DATA frames as the stream's and the connection's flow-control windows allow and
writes every stream's frames of a pass in one ``transport.write``.

Back-pressure is the queue: above ``high_water`` unsent bytes (or while the transport itself
is paused) the stream is not ``writable``, and a watch keeps its frames in the watcher's
bounded buffer -- exactly the slow path of an HTTP/1.1 watcher whose socket is full. So a
stream whose window the client keeps closed costs its queue (at most ``high_water`` plus one
flush) and then the watcher's cap, and never holds back the other streams.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence
from email.utils import formatdate
from typing import TYPE_CHECKING

from watchcache.http.flowcontrol import ConnectionClosed
from watchcache.http.protocol import Request

if TYPE_CHECKING:
    from watchcache.http.h2protocol import H2Protocol

__all__ = ["CONNECTION_SPECIFIC", "H2Response"]

#: Header fields RFC 9113 8.2.2 forbids in HTTP/2 (Go's ``connHeaders``): never sent, refused in requests.
CONNECTION_SPECIFIC = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"})
_BODYLESS = frozenset({204, 304})
_CACHE_CONTROL = (b"cache-control", b"no-cache, private")
_date: tuple[int, bytes] = (0, b"")


def _date_value() -> bytes:
    """The Date header's value, formatted at most once per second."""
    global _date
    now = int(time.time())
    if now != _date[0]:
        _date = (now, formatdate(now, usegmt=True).encode("ascii"))
    return _date[1]


class H2Response:
    """The answer on one stream, and the request bytes it holds until that answer starts.

    State: ``finished`` (the handler ended the body) -> ``end_sent`` (the pump sent END_STREAM)
    or ``reset`` (either side reset the stream); the connection forgets the stream once its
    handler is done and it is ``end_sent`` or ``reset``.
    """

    __slots__ = (
        "_close_cbs",
        "_conn",
        "_drained",
        "body",
        "body_size",
        "body_timer",
        "end_sent",
        "finished",
        "handler_done",
        "head_only",
        "held",
        "out",
        "out_bytes",
        "remote_ended",
        "request",
        "request_complete",
        "reset",
        "sid",
        "started_",
        "status",
        "task",
    )

    def __init__(self, conn: H2Protocol, sid: int) -> None:
        self._conn = conn
        self.sid = sid
        self.request: Request | None = None
        # The request body as it arrives (bounded by --max-body-bytes), and whether it is all in.
        self.body: list[bytes] = []
        self.body_size = 0
        # The handler has the whole request (or the stream was refused): no more body is wanted.
        self.request_complete = False
        # The client ended its side of the stream (END_STREAM).
        self.remote_ended = False
        self.body_timer: asyncio.TimerHandle | None = None
        # Request bytes (head and body) counted in the server's Admission until the answer starts.
        self.held = 0
        self.task: asyncio.Task[None] | None = None
        self.head_only = False
        self.status = 0
        self.started_ = False
        self.finished = False
        self.handler_done = False
        self.end_sent = False
        self.reset = False
        # Unsent body bytes, in the pieces the handler wrote (a memoryview for a piece cut by a frame).
        self.out: deque[bytes | memoryview] = deque()
        self.out_bytes = 0
        self._drained: asyncio.Event | None = None
        self._close_cbs: list[Callable[[], None]] | None = None

    # ------------------------------------------------------------- Response

    def _head(self, status: int, content_type: str, length: int | None, headers: Sequence[tuple[str, str]]) -> None:
        self.status = status
        self.started_ = True
        conn = self._conn
        conn.answered(self)
        fields = [(b":status", b"%d" % status), (b"content-type", content_type.encode("latin-1"))]
        if length is not None and status not in _BODYLESS and status >= 200:
            fields.append((b"content-length", b"%d" % length))
        fields.append((b"date", _date_value()))
        if conn.server_header:
            fields.append((b"server", conn.server_header))
        fields.append(_CACHE_CONTROL)
        for name, value in headers:
            key = name.lower()
            if "\r" in value or "\n" in value or "\x00" in value:
                raise ValueError(f"invalid header value for {name!r}")
            if key in CONNECTION_SPECIFIC:
                # Go's http2 server: "Connection: close" from a handler means GOAWAY once idle.
                if key == "connection" and value.lower() == "close" and self.request is not None:
                    self.request.close_connection = True
                continue
            fields.append((key.encode("latin-1"), value.encode("latin-1")))
        conn.send_headers(self, fields)

    def send(
        self,
        status: int,
        body: bytes | Sequence[bytes],
        *,
        content_type: str = "application/json",
        headers: Sequence[tuple[str, str]] = (),
    ) -> None:
        if self.started_:
            raise RuntimeError("response already started")
        parts: Sequence[bytes] = (
            (bytes(body),)
            if isinstance(body, bytearray | memoryview)
            else ((body,) if isinstance(body, bytes) else body)
        )
        size = sum(map(len, parts))
        self._head(status, content_type, size, headers)
        if not (self.head_only or status in _BODYLESS or status < 200):
            self._queue(parts, size)
        self._finish()

    async def send_stream(
        self,
        status: int,
        parts: Sequence[bytes],
        *,
        content_type: str = "application/json",
        headers: Sequence[tuple[str, str]] = (),
        slice_bytes: int = 1 << 20,
    ) -> None:
        """As HTTP/1.1's: the parts are queued in slices, each once the stream has taken the last."""
        if self.started_:
            raise RuntimeError("response already started")
        size = sum(map(len, parts))
        self._head(status, content_type, size, headers)
        try:
            if self.head_only or status in _BODYLESS or status < 200:
                return
            batch: list[bytes] = []
            batch_bytes = 0
            for part in parts:
                batch.append(part)
                batch_bytes += len(part)
                if batch_bytes >= slice_bytes:
                    if self.closed:
                        return
                    self._queue(batch, batch_bytes)
                    batch = []
                    batch_bytes = 0
                    if not self.writable:
                        await self.drain()
            if batch:
                self._queue(batch, batch_bytes)
        except ConnectionClosed:
            return
        finally:
            self._finish()

    def start_chunked(
        self,
        status: int,
        *,
        content_type: str = "application/json",
        headers: Sequence[tuple[str, str]] = (),
    ) -> None:
        if self.started_:
            raise RuntimeError("response already started")
        self._head(status, content_type, None, headers)

    def write_chunk(self, parts: Sequence[bytes]) -> int:
        """Queue ``parts`` (their bytes as given) for this stream's next DATA frames."""
        if not self.started_:
            raise RuntimeError("write_chunk() before start_chunked()")
        if self.reset or self._conn.closing or self.head_only:
            return 0
        if self.finished:
            raise RuntimeError("write_chunk() after end_chunked()")
        size = sum(map(len, parts))
        if size:
            self._queue(parts, size)
        return size

    def end_chunked(self) -> None:
        if not self.finished:
            self._finish()

    def _queue(self, parts: Sequence[bytes], size: int) -> None:
        if self.reset or self._conn.closing or not size:
            return
        self.out.extend(parts)
        self.out_bytes += size
        self._conn.mark(self)

    def _finish(self) -> None:
        if not self.finished:
            self.finished = True
            self._conn.mark(self)

    @property
    def writable(self) -> bool:
        conn = self._conn
        return self.out_bytes <= conn.stream_high_water and conn.flow.writable and not self.reset

    async def drain(self) -> None:
        """Until this stream's queue is below its low-water mark and the transport takes bytes."""
        conn = self._conn
        while True:
            if self.reset or conn.closing:
                raise ConnectionClosed("stream closed")
            if not conn.flow.writable:
                await conn.flow.drain()
                continue
            if self.out_bytes <= conn.stream_low_water:
                return
            event = self._drained
            if event is None:
                event = self._drained = asyncio.Event()
            event.clear()
            await event.wait()

    def write_buffer_size(self) -> int:
        return self.out_bytes

    @property
    def closed(self) -> bool:
        return self.reset or self._conn.closing

    def add_close_callback(self, cb: Callable[[], None]) -> None:
        if self.reset or self._conn.lost:
            asyncio.get_running_loop().call_soon(cb)
        elif self._close_cbs is None:
            self._close_cbs = [cb]
        else:
            self._close_cbs.append(cb)

    @property
    def started(self) -> bool:
        return self.started_

    def abort(self) -> None:
        """Reset this stream only (INTERNAL_ERROR): its client sees it truncated, the others go on."""
        self._conn.reset_stream(self, internal=True)

    def switch_protocols(self, head: bytes, protocol: asyncio.Protocol) -> tuple[asyncio.Transport, bytes]:
        # Never reached: the connection answers an upgrade request on HTTP/2 with 400 itself.
        raise ConnectionClosed("connection upgrades need HTTP/1.1")

    # ------------------------------------------------------------- for the connection

    def take(self, limit: int) -> bytes | memoryview:
        """Up to ``limit`` queued bytes for one DATA frame: one piece as it is, or pieces joined."""
        out = self.out
        first = out[0]
        size = len(first)
        if size >= limit:
            if size == limit:
                out.popleft()
            else:
                view = first if isinstance(first, memoryview) else memoryview(first)
                out[0] = view[limit:]
                first = view[:limit]
                size = limit
            self.out_bytes -= size
            return first
        out.popleft()
        pieces = [first]
        while out and size < limit:
            piece = out[0]
            room = limit - size
            if len(piece) > room:
                view = piece if isinstance(piece, memoryview) else memoryview(piece)
                out[0] = view[room:]
                piece = view[:room]
            else:
                out.popleft()
            pieces.append(piece)
            size += len(piece)
        self.out_bytes -= size
        return b"".join(pieces)

    def wake_writers(self) -> None:
        """The queue went below the low-water mark: wake a ``drain``."""
        event = self._drained
        if event is not None:
            event.set()

    def gone(self) -> None:
        """The stream was reset or the connection lost: drop the queue, tell the handler."""
        self.reset = True
        self.out.clear()
        self.out_bytes = 0
        if self._drained is not None:
            self._drained.set()
        cbs, self._close_cbs = self._close_cbs, None
        for cb in cbs or ():
            try:
                cb()
            except Exception:
                self._conn.log_close_callback_failure()
