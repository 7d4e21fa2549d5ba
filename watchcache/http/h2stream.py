r"""One HTTP/2 stream: its request as it arrives, and its answer, a ``Response`` whose body queues as DATA.

Nothing here writes to the socket. ``write_chunk`` appends the handler's bytes (cached object
bytes, shared watch frames: never copied or re-encoded here) to the stream's queue and marks
the stream for the connection's next pump (:mod:`watchcache.http.h2protocol`), in which the
stream cuts its queue into DATA frames as its and the connection's flow-control windows allow
(``send_frames``), and the connection writes every stream's frames of a pass in one
``transport.write``.

Back-pressure is the queue: above ``high_water`` unsent bytes (or while the transport itself
is paused) the stream is not ``writable``, and a watch keeps its frames in the watcher's
bounded buffer -- exactly the slow path of an HTTP/1.1 watcher whose socket is full. So a
stream whose window the client keeps closed costs its queue (at most ``high_water`` plus one
flush) and then the watcher's cap, and never holds back the other streams.

The stream owns its state; the connection reads it and moves it only through the methods under
"for the connection" (the stream, in turn, asks of its connection only :class:`StreamConnection`)::

    request side:  open --begin--> receiving body --complete_request--> handled --handler_returned--> done
                        \--refuse (a Status, no handler)------------------------------------------/
    answer side:   (head) started --end of body--> finished --send_frames (END_STREAM)--> end_sent
                   any state --gone (either side reset it, or the connection was lost)--> reset

The connection forgets the stream once it is ``done``: its handler returned (or it had none)
and its answer is ``end_sent`` or ``reset`` with nothing left to send.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from email.utils import formatdate
from typing import Protocol

from h2.errors import ErrorCodes

from watchcache.http.flowcontrol import ConnectionClosed, FlowControl
from watchcache.http.request import Request, new_audit_id

__all__ = ["BLOCKED", "CONNECTION_SPECIFIC", "ENDED", "Framer", "H2Response", "StreamConnection"]

logger = logging.getLogger("watchcache.http.h2stream")

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


#: What :meth:`H2Response.send_frames` reports.
BLOCKED = 1
ENDED = 2


class Framer(Protocol):
    """The frames a stream writes on its own: the ``h2`` connection's state machine, for its stream id."""

    def local_flow_control_window(self, stream_id: int) -> int: ...

    def send_data(self, stream_id: int, data: bytes | memoryview, end_stream: bool = False) -> None: ...

    def end_stream(self, stream_id: int) -> None: ...

    def reset_stream(self, stream_id: int, error_code: ErrorCodes | int = 0) -> None: ...


class StreamConnection(Protocol):
    """What an :class:`H2Response` may ask of its connection (``h2protocol.H2Protocol``), and nothing else."""

    #: No more writes: we closed, or the peer did.
    closing: bool
    #: The peer is gone (``connection_lost`` was called).
    lost: bool
    #: The transport's pause/resume, and waiting for it.
    flow: FlowControl
    #: The ``server`` header's value, or empty.
    server_header: bytes
    #: A stream is not writable above ``stream_high_water`` unsent bytes; ``drain`` returns below the low mark.
    stream_high_water: int
    stream_low_water: int

    def answered(self, stream: H2Response) -> None:
        """``stream``'s answer starts: the request bytes it holds no longer count against the limits."""

    def send_headers(self, stream: H2Response, fields: list[tuple[bytes, bytes]]) -> None:
        """HEADERS for ``stream``, in the next pump."""

    def mark(self, stream: H2Response) -> None:
        """``stream`` has bytes (or its end) to send: in the next pump."""

    def reset_stream(self, stream: H2Response, *, internal: bool = False) -> None:
        """RST_STREAM (CANCEL, or INTERNAL_ERROR), and ``stream`` is gone."""


class H2Response:
    """One stream: the request bytes it holds until its answer starts, and that answer (a ``Response``)."""

    __slots__ = (
        "_body",
        "_body_size",
        "_body_timer",
        "_close_cbs",
        "_conn",
        "_drained",
        "_end_sent",
        "_finished",
        "_gated",
        "_handler_done",
        "_head_only",
        "_held",
        "_out",
        "_out_bytes",
        "_remote_ended",
        "_request",
        "_request_complete",
        "_reset",
        "_started",
        "_task",
        "_withheld",
        "sid",
        "status",
    )

    #: A handler that returned leaves its stream's answer as it is (``handler_done``): its handler
    #: stays for as long as its answer does.
    outlives_handler = False

    def __init__(self, conn: StreamConnection, sid: int) -> None:
        self._conn = conn
        self.sid = sid
        self._request: Request | None = None
        # The request body as it arrives (bounded by --max-body-bytes), and whether it is all in.
        self._body: list[bytes] = []
        self._body_size = 0
        # The handler has the whole request (or the stream was refused): no more body is wanted.
        self._request_complete = False
        # The client ended its side of the stream (END_STREAM).
        self._remote_ended = False
        self._body_timer: asyncio.TimerHandle | None = None
        # Admitted before its body (``Admit``): set once the body is in; None for any other stream.
        self._gated: asyncio.Future[None] | None = None
        # DATA received and not acknowledged (the window not reopened) while the stream is queued; -1
        # once granted (or never gated): acknowledged as it comes.
        self._withheld = -1
        # Request bytes (head and body) counted in the server's Admission until the answer starts.
        self._held = 0
        self._task: asyncio.Task[None] | None = None
        self._head_only = False
        # The status code sent (0 until the head is written): for request metrics and logs.
        self.status = 0
        self._started = False
        self._finished = False
        self._handler_done = False
        self._end_sent = False
        self._reset = False
        # Unsent body bytes, in the pieces the handler wrote (a memoryview for a piece cut by a frame).
        self._out: deque[bytes | memoryview] = deque()
        self._out_bytes = 0
        self._drained: asyncio.Event | None = None
        self._close_cbs: list[Callable[[], None]] | None = None

    # ------------------------------------------------------------- Response

    def _head(self, status: int, content_type: str, length: int | None, headers: Sequence[tuple[str, str]]) -> None:
        """HEADERS for the answer; a handler's invalid header value raises before anything starts (then a 500)."""
        conn = self._conn
        fields = [(b":status", b"%d" % status)]
        if content_type:  # "": none (a passed-through 304 or 204 that had none)
            fields.append((b"content-type", content_type.encode("latin-1")))
        if length is not None and status not in _BODYLESS and status >= 200:
            fields.append((b"content-length", b"%d" % length))
        fields.append((b"date", _date_value()))
        if conn.server_header:
            fields.append((b"server", conn.server_header))
        cache_control: tuple[bytes, bytes] | None = _CACHE_CONTROL
        # kube's Audit-Id (``Request.audit_id``): none on a stream refused before its request was whole
        request = self._request
        audit = request is not None
        for name, value in headers:
            key = name.lower()
            if key == "cache-control":
                cache_control = None  # the handler's own (a passed-through answer's): kube's filter yields too
            elif key == "audit-id":
                audit = False  # the upstream's own, for the request it was sent (a passed-through answer's)
            if "\r" in value or "\n" in value or "\x00" in value:
                raise ValueError(f"invalid header value for {name!r}")
            if key in CONNECTION_SPECIFIC:
                # Go's http2 server: "Connection: close" from a handler means GOAWAY once idle.
                if key == "connection" and value.lower() == "close" and self._request is not None:
                    self._request.close_connection = True
                continue
            fields.append((key.encode("latin-1"), value.encode("latin-1")))
        if cache_control is not None:
            fields.append(cache_control)
        if audit:
            assert request is not None
            fields.append((b"audit-id", (request.audit_id() or new_audit_id()).encode("latin-1")))
        self.status = status
        self._started = True
        conn.answered(self)
        conn.send_headers(self, fields)

    def send(
        self,
        status: int,
        body: bytes | Sequence[bytes],
        *,
        content_type: str = "application/json",
        headers: Sequence[tuple[str, str]] = (),
    ) -> None:
        if self._started:
            raise RuntimeError("response already started")
        parts: Sequence[bytes] = (
            (bytes(body),)
            if isinstance(body, bytearray | memoryview)
            else ((body,) if isinstance(body, bytes) else body)
        )
        size = sum(map(len, parts))
        self._head(status, content_type, size, headers)
        if not (self._head_only or status in _BODYLESS or status < 200):
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
        if self._started:
            raise RuntimeError("response already started")
        size = sum(map(len, parts))
        self._head(status, content_type, size, headers)
        try:
            if self._head_only or status in _BODYLESS or status < 200:
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
        if self._started:
            raise RuntimeError("response already started")
        self._head(status, content_type, None, headers)

    def write_chunk(self, parts: Sequence[bytes]) -> int:
        """Queue ``parts`` (their bytes as given) for this stream's next DATA frames."""
        if not self._started:
            raise RuntimeError("write_chunk() before start_chunked()")
        if self._reset or self._conn.closing or self._head_only:
            return 0
        if self._finished:
            raise RuntimeError("write_chunk() after end_chunked()")
        size = sum(map(len, parts))
        if size:
            self._queue(parts, size)
        return size

    def end_chunked(self) -> None:
        if not self._finished:
            self._finish()

    def _queue(self, parts: Sequence[bytes], size: int) -> None:
        if self._reset or self._conn.closing or not size:
            return
        self._out.extend(parts)
        self._out_bytes += size
        self._conn.mark(self)

    def _finish(self) -> None:
        if not self._finished:
            self._finished = True
            self._conn.mark(self)

    @property
    def writable(self) -> bool:
        conn = self._conn
        return self._out_bytes <= conn.stream_high_water and conn.flow.writable and not self._reset

    async def drain(self) -> None:
        """Until this stream's queue is below its low-water mark and the transport takes bytes."""
        conn = self._conn
        while True:
            if self._reset or conn.closing:
                raise ConnectionClosed("stream closed")
            if not conn.flow.writable:
                await conn.flow.drain()
                continue
            if self._out_bytes <= conn.stream_low_water:
                return
            event = self._drained
            if event is None:
                event = self._drained = asyncio.Event()
            event.clear()
            await event.wait()

    def write_buffer_size(self) -> int:
        return self._out_bytes

    @property
    def closed(self) -> bool:
        return self._reset or self._conn.closing

    def add_close_callback(self, cb: Callable[[], None]) -> None:
        if self._reset or self._conn.lost:
            asyncio.get_running_loop().call_soon(cb)
        elif self._close_cbs is None:
            self._close_cbs = [cb]
        else:
            self._close_cbs.append(cb)

    @property
    def started(self) -> bool:
        return self._started

    def abort(self) -> None:
        """Reset this stream only (INTERNAL_ERROR): its client sees it truncated, the others go on."""
        self._conn.reset_stream(self, internal=True)

    def switch_protocols(self, head: bytes, protocol: asyncio.Protocol) -> tuple[asyncio.Transport, bytes]:
        # Never reached: the connection answers an upgrade request on HTTP/2 with 400 itself.
        raise ConnectionClosed("connection upgrades need HTTP/1.1")

    # ------------------------------------------------------------- for the connection: the request

    @property
    def request(self) -> Request | None:
        """The request of the stream's HEADERS (None until ``begin``, or when they were refused)."""
        return self._request

    @property
    def wants_body(self) -> bool:
        """The request is open and not complete: DATA is its body (else it is dropped)."""
        return self._request is not None and not self._request_complete

    @property
    def body_size(self) -> int:
        return self._body_size

    def begin(self, request: Request, body_timer: asyncio.TimerHandle | None) -> None:
        """The request's head is in; ``body_timer`` (if a body follows) refuses it if the body is late."""
        self._request = request
        self._head_only = request.method == "HEAD"
        self._body_timer = body_timer

    def gate(self) -> asyncio.Future[None]:
        """Admitted before its body (``h2gate``): DATA is withheld until ``unwithhold``; the body's
        arrival is the future returned."""
        self._withheld = 0
        self._gated = asyncio.get_running_loop().create_future()
        return self._gated

    @property
    def gated(self) -> bool:
        """Admitted before its body (``gate``): its task, not the connection, runs its handler."""
        return self._gated is not None

    @property
    def queued(self) -> bool:
        """Waiting for its admission: its DATA is withheld and held as it comes."""
        return self._withheld >= 0

    def withhold(self, size: int) -> bool:
        """Whether DATA of ``size`` flow-controlled bytes stays unacknowledged (the stream is queued)."""
        if self._withheld < 0:
            return False
        self._withheld += size
        return True

    def unwithhold(self) -> int:
        """No longer queued (granted, answered or gone): the bytes withheld, to acknowledge now."""
        withheld, self._withheld = max(self._withheld, 0), -1
        return withheld

    def grant(self, body_timer: asyncio.TimerHandle) -> None:
        """Admitted: the body may come; ``body_timer`` refuses it if it is late."""
        if self._request_complete:
            body_timer.cancel()
        else:
            self._body_timer = body_timer

    def hold(self, size: int) -> None:
        """``size`` more request bytes counted against the limits until the answer starts."""
        self._held += size

    def release(self) -> int:
        """The request bytes held, no longer counted from now on."""
        held, self._held = self._held, 0
        return held

    def add_body(self, data: bytes) -> None:
        self._body.append(data)
        self._body_size += len(data)

    def remote_end(self) -> None:
        """The client ended its side (END_STREAM)."""
        self._remote_ended = True

    def complete_request(self) -> Request | None:
        """The whole request, body joined, for its handler; None if there is none, or it already ran."""
        request = self._request
        if request is None or self._request_complete:
            return None
        self._request_complete = True
        self._cancel_body_timer()
        body = self._body
        if body:
            request.body = body[0] if len(body) == 1 else b"".join(body)
            self._body = []
        if self._gated is not None:
            self._gated.set_result(None)
        return request

    def refuse(self) -> None:
        """The request is answered with a Status by the connection: no handler, no more body wanted
        (a stream admitted before its body: its admission ends, or its grant goes back)."""
        self.stop_body()
        self._handler_done = True
        task = self._task
        if self._gated is not None and task is not None:
            task.cancel()

    def stop_body(self) -> None:
        """Answered before its body was read: no more body wanted (what comes is acknowledged and dropped)."""
        self._cancel_body_timer()
        self._body = []
        self._request_complete = True

    def body_late(self) -> bool:
        """The body timer fired: whether the request is still waiting for its body (then refused)."""
        self._body_timer = None
        return not (self._request_complete or self._reset or self._started)

    def _cancel_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    # ------------------------------------------------------------- for the connection: the handler

    def run(self, task: asyncio.Task[None]) -> None:
        """``task`` handles the request."""
        self._task = task

    def handler_returned(self) -> None:
        self._handler_done = True
        self._task = None

    # ------------------------------------------------------------- for the connection: the answer

    @property
    def finished(self) -> bool:
        """The handler ended the body (END_STREAM goes with its last bytes)."""
        return self._finished

    @property
    def handler_done(self) -> bool:
        """The handler returned (or there was none): what is queued is all the answer will be."""
        return self._handler_done

    @property
    def end_sent(self) -> bool:
        """END_STREAM was sent: the answer is complete on the wire."""
        return self._end_sent

    @property
    def reset(self) -> bool:
        """Either side reset the stream, or the connection was lost."""
        return self._reset

    @property
    def done(self) -> bool:
        """Nothing more will happen on this stream: the connection may forget it."""
        return self._handler_done and (self._end_sent or self._reset) and not self._out

    def send_frames(self, framer: Framer, max_frame: int) -> int:
        """The queue as DATA frames within the stream's window (and the connection's), each at most
        ``max_frame``; END_STREAM with the last bytes of a finished answer. Returns :data:`BLOCKED`
        (a window is closed: again after a WINDOW_UPDATE), :data:`ENDED` (END_STREAM sent), or 0."""
        if self._reset or self._end_sent:
            return 0
        sid = self.sid
        out = self._out
        while out:
            window = framer.local_flow_control_window(sid)
            if window <= 0:
                return BLOCKED
            chunk = self._take(min(window, max_frame))
            end = self._finished and not out
            framer.send_data(sid, chunk, end_stream=end)
            if end:
                self._ended(framer)
                return ENDED
        if self._finished:
            framer.end_stream(sid)
            self._ended(framer)
            return ENDED
        return 0

    def _ended(self, framer: Framer) -> None:
        self._end_sent = True
        if not self._remote_ended:
            # Answered before the client finished its body (an error): it need not send the rest.
            framer.reset_stream(self.sid, ErrorCodes.NO_ERROR)
            self._remote_ended = self._request_complete = True

    def _take(self, limit: int) -> bytes | memoryview:
        """Up to ``limit`` queued bytes for one DATA frame: one piece as it is, or pieces joined.

        A ``drain`` waiting for the queue to go below its low-water mark is woken when it does.
        """
        out = self._out
        before = self._out_bytes
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
            chunk: bytes | memoryview = first
        else:
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
            chunk = b"".join(pieces)
        self._out_bytes = after = before - size
        if before > self._conn.stream_low_water >= after:
            self.wake_writers()
        return chunk

    def wake_writers(self) -> None:
        """The queue is below the low-water mark (or the transport resumed): wake a ``drain``."""
        event = self._drained
        if event is not None:
            event.set()

    def gone(self) -> None:
        """The stream was reset or the connection lost: drop the queue, tell the handler, and stop it."""
        self._cancel_body_timer()
        if not self._reset:
            self._reset = True
            self._out.clear()
            self._out_bytes = 0
            if self._drained is not None:
                self._drained.set()
            cbs, self._close_cbs = self._close_cbs, None
            for cb in cbs or ():
                try:
                    cb()
                except Exception:
                    logger.exception("close callback failed")
        task = self._task
        if task is not None and not task.done():
            task.cancel()
