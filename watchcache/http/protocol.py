"""HTTP/1.1 server: a bare ``asyncio.Protocol`` on ``httptools`` (llhttp).

Why not a framework: it measured 2-3x faster on small requests, and watch fan-out
needs the transport itself -- a watcher's pending events go out as ONE
``transport.writelines()`` per loop pass, and back-pressure is the transport's
pause/resume signal (see :mod:`watchcache.http.flowcontrol`).

Connection rules enforced here, so handlers never see them: strict in-order
answers to pipelined requests, request-smuggling defences (CL+TE, duplicate
Content-Length, non-chunked Transfer-Encoding), head/body size limits, head, body
and keep-alive timeouts, connection limits and bounds on the request bytes held
before they are answered (:mod:`watchcache.http.admission`), and Kubernetes
``Status`` bodies for every error. An upgrade request (``Connection: Upgrade``) is
the last request of its connection: its handler either hands the connection over
with ``Response.switch_protocols`` or answers and the connection closes.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, cast
from urllib.parse import parse_qs, unquote

import httptools

from watchcache import apierrors
from watchcache.http.admission import Admission
from watchcache.http.flowcontrol import ConnectionClosed, FlowControl
from watchcache.http.response import Response

__all__ = [
    "Admission",
    "ConnectionClosed",
    "Handler",
    "Http1Response",
    "HttpLimits",
    "Request",
    "Response",
    "create_protocol_factory",
    "start_server",
]

logger = logging.getLogger("watchcache.http.protocol")

#: Complete requests parsed ahead of the one being answered before reading pauses.
MAX_PIPELINE = 16


#: Probes answered even when the request buffer is full: a liveness probe must not fail
#: because of other clients' bodies (small body-less requests only).
PROBES = frozenset({b"/healthz", b"/livez", b"/readyz"})
PROBE_MAX_HEAD = 8192


@dataclass(frozen=True, slots=True)
class HttpLimits:
    max_header_bytes: int = 1 << 20  # request line + header bytes; over -> 431
    max_body_bytes: int = 3 * 1024 * 1024  # over -> 413 (kube-apiserver's limit)
    header_timeout: float = 10.0  # to receive a complete request head (slowloris) -> close
    # To receive a request body once its head is in (slow bodies) -> 408, close. kube-apiserver's
    # request timeout (60 s) covers reading the body too.
    body_timeout: float = 60.0
    keepalive_timeout: float = 90.0  # idle between requests -> close
    high_water: int = 256 * 1024  # transport write buffer marks for pause/resume
    low_water: int = 64 * 1024
    # Open connections per server (process); over -> closed at accept. 0: no limit.
    max_connections: int = 20_000
    # Per client address; over -> its first request gets 429 + Retry-After, then close. 0: no limit.
    max_connections_per_client: int = 1_000
    # Request bytes (heads and bodies) one connection may hold unanswered; over -> it is not read
    # until its earlier requests are answered. Never below one request of the largest size.
    max_connection_buffer_bytes: int = 4 << 20
    # The same over all connections; over -> 429 + Retry-After (probes excepted). 0: no limit.
    max_request_buffer_bytes: int = 256 << 20

    def admission(self) -> Admission:
        """The shared state of one server's connections under these limits."""
        return Admission(self.max_connections, self.max_connections_per_client, self.max_request_buffer_bytes)


@dataclass(slots=True)
class Request:
    method: str
    raw_path: bytes
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes
    http_version: str
    remote: str
    # The verified client certificate of a TLS connection (``SSLObject.getpeercert()``), if any,
    # plus ``x509sha256``: the hex SHA-256 of its DER encoding.
    peercert: dict[str, Any] | None = None
    # The protocol an upgrade request asks for (``Connection: Upgrade`` + ``Upgrade: websocket``),
    # else None. Its answer is either ``Response.switch_protocols`` or a response after which the
    # connection closes (the bytes after its head belong to the protocol it asked for).
    upgrade: str | None = None
    # Headers sent on more than one line: their values, one per line (``headers`` joins them
    # with ", " for lookups). None when no header was repeated, as in almost every request.
    repeated: dict[str, list[str]] | None = None
    # Set while handling: the connection must not serve another request after this one. On HTTP/2
    # (kube's UnauthenticatedHTTP2DOSMitigation) a GOAWAY follows the answer, so that a client
    # nobody authenticated cannot multiplex; HTTP/1.1 has one request at a time anyway.
    close_connection: bool = False

    def header_lines(self) -> list[tuple[str, str]]:
        """Every header as received, one (name, value) per line: a repeated header stays repeated.

        For forwarding: kube-apiserver reads each ``Impersonate-Group`` line as one group, so
        the lines ``a`` and ``b`` must not become the single line ``a, b``.
        """
        repeated = self.repeated
        if not repeated:
            return list(self.headers.items())
        lines: list[tuple[str, str]] = []
        for name, value in self.headers.items():
            values = repeated.get(name)
            if values is None:
                lines.append((name, value))
            else:
                lines.extend((name, v) for v in values)
        return lines

    def query_value(self, name: str) -> str | None:
        """First value of a query parameter, as most list/watch options are single-valued."""
        values = self.query.get(name)
        return values[0] if values else None


class _ProtocolError(Exception):
    """Raised inside parser callbacks; queued so it is answered in pipeline order."""

    def __init__(self, code: int, reason: str, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.retry_after = retry_after


# ---------------------------------------------------------------- response heads

_CRLF = b"\r\n"
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
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


_TOKEN_BAD = frozenset(' \t\r\n\x00:"(),/;<=>?@[\\]{}')


def _header_line(name: str, value: str) -> bytes:
    """Encode one header; refuses CR/LF/NUL so no caller can inject headers."""
    if not name or any(c in _TOKEN_BAD or not " " < c < "\x7f" for c in name):
        raise ValueError(f"invalid header name {name!r}")
    if "\r" in value or "\n" in value or "\x00" in value:
        raise ValueError(f"invalid header value for {name!r}")
    return f"{name}: {value}\r\n".encode("latin-1")


def _content_type_line(content_type: str) -> bytes:
    line = _CONTENT_TYPES.get(content_type)
    if line is None:
        line = _header_line("Content-Type", content_type)
        if len(_CONTENT_TYPES) < 64:
            _CONTENT_TYPES[content_type] = line
    return line


_BODYLESS = frozenset({204, 304})


class Http1Response:
    """The answer to one HTTP/1.1 request (a :class:`Response`); writes go straight to the connection's transport."""

    __slots__ = (
        "_chunked",
        "_close_cbs",
        "_finished",
        "_handler_done",
        "_head_only",
        "_http10",
        "_keep_alive",
        "_proto",
        "_started",
        "status",
    )

    def __init__(self, proto: HttpProtocol, keep_alive: bool, head_only: bool, http10: bool) -> None:
        self._proto = proto
        self._keep_alive = keep_alive
        self._head_only = head_only
        self._http10 = http10
        self._started = False
        self._finished = False
        self._chunked = False
        self._handler_done = False
        self._close_cbs: list[Callable[[], None]] | None = None
        # The status code sent (0 until the head is written): for request metrics and logs.
        self.status = 0

    def _head(self, status: int, content_type: str, length: int | None, headers: Sequence[tuple[str, str]]) -> bytes:
        self.status = status
        proto = self._proto
        held = proto._active_size
        if held:  # the answer starts: the request's bytes no longer count (inline: every response)
            proto._active_size = 0
            proto._admission.buffered -= held
        parts = [_status_line(status), _content_type_line(content_type)]
        if length is not None:
            if status not in _BODYLESS and status >= 200:
                parts.append(b"Content-Length: %d\r\n" % length)
        elif not self._http10:
            parts.append(_CHUNKED)
        parts.append(_date_line())
        if proto._server_line:
            parts.append(proto._server_line)
        parts.append(_CACHE_CONTROL)
        if not self._keep_alive:
            parts.append(_CONN_CLOSE)
        elif self._http10:
            parts.append(_CONN_KEEP_ALIVE)
        for name, value in headers:
            parts.append(_header_line(name, value))
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
        if self._started:
            raise RuntimeError("response already started")
        if isinstance(body, bytes | bytearray | memoryview):
            parts: Sequence[bytes | bytearray | memoryview] = (body,)
            size = body.nbytes if isinstance(body, memoryview) else len(body)
        else:
            parts = body
            size = sum(map(len, body))
        head = self._head(status, content_type, size, headers)
        self._started = self._finished = True
        proto = self._proto
        if not proto._closing:
            if self._head_only or status in _BODYLESS or status < 200:
                proto._transport.write(head)
            else:
                proto._write_parts([head, *parts])
        if self._handler_done:
            proto._finish(self)

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
        if self._started:
            raise RuntimeError("response already started")
        size = sum(map(len, parts))
        head = self._head(status, content_type, size, headers)
        self._started = True
        proto = self._proto
        try:
            if self._head_only or status in _BODYLESS or status < 200 or size <= slice_bytes:
                if not proto._closing:
                    if self._head_only or status in _BODYLESS or status < 200:
                        proto._transport.write(head)
                    else:
                        proto._write_parts([head, *parts])
                return
            batch: list[bytes] = [head]
            batch_bytes = 0
            for part in parts:
                batch.append(part)
                batch_bytes += len(part)
                if batch_bytes >= slice_bytes:
                    if proto._closing:
                        return
                    proto._write_parts(batch)
                    batch = []
                    batch_bytes = 0
                    if not proto._flow.writable:
                        await proto._flow.drain()
            if batch and not proto._closing:
                proto._write_parts(batch)
        except ConnectionClosed:
            return
        finally:
            self._finished = True
            if self._handler_done:
                proto._finish(self)

    def start_chunked(
        self,
        status: int,
        *,
        content_type: str = "application/json",
        headers: Sequence[tuple[str, str]] = (),
    ) -> None:
        """Start a streamed (watch) body; HTTP/1.0 peers get a close-delimited body instead."""
        if self._started:
            raise RuntimeError("response already started")
        if self._http10:
            self._keep_alive = False  # no chunked coding in 1.0: the close ends the body
        head = self._head(status, content_type, None, headers)
        self._started = self._chunked = True
        if not self._proto._closing:
            self._proto._transport.write(head)

    def write_chunk(self, parts: Sequence[bytes]) -> int:
        """Write ONE chunk holding all ``parts``: size line, parts and CRLF in a single writelines.

        Returns the payload size (0 if nothing was written).
        """
        if not self._chunked:
            raise RuntimeError("write_chunk() before start_chunked()")
        proto = self._proto
        if proto._closing or self._head_only:
            return 0
        if self._finished:
            raise RuntimeError("write_chunk() after end_chunked()")
        size = sum(map(len, parts))
        if not size:
            return 0  # an empty chunk would end the stream
        if self._http10:
            proto._write_parts(parts)
        else:
            proto._write_parts([b"%x\r\n" % size, *parts, _CRLF])
        return size

    def end_chunked(self) -> None:
        """Terminate the stream; idempotent because a dispatcher and a handler may both end it."""
        if not self._chunked:
            raise RuntimeError("end_chunked() before start_chunked()")
        if self._finished:
            return
        self._finished = True
        proto = self._proto
        if not proto._closing and not self._head_only and not self._http10:
            proto._transport.write(_LAST_CHUNK)
        if self._handler_done:
            proto._finish(self)

    @property
    def writable(self) -> bool:
        """False while the transport is above high water or the connection is closed."""
        return self._proto._flow.writable

    async def drain(self) -> None:
        """Wait until writable again; raises :class:`ConnectionClosed` if the peer went away."""
        await self._proto._flow.drain()

    def write_buffer_size(self) -> int:
        proto = self._proto
        return 0 if proto._closing else proto._transport.get_write_buffer_size()

    @property
    def closed(self) -> bool:
        return self._proto._closing

    def add_close_callback(self, cb: Callable[[], None]) -> None:
        """Run ``cb`` once when the connection is lost while this response is current.

        Registered after the loss, ``cb`` runs on the next loop pass (never re-entrantly).
        """
        proto = self._proto
        if proto._lost:
            proto._loop.call_soon(cb)
        elif self._close_cbs is None:
            self._close_cbs = [cb]
        else:
            self._close_cbs.append(cb)

    @property
    def started(self) -> bool:
        return self._started

    def abort(self) -> None:
        """Drop the connection now, discarding buffered output (e.g. a watcher over its cap)."""
        self._proto._abort()

    def switch_protocols(self, head: bytes, protocol: asyncio.Protocol) -> tuple[asyncio.Transport, bytes]:
        """Answer an upgrade request with ``head`` (a whole ``101 Switching Protocols`` head,
        written as given) and hand the connection to ``protocol``.

        From now on the transport's callbacks (data, EOF, flow control, loss) go to
        ``protocol``, and its bytes are no longer HTTP. Returns the transport and the bytes
        the client sent after its request head, which belong to the new protocol. The
        response is complete: the connection closes when the handler returns. Raises
        :class:`ConnectionClosed` if the client is already gone.
        """
        proto = self._proto
        if self._started:
            raise RuntimeError("response already started")
        if proto._early is None:
            raise RuntimeError("switch_protocols() on a request that did not ask to upgrade")
        if proto._closing:
            raise ConnectionClosed("connection closed")
        early, proto._early = bytes(proto._early), None
        self.status = 101
        self._started = self._finished = True
        if proto._active_size:  # answered: the request's bytes no longer count (as in _head)
            proto._answered()
        proto._switched = protocol
        transport = proto._transport
        transport.write(head)
        if proto._flow.paused:
            protocol.pause_writing()
        proto._read_paused = False
        transport.resume_reading()
        return transport, early


Handler = Callable[[Request, Response], Awaitable[None]]


# ---------------------------------------------------------------- the protocol


class HttpProtocol(asyncio.Protocol):
    """One client connection. Parser callbacks (``on_*``) are called by httptools."""

    __slots__ = (
        "_active",
        "_active_size",
        "_admission",
        "_body",
        "_body_size",
        "_body_timer",
        "_buffer_cap",
        "_client",
        "_closing",
        "_content_length",
        "_continue_pending",
        "_dead",
        "_early",
        "_flow",
        "_h2",
        "_handler",
        "_head_raw",
        "_head_size",
        "_header_timer",
        "_headers",
        "_idle_since",
        "_in_head",
        "_in_message",
        "_ka_timer",
        "_keep_alive",
        "_limits",
        "_loop",
        "_lost",
        "_parser",
        "_partial",
        "_peercert",
        "_queue",
        "_read_paused",
        "_refused",
        "_remote",
        "_repeated",
        "_request",
        "_server_line",
        "_switched",
        "_task",
        "_tls",
        "_transport",
        "_url",
    )

    def __init__(
        self,
        handler: Handler,
        limits: HttpLimits,
        server_line: bytes,
        admission: Admission,
        h2: Callable[[], asyncio.Protocol] | None = None,
    ) -> None:
        self._handler = handler
        # The HTTP/2 protocol a TLS connection goes to when ALPN chose ``h2`` (None: HTTP/1.1 only).
        self._h2 = h2
        self._limits = limits
        self._server_line = server_line
        self._admission = admission
        # The client address this connection is counted under (None: not counted).
        self._client: str | None = None
        # Set when over the per-client connection limit: the first request is refused with 429.
        self._refused = False
        # Request bytes this connection holds in ``admission.buffered``: those of the message being
        # received, of the one being handled until its answer starts, and of those queued (in the queue).
        self._partial = 0
        self._active_size = 0
        self._buffer_cap = max(limits.max_connection_buffer_bytes, limits.max_header_bytes + limits.max_body_bytes)
        self._loop = asyncio.get_running_loop()
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport = None  # type: ignore[assignment]
        self._tls = False  # set in connection_made: the transport is TLS (writes are joined first)
        self._flow = FlowControl()
        self._remote = ""
        self._peercert: dict[str, Any] | None = None
        self._closing = False  # we closed, or the peer did: no more writes
        self._lost = False
        self._dead = False  # no more parsing: error or a Connection: close request
        self._read_paused = False
        # (request, keep-alive, bytes held) or an error to answer in its turn.
        self._queue: deque[tuple[Request, bool, int] | _ProtocolError] = deque()
        self._active: Http1Response | None = None
        self._task: asyncio.Task[None] | None = None  # the loop only keeps weak references
        self._header_timer: asyncio.TimerHandle | None = None
        self._ka_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._idle_since = 0.0
        self._in_head = False
        self._in_message = False
        self._continue_pending = False
        self._head_raw = 0
        # After an upgrade request's head: the bytes that followed it, until it is answered.
        self._early: bytearray | None = None
        # After ``Response.switch_protocols``: where the connection's bytes and events go.
        self._switched: asyncio.Protocol | None = None
        self._reset_message()

    def _reset_message(self) -> None:
        self._url = b""
        self._headers: dict[str, str] = {}
        self._repeated: dict[str, list[str]] | None = None
        self._head_size = 16  # method, spaces, version, CRLFs of the request line
        self._content_length: int | None = None
        self._body: list[bytes] | None = None
        self._body_size = 0
        self._request: Request | None = None
        self._keep_alive = True

    # -- asyncio.Protocol

    def _write_parts(self, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        """Hand ``parts`` (a watch chunk, a LIST slice) to the transport as ONE write.

        Plain TCP: ``writelines``, one ``writev`` of the parts as they are, no copy. TLS: joined
        first. uvloop's TLS transport feeds each buffer to its own ``SSL_write``, and each
        ``SSL_write`` seals at least one record: a chunk's size line and CRLF became records of a
        few bytes (29 bytes of header and tag each), a LIST of 10,000 items 20,000 records of one
        item or one comma, and uvloop pops its backlog from the front of a list (quadratic in
        the number of buffers). Joined, one ``SSL_write`` fills 16 KB records; the copy is one
        ``memcpy`` of bytes the TLS layer copies anyway (callers bound a write: ``FLUSH_BYTES``,
        ``slice_bytes``). Figures: docs/performance.md, "Production configuration".
        """
        if self._tls:
            self._transport.write(b"".join(parts))
        else:
            self._transport.writelines(parts)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have the same API.
        self._transport = transport = cast(asyncio.Transport, transport)
        self._tls = transport.get_extra_info("ssl_object") is not None
        transport.set_write_buffer_limits(high=self._limits.high_water, low=self._limits.low_water)
        if self._h2 is not None:
            ssl_object = transport.get_extra_info("ssl_object")
            if ssl_object is not None and ssl_object.selected_alpn_protocol() == "h2":
                # ALPN chose HTTP/2 (--http2): the connection is the HTTP/2 protocol's from now on.
                h2proto = self._h2()
                transport.set_protocol(h2proto)
                self._closing = self._dead = True
                h2proto.connection_made(transport)
                return
        self._remote, host, peercert = peer_identity(transport)
        refused = self._admission.connect(host)
        if refused == "connections":
            # Over the process's limit: nothing is read, nothing is held. Answering would mean
            # keeping the connection until its request arrives, which is what the limit prevents.
            logger.debug("closing %s at accept: too many connections", self._remote)
            self._closing = self._dead = True
            transport.close()
            return
        self._client = host
        self._refused = refused is not None
        self._peercert = peercert
        self._header_timer = self._loop.call_later(self._limits.header_timeout, self._on_header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = self._lost = self._dead = True
        self._cancel_timers()
        self._flow.connection_lost()
        admission = self._admission
        held = self._held()
        if held:
            admission.buffered -= held
            self._partial = self._active_size = 0
        self._queue.clear()
        if self._switched is not None:
            self._switched.connection_lost(exc)
        self._body = None
        if self._client is not None:
            admission.disconnect(self._client)
            self._client = None
        active = self._active
        if active is not None and active._close_cbs:
            cbs, active._close_cbs = active._close_cbs, None
            for cb in cbs:
                try:
                    cb()
                except Exception:
                    logger.exception("close callback failed")

    def pause_writing(self) -> None:
        self._flow.pause_writing()
        if self._switched is not None:
            self._switched.pause_writing()

    def resume_writing(self) -> None:
        self._flow.resume_writing()
        if self._switched is not None:
            self._switched.resume_writing()

    def eof_received(self) -> bool | None:
        if self._switched is not None:
            return self._switched.eof_received()
        return None

    def data_received(self, data: bytes) -> None:
        if self._switched is not None:
            self._switched.data_received(data)
            return
        if self._early is not None:
            # Reading is paused until the upgrade is answered, but a TLS transport may still
            # hand over what it had already decrypted: it belongs to the new protocol too.
            self._early += data
            if len(self._early) > self._limits.max_header_bytes:
                self._abort()
            return
        if self._dead:
            return
        was_in_head = self._in_head
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            err = exc.__context__
            if isinstance(err, _ProtocolError):
                self._fail(err)
            else:
                logger.error("HTTP parser callback failed", exc_info=err)
                self._fail(_ProtocolError(400, "BadRequest", "malformed HTTP request"))
            return
        except httptools.HttpParserUpgrade as exc:
            # An upgrade request is complete (and queued, with reading stopped): what follows
            # its head is not HTTP, and waits for the request's answer.
            self._early = bytearray(data[exc.args[0] :])
            return
        except httptools.HttpParserError as exc:
            self._fail(_ProtocolError(400, "BadRequest", f"malformed HTTP request: {exc}"))
            return
        if self._in_head:
            # httptools buffers a header until it is complete, so bound what we have fed it.
            # Bytes of a chunk where the head began are not counted: never a false 431.
            self._head_raw = self._head_raw + len(data) if was_in_head else 0
            if self._head_raw > self._limits.max_header_bytes:
                self._fail(_too_large_head())
            elif self._header_timer is None and not self._read_paused:
                self._header_timer = self._loop.call_later(self._limits.header_timeout, self._on_header_timeout)
        elif self._in_message and self._body_timer is None and not self._read_paused:
            # A body is coming (a GET's message completes in the same read: no timer for it).
            self._body_timer = self._loop.call_later(self._limits.body_timeout, self._on_body_timeout)

    # -- httptools callbacks

    def on_message_begin(self) -> None:
        self._in_head = self._in_message = True

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_size += len(url)
        if self._head_size > self._limits.max_header_bytes:
            raise _too_large_head()

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_size += len(name) + len(value) + 4
        if self._head_size > self._limits.max_header_bytes:
            raise _too_large_head()
        key = name.lower().decode("latin-1")
        if key == "content-length":
            if self._content_length is not None:
                raise _ProtocolError(400, "BadRequest", "duplicate Content-Length header")
            if not value.isdigit():
                raise _ProtocolError(400, "BadRequest", "invalid Content-Length header")
            self._content_length = int(value)
        text = value.decode("latin-1")
        headers = self._headers
        old = headers.get(key)
        if old is None:
            headers[key] = text
            return
        headers[key] = f"{old}, {text}"
        repeated = self._repeated
        if repeated is None:
            self._repeated = {key: [old, text]}
        elif key in repeated:
            repeated[key].append(text)
        else:
            repeated[key] = [old, text]

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_raw = 0
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        if self._refused:
            raise _ProtocolError(
                429, "TooManyRequests", "too many connections from this client, please try again later", 1
            )
        parser = self._parser
        headers = self._headers
        length = self._content_length
        te = headers.get("transfer-encoding")
        upgrade = None
        if parser.should_upgrade():
            upgrade = headers.get("upgrade")
            if not upgrade:  # llhttp reads CONNECT as an upgrade: the bytes after it are a tunnel
                raise _ProtocolError(400, "BadRequest", "the CONNECT method is not supported")
            if te is not None or length:
                # llhttp hands a body after an upgrade head over as the new protocol's bytes.
                raise _ProtocolError(400, "BadRequest", "a protocol upgrade request cannot carry a body")
        if te is not None:
            if length is not None:
                raise _ProtocolError(400, "BadRequest", "both Content-Length and Transfer-Encoding present")
            if te.strip().lower() != "chunked":
                raise _ProtocolError(400, "BadRequest", f"unsupported Transfer-Encoding {te!r}")
        elif length is not None and length > self._limits.max_body_bytes:
            raise _too_large_body(self._limits.max_body_bytes)
        version = parser.get_http_version()
        raw = self._url
        try:
            path, query = split_target(raw)
        except ValueError:
            raise _ProtocolError(400, "BadRequest", "invalid request target") from None
        # Hold the head and the announced body against the limits before reading the body.
        size = self._head_size + (length or 0)
        admission = self._admission
        total = admission.buffered + size
        if total > admission.max_buffered and not self._probe(size):
            admission.rejected["request_buffer"] += 1
            raise _too_much_buffered()
        admission.buffered = total
        self._partial = size
        # Alone, a message never exceeds the cap (413/431 first); behind others it may.
        if self._active is not None and self._held() > self._buffer_cap:
            self._pause_reading()  # resumed once the requests before this one are answered
        method = parser.get_method().decode("ascii")
        self._request = Request(
            method, raw, path, query, headers, b"", version, self._remote, self._peercert, upgrade, self._repeated
        )
        # An upgrade request is the connection's last: it switches, or closes after its answer.
        self._keep_alive = parser.should_keep_alive() and upgrade is None
        if version == "1.1" and (te is not None or length) and headers.get("expect", "").lower() == "100-continue":
            if self._active is None and not self._queue:
                self._transport.write(_CONTINUE)
            else:
                self._continue_pending = True  # sent when earlier responses are done

    def on_body(self, body: bytes) -> None:
        size = len(body)
        self._body_size += size
        if self._body_size > self._limits.max_body_bytes:
            raise _too_large_body(self._limits.max_body_bytes)
        if self._content_length is None:  # chunked: held as it arrives (a Content-Length is held up front)
            admission = self._admission
            if admission.buffered + size > admission.max_buffered:
                admission.rejected["request_buffer"] += 1
                raise _too_much_buffered()
            admission.buffered += size
            self._partial += size
            if self._active is not None and self._held() > self._buffer_cap:
                self._pause_reading()
        if self._body is None:
            self._body = [body]
        else:
            self._body.append(body)

    def on_message_complete(self) -> None:
        request = self._request
        assert request is not None
        body = self._body
        if body:
            request.body = body[0] if len(body) == 1 else b"".join(body)
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        keep_alive = self._keep_alive
        self._in_message = self._continue_pending = False
        self._reset_message()
        if not keep_alive:
            self._stop_reading()  # nothing after a Connection: close request is answered
        self._queue.append((request, keep_alive, self._partial))
        self._partial = 0
        if self._active is None:
            self._next()
        elif len(self._queue) >= MAX_PIPELINE:
            self._pause_reading()

    # -- pipeline

    def _next(self) -> None:
        """Answer the next queued request, or go idle."""
        self._active = None
        if self._active_size:
            self._answered()
        if self._closing:
            return
        queue = self._queue
        # (<=: the next request leaves the queue below, to become the active one.)
        if self._read_paused and not self._dead and len(queue) <= MAX_PIPELINE and self._held() <= self._buffer_cap:
            self._resume_reading()
        if not queue:
            if self._continue_pending:
                self._continue_pending = False
                self._transport.write(_CONTINUE)
            if not self._in_message:
                self._idle_since = self._loop.time()
                if self._ka_timer is None:
                    self._ka_timer = self._loop.call_later(self._limits.keepalive_timeout, self._on_keepalive)
            return
        item = queue.popleft()
        if isinstance(item, _ProtocolError):
            resp = Http1Response(self, False, False, False)
            resp._handler_done = True
            status = apierrors.StatusError(item.code, item.reason, item.message, retry_after=item.retry_after)
            extra = () if item.retry_after is None else (("Retry-After", str(item.retry_after)),)
            resp.send(item.code, status.body(), headers=extra)
            return
        request, keep_alive, self._active_size = item
        resp = Http1Response(self, keep_alive, request.method == "HEAD", request.http_version == "1.0")
        self._active = resp
        self._task = self._loop.create_task(self._run(request, resp))

    async def _run(self, request: Request, response: Http1Response) -> None:
        try:
            await self._handler(request, response)
        except apierrors.StatusError as err:
            if response._started:
                logger.warning("%s %s failed after the response started: %r", request.method, request.path, err)
                if not response._finished:
                    self._close()  # a truncated stream must not look complete
            else:
                extra = () if err.retry_after is None else (("Retry-After", str(err.retry_after)),)
                response.send(err.code, err.body(), content_type=err.content_type, headers=extra)
        except Exception:
            logger.exception("handler failed for %s %s", request.method, request.path)
            if response._started:
                if not response._finished:
                    self._close()
            else:
                response._keep_alive = False
                response.send(500, apierrors.internal_error().body())
        except BaseException:  # cancelled (shutdown): the response can never complete
            self._close()
            raise
        else:
            if not response._started:
                logger.error("handler for %s %s returned without responding", request.method, request.path)
                response.send(500, apierrors.internal_error().body())
        response._handler_done = True
        if self._task is asyncio.current_task():
            self._task = None
        if response._finished:
            self._finish(response)

    def _finish(self, response: Http1Response) -> None:
        """The handler returned and its response is complete: move on to the next request."""
        if not response._keep_alive:
            self._active = None
            self._close()
        elif response is self._active:
            self._next()

    def _answered(self) -> None:
        """The active request's answer has started: its bytes no longer count against the limits.

        (A watch is answered for an hour; its head must not hold the buffer meanwhile.)
        """
        self._admission.buffered -= self._active_size
        self._active_size = 0

    def _held(self) -> int:
        """Request bytes this connection holds; summed only when pipelining (queue of at most ~16)."""
        held = self._partial + self._active_size
        for item in self._queue:
            if not isinstance(item, _ProtocolError):
                held += item[2]
        return held

    def _fail(self, err: _ProtocolError) -> None:
        """Stop parsing; the error is answered after the requests before it, then we close."""
        if self._dead:
            return
        self._stop_reading()
        # The message that failed is never answered: its bytes go now.
        self._body = None
        if self._partial:
            self._admission.buffered -= self._partial
            self._partial = 0
        self._queue.append(err)
        if self._active is None:
            self._next()

    def _stop_reading(self) -> None:
        self._dead = True
        self._pause_reading()

    def _pause_reading(self) -> None:
        """Stop reading; the client's head and body clocks stop too, as it cannot send."""
        if not self._read_paused and not self._closing:
            self._read_paused = True
            self._transport.pause_reading()
        self._cancel_read_timers()

    def _resume_reading(self) -> None:
        self._read_paused = False
        self._transport.resume_reading()
        # Mid-message: the client gets a full head/body timeout again from now.
        if self._in_head:
            self._header_timer = self._loop.call_later(self._limits.header_timeout, self._on_header_timeout)
        elif self._in_message:
            self._body_timer = self._loop.call_later(self._limits.body_timeout, self._on_body_timeout)

    def _probe(self, size: int) -> bool:
        """A small body-less health probe, admitted over the request buffer limit."""
        if size > PROBE_MAX_HEAD or self._content_length or "transfer-encoding" in self._headers:
            return False
        return self._url.partition(b"?")[0] in PROBES

    # -- closing and timers

    def _close(self) -> None:
        """Close after the buffered output is flushed; nothing more is parsed or answered."""
        if not self._closing:
            self._closing = self._dead = True
            self._cancel_timers()
            self._flow.closing()
            self._transport.close()

    def _abort(self) -> None:
        if not self._lost:
            self._closing = self._dead = True
            self._cancel_timers()
            self._flow.closing()
            self._transport.abort()

    def _cancel_timers(self) -> None:
        self._cancel_read_timers()
        if self._ka_timer is not None:
            self._ka_timer.cancel()
            self._ka_timer = None

    def _cancel_read_timers(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _on_header_timeout(self) -> None:
        self._header_timer = None
        self._admission.rejected["header_timeout"] += 1
        logger.debug("closing %s: request head not received in time", self._remote)
        self._close()

    def _on_body_timeout(self) -> None:
        self._body_timer = None
        if self._dead or not self._in_message:
            return
        self._admission.rejected["body_timeout"] += 1
        logger.debug("refusing a request from %s: body not received in time", self._remote)
        timeout = self._limits.body_timeout
        self._fail(_ProtocolError(408, "Timeout", f"Timeout: the request body was not received within {timeout:g}s"))

    def _on_keepalive(self) -> None:
        # One timer per idle spell; activity only moves _idle_since, so no cancel/re-arm per request.
        self._ka_timer = None
        if self._closing or self._active is not None or self._in_message or self._queue:
            return
        remaining = self._idle_since + self._limits.keepalive_timeout - self._loop.time()
        if remaining > 0.001:
            self._ka_timer = self._loop.call_later(remaining, self._on_keepalive)
        else:
            self._close()


def _too_large_head() -> _ProtocolError:
    return _ProtocolError(431, "RequestHeaderFieldsTooLarge", "request header fields too large")


def _too_large_body(limit: int) -> _ProtocolError:
    return _ProtocolError(413, "RequestEntityTooLarge", f"request body exceeds the limit of {limit} bytes")


def _too_much_buffered() -> _ProtocolError:
    return _ProtocolError(
        429, "TooManyRequests", "too many request bytes waiting to be answered, please try again later", 1
    )


def peer_identity(transport: asyncio.BaseTransport) -> tuple[str, str, dict[str, Any] | None]:
    """The peer's ``host:port`` (for logs and X-Forwarded-For), its host (the per-client limit),
    and its verified client certificate with ``x509sha256`` (kube's credential id of a certificate
    user: the SHA-256 of its DER)."""
    peer = transport.get_extra_info("peername")
    host = remote = ""
    if isinstance(peer, tuple) and len(peer) >= 2:
        host = peer[0]
        remote = f"[{host}]:{peer[1]}" if ":" in host else f"{host}:{peer[1]}"
    peercert = transport.get_extra_info("peercert") or None
    ssl_object = transport.get_extra_info("ssl_object") if peercert else None
    if peercert and ssl_object is not None:
        peercert = {**peercert, "x509sha256": hashlib.sha256(ssl_object.getpeercert(True)).hexdigest()}
    return remote, host, peercert


def split_target(raw: bytes) -> tuple[str, dict[str, list[str]]]:
    """Decoded path and query of a request target; ValueError (incl. Unicode errors) -> 400."""
    if raw[:1] == b"/":
        path_b, _, query_b = raw.partition(b"?")
    elif raw == b"*":
        return "*", {}
    else:  # absolute-form, which servers must accept (RFC 9112 3.2.2)
        try:
            url = httptools.parse_url(raw)
        except httptools.HttpParserInvalidURLError:
            raise ValueError("invalid URL") from None
        path_b, query_b = url.path or b"/", url.query or b""
    path = unquote(path_b.decode("utf-8"), errors="strict")
    query = parse_qs(query_b.decode("utf-8"), keep_blank_values=True, errors="strict") if query_b else {}
    return path, query


def create_protocol_factory(
    handler: Handler,
    limits: HttpLimits = HttpLimits(),
    *,
    server_header: str | None = None,
    admission: Admission | None = None,
    h2: Callable[[], asyncio.Protocol] | None = None,
) -> Callable[[], asyncio.Protocol]:
    """A protocol factory for ``loop.create_server``; one ``HttpProtocol`` per connection.

    ``admission`` is shared by every connection of the server (its counters are the metrics);
    ``h2`` makes the protocol of a TLS connection whose ALPN chose HTTP/2.
    """
    server_line = _header_line("Server", server_header) if server_header else b""
    return functools.partial(HttpProtocol, handler, limits, server_line, admission or limits.admission(), h2)


async def start_server(
    handler: Handler,
    host: str,
    port: int,
    *,
    limits: HttpLimits = HttpLimits(),
    reuse_port: bool = False,
    sock: socket.socket | None = None,
    server_header: str | None = None,
    ssl: Any = None,
    admission: Admission | None = None,
    h2: Callable[[], asyncio.Protocol] | None = None,
) -> asyncio.AbstractServer:
    """Listen on ``host:port`` (or an already bound ``sock``, e.g. one per worker process); TLS with ``ssl``,
    HTTP/2 with ``h2`` when the TLS context offers it (ALPN)."""
    loop = asyncio.get_running_loop()
    factory = create_protocol_factory(handler, limits, server_header=server_header, admission=admission, h2=h2)
    kwargs: dict[str, Any] = {"backlog": 2048}
    if ssl is not None:
        kwargs["ssl"] = ssl
        # A connection is counted (Admission) once its handshake is done: until then it is bound by
        # the head timeout, as the handshake is part of sending a request (asyncio's default is 60 s).
        kwargs["ssl_handshake_timeout"] = limits.header_timeout
    if sock is not None:
        return await loop.create_server(factory, sock=sock, **kwargs)
    return await loop.create_server(factory, host, port, reuse_port=reuse_port or None, **kwargs)
