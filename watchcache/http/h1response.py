"""The answer to one HTTP/1.1 request: a :class:`~watchcache.http.response.Response` written straight to the socket.

A response writes through its connection (:class:`H1Connection`, which
:class:`watchcache.http.h1protocol.H1Protocol` implements) and through nothing else: a head and
body in one ``writelines`` for ``send``, slices as the client reads for ``send_stream``, one
chunk per ``write_chunk`` for a watch. The connection, in turn, only asks a response whether it
is complete (:attr:`H1Response.finished`), and tells it when its handler returned or its client
went away; the response tells the connection, once both are done, whether it stays open.

State: started (head written) -> finished (body complete); the connection moves to the next
pipelined request once the response is finished and its handler has returned.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Sequence
from email.utils import formatdate
from http import HTTPStatus
from typing import Protocol

from watchcache.http.flowcontrol import ConnectionClosed, FlowControl
from watchcache.http.request import new_audit_id

__all__ = ["H1Connection", "H1Response", "header_line"]

logger = logging.getLogger("watchcache.http.h1response")


class H1Connection(Protocol):
    """What an :class:`H1Response` may ask of its connection; the connection's side of the interface."""

    #: No more writes: we closed, or the peer did (writes are dropped).
    closing: bool
    #: The peer is gone (``connection_lost`` was called).
    lost: bool
    #: The transport's pause/resume, and waiting for it.
    flow: FlowControl
    #: The ``Server`` header line, or empty.
    server_line: bytes

    def write(self, data: bytes) -> None:
        """One buffer to the transport."""

    def write_parts(self, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        """``parts`` to the transport as ONE write (a watch chunk, a LIST slice)."""

    def write_buffer_size(self) -> int:
        """Bytes written and not yet sent."""

    def answered(self) -> None:
        """The answer started: the request's bytes no longer count against the limits."""

    def streaming(self) -> None:
        """The answer is a stream that lasts as long as its client (a watch): what only an idle
        connection needs (its parser, its keep-alive timer) can go until the stream ends."""

    def finish(self, response: H1Response, keep_alive: bool) -> None:
        """``response`` is complete and its handler returned: the next request (``keep_alive``), or close."""

    def abort(self) -> None:
        """Drop the connection now, discarding buffered output."""

    def switch_protocols(self, head: bytes, protocol: asyncio.Protocol) -> tuple[asyncio.Transport, bytes]:
        """Write ``head`` and hand the transport to ``protocol``; the transport and the bytes after the request."""


_CRLF = b"\r\n"
_CACHE_CONTROL = b"Cache-Control: no-cache, private\r\n"
_CONN_CLOSE = b"Connection: close\r\n"
_CONN_KEEP_ALIVE = b"Connection: keep-alive\r\n"
_CHUNKED = b"Transfer-Encoding: chunked\r\n"
_LAST_CHUNK = b"0\r\n\r\n"
_STATUS_LINES: dict[int, bytes] = {}
_CONTENT_TYPES: dict[str, bytes] = {}
_date: tuple[int, bytes] = (0, b"")


def _status_line(code: int) -> bytes:
    line = _STATUS_LINES.get(code)
    if line is None:
        if not 100 <= code <= 999:
            raise ValueError(f"invalid HTTP status {code}")
        try:
            phrase = HTTPStatus(code).phrase
        except ValueError:
            phrase = "Unknown"
        line = _STATUS_LINES[code] = f"HTTP/1.1 {code} {phrase}\r\n".encode("ascii")
    return line


def _date_line() -> bytes:
    """Date header, formatted at most once per second (it only has second precision)."""
    global _date
    now = int(time.time())
    if now != _date[0]:
        _date = (now, b"Date: " + formatdate(now, usegmt=True).encode("ascii") + _CRLF)
    return _date[1]


# RFC 9110 5.6.2 token: visible ASCII but the delimiters. One regex match, not a generator per
# character: a passed-through answer writes every header line the upstream sent through here.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_VALUE_BAD = re.compile("[\r\n\x00]")


def header_line(name: str, value: str) -> bytes:
    """Encode one header; refuses CR/LF/NUL so no caller can inject headers."""
    if _TOKEN.fullmatch(name) is None:
        raise ValueError(f"invalid header name {name!r}")
    if _VALUE_BAD.search(value) is not None:
        raise ValueError(f"invalid header value for {name!r}")
    return f"{name}: {value}\r\n".encode("latin-1")


def _content_type_line(content_type: str) -> bytes:
    """The Content-Type line; none for an empty type (a passed-through 304 or 204 that had none)."""
    if not content_type:
        return b""
    line = _CONTENT_TYPES.get(content_type)
    if line is None:
        line = header_line("Content-Type", content_type)
        if len(_CONTENT_TYPES) < 64:
            _CONTENT_TYPES[content_type] = line
    return line


_BODYLESS = frozenset({204, 304})


class H1Response:
    """The answer to one HTTP/1.1 request (a ``Response``); writes go straight to the connection's transport."""

    __slots__ = (
        "_audit",
        "_chunked",
        "_close_cbs",
        "_conn",
        "_finished",
        "_handler_done",
        "_head_only",
        "_http10",
        "_keep_alive",
        "started",
        "status",
    )

    #: The connection waits for both the handler and the answer (``handler_returned``, ``finished``).
    outlives_handler = True

    def __init__(
        self, conn: H1Connection, keep_alive: bool, head_only: bool, http10: bool, audit_id: str | None = None
    ) -> None:
        self._conn = conn
        # The client's Audit-ID ("": a new one is made; ``Request.audit_id``), until the head is written.
        # None: no Audit-Id, for the server's own refusal of what is not a request (Go's server writes
        # those without kube's filters).
        self._audit = audit_id
        self._keep_alive = keep_alive
        self._head_only = head_only
        self._http10 = http10
        # The head was written. Read by the connection per request, so a plain attribute (written only here).
        self.started = False
        self._finished = False
        self._chunked = False
        self._handler_done = False
        self._close_cbs: list[Callable[[], None]] | None = None
        # The status code sent (0 until the head is written): for request metrics and logs.
        self.status = 0

    def _head(self, status: int, content_type: str, length: int | None, headers: Sequence[tuple[str, str]]) -> bytes:
        self.status = status
        conn = self._conn
        conn.answered()  # the answer starts: the request's bytes no longer count
        parts = [_status_line(status), _content_type_line(content_type)]
        if length is not None:
            if status not in _BODYLESS and status >= 200:
                parts.append(b"Content-Length: %d\r\n" % length)
        elif not self._http10:
            parts.append(_CHUNKED)
        parts.append(_date_line())
        if conn.server_line:
            parts.append(conn.server_line)
        if not self._keep_alive:
            parts.append(_CONN_CLOSE)
        elif self._http10:
            parts.append(_CONN_KEEP_ALIVE)
        cache_control = _CACHE_CONTROL
        audit = self._audit
        for name, value in headers:
            if cache_control and len(name) == 13 and name.lower() == "cache-control":
                cache_control = b""  # the handler's own (a passed-through answer's): kube's filter yields too
            elif audit is not None and len(name) == 8 and name.lower() == "audit-id":
                audit = None  # the upstream's own, for the request it was sent (a passed-through answer's)
            parts.append(header_line(name, value))
        parts.append(cache_control)
        if audit is not None:
            parts.append(header_line("Audit-Id", audit or new_audit_id()))
            self._audit = None
        parts.append(_CRLF)
        return b"".join(parts)

    def send(
        self,
        status: int,
        body: bytes | Sequence[bytes],
        *,
        content_type: str = "application/json",
        headers: Sequence[tuple[str, str]] = (),
    ) -> None:
        """One-shot response with Content-Length; head and body leave in one writelines."""
        if self.started:
            raise RuntimeError("response already started")
        if isinstance(body, bytes | bytearray | memoryview):
            parts: Sequence[bytes | bytearray | memoryview] = (body,)
            size = body.nbytes if isinstance(body, memoryview) else len(body)
        else:
            parts = body
            size = sum(map(len, body))
        head = self._head(status, content_type, size, headers)
        self.started = self._finished = True
        conn = self._conn
        if not conn.closing:
            if self._head_only or status in _BODYLESS or status < 200:
                conn.write(head)
            else:
                conn.write_parts([head, *parts])
        if self._handler_done:
            conn.finish(self, self._keep_alive)

    async def send_stream(
        self,
        status: int,
        parts: Sequence[bytes],
        *,
        content_type: str = "application/json",
        headers: Sequence[tuple[str, str]] = (),
        slice_bytes: int = 1 << 20,
    ) -> None:
        """A Content-Length body written in slices, waiting for the client between them.

        For large LISTs: the parts (cached object bytes) are written as the client reads,
        so a 100 MB list never sits whole in the transport's buffer; a small body leaves
        in one ``writelines`` exactly like ``send``. A client gone mid-body just ends it.
        """
        if self.started:
            raise RuntimeError("response already started")
        size = sum(map(len, parts))
        head = self._head(status, content_type, size, headers)
        self.started = True
        conn = self._conn
        try:
            if self._head_only or status in _BODYLESS or status < 200 or size <= slice_bytes:
                if not conn.closing:
                    if self._head_only or status in _BODYLESS or status < 200:
                        conn.write(head)
                    else:
                        conn.write_parts([head, *parts])
                return
            batch: list[bytes] = [head]
            batch_bytes = 0
            for part in parts:
                batch.append(part)
                batch_bytes += len(part)
                if batch_bytes >= slice_bytes:
                    if conn.closing:
                        return
                    conn.write_parts(batch)
                    batch = []
                    batch_bytes = 0
                    if not conn.flow.writable:
                        await conn.flow.drain()
            if batch and not conn.closing:
                conn.write_parts(batch)
        except ConnectionClosed:
            return
        finally:
            self._finished = True
            if self._handler_done:
                conn.finish(self, self._keep_alive)

    def start_chunked(
        self,
        status: int,
        *,
        content_type: str = "application/json",
        headers: Sequence[tuple[str, str]] = (),
    ) -> None:
        """Start a streamed (watch) body; HTTP/1.0 peers get a close-delimited body instead."""
        if self.started:
            raise RuntimeError("response already started")
        if self._http10:
            self._keep_alive = False  # no chunked coding in 1.0: the close ends the body
        head = self._head(status, content_type, None, headers)
        self.started = self._chunked = True
        conn = self._conn
        if not conn.closing:
            conn.write(head)
            conn.streaming()

    def write_chunk(self, parts: Sequence[bytes]) -> int:
        """Write ONE chunk holding all ``parts``: size line, parts and CRLF in a single writelines.

        Returns the payload size (0 if nothing was written).
        """
        if not self._chunked:
            raise RuntimeError("write_chunk() before start_chunked()")
        conn = self._conn
        if conn.closing or self._head_only:
            return 0
        if self._finished:
            raise RuntimeError("write_chunk() after end_chunked()")
        size = sum(map(len, parts))
        if not size:
            return 0  # an empty chunk would end the stream
        if self._http10:
            conn.write_parts(parts)
        else:
            conn.write_parts([b"%x\r\n" % size, *parts, _CRLF])
        return size

    def end_chunked(self) -> None:
        """Terminate the stream; idempotent because a dispatcher and a handler may both end it."""
        if not self._chunked:
            raise RuntimeError("end_chunked() before start_chunked()")
        if self._finished:
            return
        self._finished = True
        conn = self._conn
        if not conn.closing and not self._head_only and not self._http10:
            conn.write(_LAST_CHUNK)
        if self._handler_done:
            conn.finish(self, self._keep_alive)

    @property
    def writable(self) -> bool:
        """False while the transport is above high water or the connection is closed."""
        return self._conn.flow.writable

    async def drain(self) -> None:
        """Wait until writable again; raises :class:`ConnectionClosed` if the peer went away."""
        await self._conn.flow.drain()

    def write_buffer_size(self) -> int:
        return self._conn.write_buffer_size()

    @property
    def closed(self) -> bool:
        return self._conn.closing

    def add_close_callback(self, cb: Callable[[], None]) -> None:
        """Run ``cb`` once when the connection is lost while this response is current.

        Registered after the loss, ``cb`` runs on the next loop pass (never re-entrantly).
        """
        if self._conn.lost:
            asyncio.get_running_loop().call_soon(cb)
        elif self._close_cbs is None:
            self._close_cbs = [cb]
        else:
            self._close_cbs.append(cb)

    def abort(self) -> None:
        """Drop the connection now, discarding buffered output (e.g. a watcher over its cap)."""
        self._conn.abort()

    def switch_protocols(self, head: bytes, protocol: asyncio.Protocol) -> tuple[asyncio.Transport, bytes]:
        """Answer an upgrade request with ``head`` (a whole ``101 Switching Protocols`` head,
        written as given) and hand the connection to ``protocol``.

        From now on the transport's callbacks (data, EOF, flow control, loss) go to
        ``protocol``, and its bytes are no longer HTTP. Returns the transport and the bytes
        the client sent after its request head, which belong to the new protocol. The
        response is complete: the connection closes when the handler returns. Raises
        :class:`ConnectionClosed` if the client is already gone.
        """
        if self.started:
            raise RuntimeError("response already started")
        switched = self._conn.switch_protocols(head, protocol)
        self.status = 101
        self.started = self._finished = True
        return switched

    # ------------------------------------------------------------- for the connection

    @property
    def finished(self) -> bool:
        """The body is complete (or the head was the whole answer)."""
        return self._finished

    def close_after(self) -> None:
        """This answer is the connection's last (``Connection: close``); before its head is written."""
        self._keep_alive = False

    def handler_returned(self) -> None:
        """The handler is done with this response: once it is complete too, the connection moves on."""
        self._handler_done = True
        if self._finished:
            self._conn.finish(self, self._keep_alive)

    def connection_lost(self) -> None:
        """The client went away: run the close callbacks (a watch ends its watcher)."""
        cbs, self._close_cbs = self._close_cbs, None
        for cb in cbs or ():
            try:
                cb()
            except Exception:
                logger.exception("close callback failed")
