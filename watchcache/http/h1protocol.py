"""HTTP/1.1 server connection: a bare ``asyncio.Protocol`` on ``httptools`` (llhttp).

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

Each request is answered through an :class:`~watchcache.http.h1response.H1Response`, which
writes through this connection's :class:`~watchcache.http.h1response.H1Connection` interface
and nothing else. This module knows nothing of HTTP/2:
a TLS connection whose ALPN chose ``h2`` never reaches it (:mod:`watchcache.http.server`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any, cast

import httptools

from watchcache import apierrors
from watchcache.http.admission import Admission
from watchcache.http.flowcontrol import ConnectionClosed, FlowControl
from watchcache.http.h1gate import GRANTED, HEAD_IN, QUEUED, BodyGate, Complete, close_unread
from watchcache.http.h1response import H1Response, header_line
from watchcache.http.limits import HttpLimits
from watchcache.http.reads import read_views
from watchcache.http.request import (
    Admit,
    Handler,
    Prestart,
    Request,
    is_probe,
    origin_form,
    peer_identity,
    split_target,
)

__all__ = ["MAX_PIPELINE", "H1Protocol", "create_protocol_factory"]

logger = logging.getLogger("watchcache.http.h1protocol")

#: Complete requests parsed ahead of the one being answered before reading pauses.
MAX_PIPELINE = 16

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class _ProtocolError(Exception):
    """Raised inside parser callbacks; queued so it is answered in pipeline order."""

    def __init__(self, code: int, reason: str, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.retry_after = retry_after

    def status(self) -> apierrors.StatusError:
        return apierrors.StatusError(self.code, self.reason, self.message, retry_after=self.retry_after)


# ---------------------------------------------------------------- the protocol


class H1Protocol(asyncio.BufferedProtocol):
    """One client connection. Parser callbacks (``on_*``) are called by httptools.

    Implements :class:`~watchcache.http.h1response.H1Connection` for its responses: ``closing``,
    ``lost``, ``flow``, ``server_line``, ``finish``, ``abort`` and the methods under "for H1Response".
    """

    __slots__ = (
        "_active",
        "_active_size",
        "_admission",
        "_admit",
        "_body",
        "_body_size",
        "_body_timer",
        "_buffer_cap",
        "_client",
        "_content_length",
        "_continue_pending",
        "_counting",
        "_dead",
        "_early",
        "_gate",
        "_gating",
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
        "_parser",
        "_partial",
        "_peercert",
        "_prestart",
        "_queue",
        "_read_paused",
        "_reads",
        "_refused",
        "_remote",
        "_repeated",
        "_request",
        "_switched",
        "_task",
        "_tls",
        "_transport",
        "_unread",
        "_url",
        "closing",
        "flow",
        "lost",
        "server_line",
    )

    def __init__(
        self,
        handler: Handler,
        limits: HttpLimits,
        server_line: bytes,
        admission: Admission,
        admit: Admit | None = None,
        prestart: Prestart | None = None,
    ) -> None:
        self._handler = handler
        self._admit = admit  # flow control before the body; None: the handler admits the whole request
        self._prestart = prestart
        self._gate = 0
        self._gating: BodyGate | None = None  # the admission of a request whose body is to come
        self._unread = False  # an answer left a request body unread: the connection closes after it
        self._limits = limits
        self.server_line = server_line
        self._admission = admission
        # The client address this connection is counted under (None: not counted).
        self._client: str | None = None
        # Set when over the per-client connection limit: the first request is refused with 429.
        self._refused = False
        # Request bytes this connection holds in ``admission.buffered``: those of the message being
        # received, of the one being handled until its answer starts, and of those queued (in the queue).
        self._partial = 0
        self._active_size = 0
        self._buffer_cap = limits.connection_buffer_cap
        self._loop = asyncio.get_running_loop()
        # Into the loop's buffer: small reads while no body is being read (``http.reads``).
        self._reads = read_views(self._loop)
        # None between messages of a connection whose answer streams (a watch): made again when bytes come.
        self._parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport = None  # type: ignore[assignment]
        self._tls = False  # set in connection_made: the transport is TLS (writes are joined first)
        self.flow = FlowControl()  # the transport's pause/resume, and waiting for it
        self._remote = ""
        self._peercert: dict[str, Any] | None = None
        self.closing = False  # we closed, or the peer did: no more writes
        self.lost = False  # connection_lost was called
        self._dead = False  # no more parsing: error or a Connection: close request
        self._read_paused = False
        # (request, keep-alive, bytes held) or an error to answer in its turn. A list (at most
        # MAX_PIPELINE items): an empty deque is 600 bytes more on every idle watch's connection.
        self._queue: list[tuple[Request, bool, int] | _ProtocolError] = []
        self._active: H1Response | None = None
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
        self._counting = False  # body bytes held as they arrive: chunked, or read before its admission
        self._body: list[bytes] | None = None
        self._body_size = 0
        self._request: Request | None = None
        self._keep_alive = True

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have the same API.
        self._transport = transport = cast(asyncio.Transport, transport)
        self._tls = transport.get_extra_info("ssl_object") is not None
        transport.set_write_buffer_limits(high=self._limits.high_water, low=self._limits.low_water)
        self._remote, host, peercert = peer_identity(transport)
        refused = self._admission.connect(host)
        if refused == "connections":
            # Over the process's limit: nothing is read, nothing is held. Answering would mean
            # keeping the connection until its request arrives, which is what the limit prevents.
            logger.debug("closing %s at accept: too many connections", self._remote)
            self.closing = self._dead = True
            transport.close()
            return
        self._client = host
        self._refused = refused is not None
        self._peercert = peercert
        self._header_timer = self._loop.call_later(self._limits.header_timeout, self._on_header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = self.lost = self._dead = True
        self._cancel_timers()
        if self._gating is not None:
            self._gating.cancel()  # it leaves its queue (``cancelled``), or gives its grant back
        self.flow.connection_lost()
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
        if self._active is not None:
            self._active.connection_lost()

    def pause_writing(self) -> None:
        self.flow.pause_writing()
        if self._switched is not None:
            self._switched.pause_writing()

    def resume_writing(self) -> None:
        self.flow.resume_writing()
        if self._switched is not None:
            self._switched.resume_writing()

    def eof_received(self) -> bool | None:
        if self._switched is not None:
            return self._switched.eof_received()
        return None

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._reads[self._admit is None or (self._in_message and not self._in_head)]  # (head, body)

    def buffer_updated(self, nbytes: int) -> None:
        data = self._reads[1][:nbytes]  # a view of the loop's buffer, valid until this returns
        if self._switched is not None:
            self._switched.data_received(bytes(data))
            return
        if self._early is not None:
            # Reading is paused until the upgrade is answered, but a TLS transport may still
            # hand over what it had already decrypted: it belongs to the new protocol too.
            self._early += data
            if len(self._early) > self._limits.max_header_bytes:
                self.abort()
            return
        if self._dead:
            return
        was_in_head = self._in_head
        parser = self._parser
        if parser is None:
            parser = self._parser = httptools.HttpRequestParser(self)
        try:
            parser.feed_data(data)
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
        if self._gate == HEAD_IN and not self._dead:
            self._gate_head()
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
        assert parser is not None  # (it is calling)
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
        try:
            raw = origin_form(self._url)
            path, query, query_utf8 = split_target(raw)
        except ValueError:
            raise _ProtocolError(400, "BadRequest", "invalid request target") from None
        # A body admitted before it is read (``Admit``): only the head is held until the grant.
        gated = (te is not None or length) and self._admit is not None and upgrade is None and not self._gate
        # Hold the head and the announced body against the limits before reading the body.
        size = self._head_size + (0 if gated else length or 0)
        admission = self._admission
        total = admission.buffered + size
        if total > admission.max_buffered and not is_probe(
            self._url, size, bool(self._content_length) or "transfer-encoding" in self._headers
        ):
            admission.rejected["request_buffer"] += 1
            raise _too_much_buffered()
        admission.buffered = total
        self._partial = size
        self._counting = length is None or gated is True
        if gated:
            self._gate = HEAD_IN  # its admission starts once this read is parsed (``_gate_head``)
        # Alone, a message never exceeds the cap (413/431 first); behind others it may.
        if self._active is not None and self._held() > self._buffer_cap:
            self._pause_reading()  # resumed once the requests before this one are answered
        method = parser.get_method().decode("ascii")
        self._request = Request(
            method,
            raw,
            path,
            query,
            headers,
            b"",
            version,
            self._remote,
            self._peercert,
            upgrade,
            self._repeated,
            query_utf8=query_utf8,
        )
        # An upgrade request is the connection's last: it switches, or closes after its answer.
        self._keep_alive = parser.should_keep_alive() and upgrade is None
        if version == "1.1" and (te is not None or length) and headers.get("expect", "").lower() == "100-continue":
            if self._active is None and not self._queue and not gated:
                self._transport.write(_CONTINUE)
            else:  # sent when earlier responses are done, or at its grant (refused: no body is sent)
                self._continue_pending = True

    def on_body(self, body: bytes) -> None:
        size = len(body)
        self._body_size += size
        if self._body_size > self._limits.max_body_bytes:
            raise _too_large_body(self._limits.max_body_bytes)
        if self._counting:  # chunked, or before its admission: held as it arrives (else held up front)
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
        gate, self._gate = self._gate, 0
        if gate >= QUEUED and self._gating is not None:  # its admission's task takes it
            self._gating.body_complete((request, keep_alive, self._partial))
            self._partial = 0
            return
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
        if self.closing:
            return
        queue = self._queue
        # (<=: the next request leaves the queue below, to become the active one.)
        resume = self._read_paused and not (self._dead or self._gate) and len(queue) <= MAX_PIPELINE
        if resume and self._held() <= self._buffer_cap:
            self._resume_reading()
        if not queue:
            if self._gate == HEAD_IN:
                self._gate_head()  # the requests before it are answered: its admission starts
                return
            if self._continue_pending:
                self._continue_pending = False
                self._transport.write(_CONTINUE)
            if not self._in_message:
                self._idle_since = self._loop.time()
                if self._ka_timer is None:
                    self._ka_timer = self._loop.call_later(self._limits.keepalive_timeout, self._on_keepalive)
            return
        item = queue.pop(0)
        if isinstance(item, _ProtocolError):
            resp = H1Response(self, False, False, False)
            status = item.status()
            extra = () if item.retry_after is None else (("Retry-After", str(item.retry_after)),)
            resp.send(item.code, status.body(), headers=extra)
            resp.handler_returned()  # no handler: the error is the answer
            return
        request, keep_alive, self._active_size = item
        resp = H1Response(self, keep_alive, request.method == "HEAD", request.http_version == "1.0", request.audit_id())
        self._active = resp
        self._task = self._loop.create_task(self._run(request, resp))
        if self._prestart is not None and not request.body:
            self._prestart(request, self._task)  # (before the task's first step: it is only scheduled)

    async def _run(self, request: Request, response: H1Response) -> None:
        try:
            await self._handler(request, response)
        except apierrors.StatusError as err:
            if response.started:
                logger.warning("%s %s failed after the response started: %r", request.method, request.path, err)
                if not response.finished:
                    self._close()  # a truncated stream must not look complete
            else:
                extra = () if err.retry_after is None else (("Retry-After", str(err.retry_after)),)
                response.send(err.code, err.body(), content_type=err.content_type, headers=extra)
        except Exception:
            logger.exception("handler failed for %s %s", request.method, request.path)
            if response.started:
                if not response.finished:
                    self._close()
            else:
                response.close_after()
                response.send(500, apierrors.internal_error().body())
        except BaseException:  # cancelled (shutdown): the response can never complete
            self._close()
            raise
        else:
            if not response.started:
                logger.error("handler for %s %s returned without responding", request.method, request.path)
                response.send(500, apierrors.internal_error().body())
        if self._task is asyncio.current_task():
            self._task = None
        response.handler_returned()

    # -- admission before the body (``Admit``)

    def _gate_head(self) -> None:
        """A request's body is to come: reading pauses (the body clock too: the server keeps the client
        waiting), and its admission starts, now or once the requests before it are answered."""
        self._pause_reading()
        if self._active is not None or self._queue:
            return
        request = self._request
        admit = self._admit
        assert request is not None and admit is not None
        self._gate = QUEUED
        self._gating = gate = BodyGate(self, request)
        self._active = gate.refusal
        self._task = gate.start(admit, self._transport)

    def grant_body(self) -> None:
        """Granted: the body may come. An announced length is held now, against the request buffer."""
        length = self._content_length
        if length is not None:
            rest = length - self._body_size
            admission = self._admission
            if admission.buffered + rest > admission.max_buffered:
                admission.rejected["request_buffer"] += 1
                raise _too_much_buffered().status()
            admission.buffered += rest
            self._partial += rest
            self._counting = False
        self._gate = GRANTED
        if not self.closing:
            if self._continue_pending:
                self._continue_pending = False
                self._transport.write(_CONTINUE)
            self._resume_reading()

    def gate_refused(self, refusal: H1Response, unread: bool) -> None:
        """Answered by its admission (a 429): nothing more is parsed; the connection closes after it."""
        self._gating = None
        self._task = None
        self._unread = unread
        self._stop_reading()
        refusal.handler_returned()

    async def run_admitted(self, complete: Complete) -> None:
        """The admitted request, its body in: its handler (the grant in ``request.admitted``), as the active one."""
        self._gating = None
        request, keep_alive, self._active_size = complete
        response = H1Response(
            self, keep_alive, request.method == "HEAD", request.http_version == "1.0", request.audit_id()
        )
        self._active = response
        await self._run(request, response)

    def finish(self, response: H1Response, keep_alive: bool) -> None:
        """The handler returned and its response is complete: move on to the next request."""
        if not keep_alive:
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
        gate, self._gate = self._gate, 0
        if gate >= QUEUED and self._gating is not None:
            # Answered by its admission's task, which holds the connection's turn.
            self._gating.body_failed(err.status())
            return
        self._queue.append(err)
        if self._active is None:
            self._next()

    def _stop_reading(self) -> None:
        self._dead = True
        self._pause_reading()

    def _pause_reading(self) -> None:
        """Stop reading; the client's head and body clocks stop too, as it cannot send."""
        if not self._read_paused and not self.closing:
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

    # -- for H1Response (the H1Connection interface)

    def write(self, data: bytes) -> None:
        self._transport.write(data)

    def write_parts(self, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        """Hand ``parts`` (a watch chunk, a LIST slice) to the transport as ONE write.

        Plain TCP: ``writelines``, one ``writev`` of the parts as they are, no copy. TLS: joined
        first. uvloop's TLS transport feeds each buffer to its own ``SSL_write``, and each
        ``SSL_write`` seals at least one record: a chunk's size line and CRLF became records of a
        few bytes (29 bytes of header and tag each), a LIST of 10,000 items 20,000 records of one
        item or one comma, and uvloop pops its backlog from the front of a list (quadratic in
        the number of buffers). Joined, one ``SSL_write`` fills 16 KB records; the copy is one
        ``memcpy`` of bytes the TLS layer copies anyway (callers bound a write: ``FLUSH_BYTES``,
        ``slice_bytes``). Figures: docs/lab/performance-notebook.md, "Production configuration".
        """
        if self._tls:
            self._transport.write(b"".join(parts))
        else:
            self._transport.writelines(parts)

    def write_buffer_size(self) -> int:
        return 0 if self.closing else self._transport.get_write_buffer_size()

    def answered(self) -> None:
        if self._active_size:  # inline check: every response calls this
            self._answered()

    def streaming(self) -> None:
        """Idle watches are most of a kubelet-facing proxy's connections (docs/lab/performance-notebook.md, "Memory
        per idle watch"): the parser (~0.9 KB) goes until the client sends again, unless a pipelined
        message is half-parsed; the keep-alive timer of the spell before this request goes now."""
        if self._ka_timer is not None:
            self._ka_timer.cancel()
            self._ka_timer = None
        if not self._in_message:
            self._parser = None

    def switch_protocols(self, head: bytes, protocol: asyncio.Protocol) -> tuple[asyncio.Transport, bytes]:
        """The connection's side of ``Response.switch_protocols``: ``head``, then ``protocol`` gets its events."""
        if self._early is None:
            raise RuntimeError("switch_protocols() on a request that did not ask to upgrade")
        if self.closing:
            raise ConnectionClosed("connection closed")
        early, self._early = bytes(self._early), None
        self.answered()
        self._switched = protocol
        self._admit = None  # no request comes any more: reads are large again (``get_buffer``)
        transport = self._transport
        transport.write(head)
        if self.flow.paused:
            protocol.pause_writing()
        self._read_paused = False
        transport.resume_reading()
        return transport, early

    # -- closing and timers

    def _close(self) -> None:
        """Close after the buffered output is flushed; nothing more is parsed or answered.

        A client that takes none of it for --request-timeout is cut off: the transport would
        otherwise keep the connection and its bytes (an answer its handler finished writing, up
        to a LIST slice) for as long as the client does not read (invariant 14).
        """
        if not self.closing:
            self.closing = self._dead = True
            self._cancel_timers()
            self.flow.closing()
            if self._unread:
                close_unread(self._transport)
            else:
                self._transport.close()
            if self._limits.send_timeout > 0 and self._transport.get_write_buffer_size():
                self._loop.call_later(self._limits.send_timeout, self._on_send_timeout)

    def _on_send_timeout(self) -> None:
        if not self.lost and self._transport.get_write_buffer_size():
            self._admission.rejected["send_timeout"] += 1
            logger.debug("closing %s: its answer was not taken in time", self._remote)
            self.abort()

    def abort(self) -> None:
        """Drop the connection now, discarding buffered output."""
        if not self.lost:
            self.closing = self._dead = True
            self._cancel_timers()
            self.flow.closing()
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
        if self.closing or self._active is not None or self._in_message or self._queue:
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


def create_protocol_factory(
    handler: Handler,
    limits: HttpLimits = HttpLimits(),
    *,
    server_header: str | None = None,
    admission: Admission | None = None,
    admit: Admit | None = None,
    prestart: Prestart | None = None,
) -> Callable[[], H1Protocol]:
    """A protocol factory for ``loop.create_server``; one ``H1Protocol`` per connection.

    ``admission`` is shared by every connection of the server (its counters are the metrics);
    ``admit``, if given, admits a request whose body is to come before that body is read;
    ``prestart`` is called with a request without a body before its handler's task is made.
    """
    server_line = header_line("Server", server_header) if server_header else b""
    return functools.partial(H1Protocol, handler, limits, server_line, admission or limits.admission(), admit, prestart)
