"""HTTP/2 server connection (``--http2``: ALPN ``h2`` on the TLS listener), on the kept ``h2`` library.

Each stream becomes the same :class:`~watchcache.http.request.Request` the HTTP/1.1 server
makes, answered through an :class:`~watchcache.http.h2stream.H2Response` by the same handler,
so cached reads, watches, pass-through and errors work per stream unchanged. ``h2`` does the
framing, HPACK and flow-control bookkeeping; this module decides what a stream may cost.

Writes: handlers queue bytes on their streams; the first queue of a loop pass schedules one
``_pump``, in which every marked stream turns its queue into DATA frames as far as its window and
the connection's allow (``min(window, max frame size)`` each: ``H2Response.send_frames``), and which
writes all frames of the pass
-- HEADERS, DATA, acks of every stream -- in ONE ``transport.write``. A stream whose window is
closed waits in ``_blocked`` until a WINDOW_UPDATE; its queue stops growing at the high-water
mark (:attr:`H2Response.writable`), and its watcher takes the slow path of an HTTP/1.1 watcher
whose socket is full (bounded buffer, lag and catch up, the process-wide budget).

Limits that hold before authentication, as Go's http2 server and kube-apiserver set them
(docs/security.md, "HTTP/2"); every refusal is counted in ``Admission.rejected``:

- SETTINGS_MAX_CONCURRENT_STREAMS (kube's ``--http2-max-streams-per-connection``, 100); a
  client that opens more anyway gets that stream reset (REFUSED_STREAM before it acknowledged
  the SETTINGS, PROTOCOL_ERROR after: Go's), counted here rather than by ``h2``, which would end
  the connection; handlers still running for streams the client reset count too, and past 4x
  the limit the connection gets GOAWAY ENHANCE_YOUR_CALM (Go's ``too_many_early_resets``).
- malformed requests (RFC 9113 8.1.1: header names and values as Go's ``httpguts``, pseudo-
  headers, Content-Length against the body): RST_STREAM PROTOCOL_ERROR, a stream error;
  resets the server sends for such errors draw from the rapid-reset bucket, as the client's own.
- a client that takes no byte for ``--request-timeout`` while bytes wait for it (windows it
  never opens, or an unread socket): the connection is closed.
- header list: over ``--max-header-bytes`` 431 (as Go), over twice that a connection error
  (HPACK bomb); a request with a connection-specific header (``Connection``, ``Upgrade``, ...)
  400 with kube's Status (connection upgrades -- exec, attach, port-forward -- need HTTP/1.1).
- request bodies: 413 over ``--max-body-bytes``, 408 if not complete within
  ``--body-timeout``, 429 over the process's request buffer, as on HTTP/1.1.
- rapid reset (CVE-2023-44487): streams the client resets before their answer is complete
  draw from a token bucket; empty, it is GOAWAY ENHANCE_YOUR_CALM and close.
- PING / SETTINGS / PRIORITY / empty-DATA floods: another bucket; and, as Go's
  ``maxQueuedControlFrames``, at most 10,000 control frames answered while the client does
  not read.
- kube's UnauthenticatedHTTP2DOSMitigation: after a request that was anonymous or got 401
  (``Request.close_connection``), GOAWAY: the streams open finish, no new one is served.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from typing import Any, cast

import h2.connection
import h2.events
import h2.exceptions
import h2.settings
from h2.errors import ErrorCodes
from hyperframe.frame import GoAwayFrame

from watchcache import apierrors
from watchcache.http.admission import Admission
from watchcache.http.flowcontrol import FlowControl
from watchcache.http.h2gate import admit_then_handle
from watchcache.http.h2headers import Refused, read_fields, read_target, too_large_body, too_much_buffered
from watchcache.http.h2state import server_connection
from watchcache.http.h2stream import BLOCKED, ENDED, H2Response
from watchcache.http.limits import H2Limits, HttpLimits
from watchcache.http.request import Admit, Handler, Prestart, Request, is_probe, peer_identity
from watchcache.ratelimit import TokenBucket

__all__ = ["H2Connections", "H2Protocol", "create_h2_factory"]

logger = logging.getLogger("watchcache.http.h2protocol")


class H2Protocol(asyncio.Protocol):
    """One HTTP/2 client connection: its streams, their handlers, and the limits on what it may cost.

    Implements :class:`~watchcache.http.h2stream.StreamConnection` for its streams (``closing``,
    ``lost``, ``flow``, ``server_header``, the stream water marks, and the methods under "for
    H2Response"); reads a stream's state and moves it only through ``H2Response``'s methods.
    """

    def __init__(
        self,
        handler: Handler,
        limits: HttpLimits,
        h2limits: H2Limits,
        server_line: bytes,
        admission: Admission,
        admit: Admit | None = None,
        prestart: Prestart | None = None,
    ) -> None:
        self._handler = handler
        self._admit = admit  # a stream whose body is to come is admitted before it (``h2gate``)
        self._prestart = prestart
        self._limits = limits
        self._h2limits = h2limits
        self.server_header = server_line.partition(b": ")[2].strip() if server_line else b""
        self._admission = admission
        self._loop = asyncio.get_running_loop()
        self.stream_high_water = limits.high_water
        self.stream_low_water = limits.low_water
        self.flow = FlowControl()
        self.closing = False  # no more writes: we closed, or the peer did
        self.lost = False
        self._transport: asyncio.Transport = None  # type: ignore[assignment]
        self._client: str | None = None
        self._refused = False
        self._remote = ""
        self._peercert: dict[str, Any] | None = None
        self._conn = server_connection(limits, h2limits)
        self._streams: dict[int, H2Response] = {}
        self._dirty: dict[int, H2Response] = {}
        self._blocked: dict[int, H2Response] = {}
        self._pump_scheduled = False
        # Request bytes this connection holds (Admission.buffered), against --max-connection-buffer-bytes.
        self._held = 0
        self._buffer_cap = limits.connection_buffer_cap
        # Handler tasks alive, those of streams already reset included (Go's curHandlers).
        self._tasks = 0
        now = self._loop.time()
        self._resets = TokenBucket(h2limits.reset_rate, h2limits.reset_burst, now)
        self._control = TokenBucket(h2limits.control_rate, h2limits.control_burst, now)
        self._queued_control = 0
        # The client acknowledged our SETTINGS: it knows the stream limit (Go's unackedSettings == 0).
        self._settings_acked = False
        # Graceful GOAWAY sent: streams above this id are refused, the connection closes when idle.
        self._goaway_last: int | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._idle_since = now
        # Bytes handed to the transport; what the client took is that minus the transport's buffer.
        self._written = 0
        # While bytes wait (a stream's window closed, or the transport's buffer not empty): the
        # bytes taken when the wait was last seen to move, checked every --request-timeout.
        self._stall_timer: asyncio.TimerHandle | None = None
        self._stall_mark = 0
        # Blocked streams whose handler is done, and their unsent bytes at the last check.
        self._stuck: dict[int, int] = {}

    # ------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport = cast(asyncio.Transport, transport)
        transport.set_write_buffer_limits(high=self._limits.high_water, low=self._limits.low_water)
        self._remote, host, self._peercert = peer_identity(transport)
        refused = self._admission.connect(host)
        if refused == "connections":
            self.closing = True
            transport.close()
            return
        self._client = host
        self._refused = refused is not None
        self._admission.h2_connections += 1
        conn = self._conn
        conn.initiate_connection()
        window = self._h2limits.initial_window_size * self._h2limits.max_concurrent_streams
        if window > 65535:
            conn.increment_flow_control_window(window - 65535)
        self._write(conn.data_to_send())
        # The preface and a first request within the head timeout; then the idle timeout between streams.
        self._timer = self._loop.call_later(self._limits.header_timeout, self._on_timer)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = self.lost = True
        self.flow.connection_lost()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        for stream in list(self._streams.values()):
            self._drop(stream)
        self._admission.h2_streams -= len(self._streams)
        self._streams.clear()
        self._dirty.clear()
        self._blocked.clear()
        if self._client is not None:
            self._admission.disconnect(self._client)
            self._admission.h2_connections -= 1
            self._client = None

    def pause_writing(self) -> None:
        self.flow.pause_writing()
        self._watch_stall()

    def resume_writing(self) -> None:
        self.flow.resume_writing()
        self._queued_control = 0
        if self._blocked:
            self._dirty.update(self._blocked)
            self._blocked.clear()
        self._schedule()
        # Streams whose queue is short already were waiting on the transport alone.
        for stream in self._streams.values():
            if stream.write_buffer_size() <= self.stream_low_water:
                stream.wake_writers()

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        conn = self._conn
        try:
            events = conn.receive_data(data)
            # h2 checks a frame's length once the whole frame is in: a header announcing 16 MB
            # would be buffered first. Refused as soon as the header is (Go's framer does so).
            pending = conn.incoming_buffer._data  # noqa: SLF001 -- h2 is pinned; it has no public view of it
            if len(pending) >= 9 and int.from_bytes(pending[:3], "big") > conn.max_inbound_frame_size:
                raise h2.exceptions.FrameTooLargeError("frame larger than SETTINGS_MAX_FRAME_SIZE")
            for event in events:
                self._event(event)
                if self.closing:
                    return
        except h2.exceptions.ProtocolError as e:
            code = getattr(e, "error_code", ErrorCodes.PROTOCOL_ERROR)
            limit = "http2_streams" if isinstance(e, h2.exceptions.TooManyStreamsError) else "http2_protocol"
            self._admission.rejected[limit] += 1
            logger.debug("closing %s: HTTP/2 %s (%s)", self._remote, e, code)
            if not self.closing:
                if conn.state_machine.state != h2.connection.ConnectionState.CLOSED:
                    conn.close_connection(code)
                self._close()  # the GOAWAY is written before the close
            return
        if not self._pump_scheduled:
            self._write_pending()

    def eof_received(self) -> bool | None:
        return None

    # ------------------------------------------------------------ events

    def _event(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.DataReceived):
            self._on_data(event)
        elif isinstance(event, h2.events.RequestReceived):
            self._on_request(event)
        elif isinstance(event, h2.events.StreamEnded):
            stream = self._streams.get(event.stream_id or 0)
            if stream is not None:
                self._remote_end(stream)
        elif isinstance(event, h2.events.WindowUpdated):
            self._on_window(event.stream_id or 0)
        elif isinstance(event, h2.events.StreamReset):
            self._on_reset(event)
        elif isinstance(event, h2.events.PingReceived | h2.events.PriorityUpdated):
            self._control_frame()
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            self._control_frame()
            if h2.settings.SettingCodes.INITIAL_WINDOW_SIZE in event.changed_settings:
                self._on_window(0)
        elif isinstance(event, h2.events.TrailersReceived):
            stream = self._streams.get(event.stream_id or 0)
            if stream is not None and event.stream_ended:
                self._remote_end(stream)
        elif isinstance(event, h2.events.SettingsAcknowledged):
            self._settings_acked = True
        elif isinstance(event, h2.events.ConnectionTerminated):
            self._close()

    def _control_frame(self) -> None:
        if self._control.take(self._loop.time()):
            self._enhance_your_calm("http2_control_flood")
            return
        if self.flow.paused:
            self._queued_control += 1
            if self._queued_control > self._h2limits.max_queued_control_frames:
                self._enhance_your_calm("http2_control_flood")

    def _enhance_your_calm(self, limit: str) -> None:
        self._admission.rejected[limit] += 1
        logger.debug("closing %s: %s", self._remote, limit)
        self._fatal(ErrorCodes.ENHANCE_YOUR_CALM)

    def _on_request(self, event: h2.events.RequestReceived) -> None:
        sid = cast(int, event.stream_id)
        if self._goaway_last is not None and sid > self._goaway_last:
            self._reset_for_client(sid, ErrorCodes.REFUSED_STREAM, None)
            return
        if self._tasks >= 4 * self._h2limits.max_concurrent_streams:
            self._enhance_your_calm("http2_streams")  # Go: too_many_early_resets
            return
        if len(self._streams) >= self._h2limits.max_concurrent_streams:
            # Go's net/http2: only that stream is refused; PROTOCOL_ERROR once the client has
            # acknowledged the SETTINGS that told it the limit, REFUSED_STREAM (retry) before.
            code = ErrorCodes.PROTOCOL_ERROR if self._settings_acked else ErrorCodes.REFUSED_STREAM
            self._reset_for_client(sid, code, "http2_streams")
            return
        if self._timer is not None and not self._streams:
            self._timer.cancel()
            self._timer = None
        stream = H2Response(self, sid)
        self._streams[sid] = stream
        self._admission.h2_streams += 1
        gated = self._admit is not None and event.stream_ended is None
        try:
            request = self._request(stream, event.headers or [], gated)
        except Refused as refusal:
            self._refuse(stream, refusal)
            return
        except ValueError:  # a malformed request (RFC 9113 8.1.1): a stream error, as Go's
            self._forget(stream)
            self._reset_for_client(sid, ErrorCodes.PROTOCOL_ERROR, "http2_protocol")
            return
        timer = None
        if event.stream_ended is None and not gated:  # else the StreamEnded event that follows starts the handler
            timer = self._loop.call_later(self._limits.body_timeout, self._on_body_timeout, stream)
        stream.begin(request, timer)
        if gated:  # the body clock starts at its grant (``grant_body``)
            self._start(stream, request, gated=True)

    def _request(self, stream: H2Response, block: list[tuple[bytes, bytes]], gated: bool) -> Request:
        """The request of a HEADERS block (checked in ``h2headers``); raises Refused (answered with a
        Status) or ValueError (reset)."""
        fields = read_fields(block, self._limits)
        if self._refused:
            self._goaway()  # this connection is over the per-client limit: no further stream
            raise Refused(
                apierrors.too_many_requests("too many connections from this client, please try again later", 1)
            )
        target = read_target(fields, self._limits)
        # Held against the limits until answered, as an HTTP/1.1 request's head and announced body
        # (a body admitted before it is read: its head until its grant).
        held = fields.size + (0 if gated else target.length)
        admission = self._admission
        if not is_probe(target.raw, held, bool(target.length)) and (
            admission.buffered + held > admission.max_buffered or self._held + held > self._buffer_cap
        ):
            admission.rejected["request_buffer"] += 1
            raise Refused(too_much_buffered())
        self._hold(stream, held)
        return Request(
            fields.method,
            target.raw,
            target.path,
            target.query,
            fields.headers,
            b"",
            "2",
            self._remote,
            self._peercert,
            None,
            fields.repeated,
            query_utf8=target.query_utf8,
        )

    def _on_data(self, event: h2.events.DataReceived) -> None:
        sid = cast(int, event.stream_id)
        size = len(event.data or b"")
        stream = self._streams.get(sid)
        # The window reopens at once (what a body may hold is bounded by the limits below, not by
        # it), but a queued stream's: what it may hold is its window (``h2gate``).
        if stream is None or not stream.withhold(event.flow_controlled_length or 0):
            self._conn.acknowledge_received_data(event.flow_controlled_length or 0, sid)
        if stream is None or not stream.wants_body:
            return  # a refused stream's remaining body: dropped
        request = cast(Request, stream.request)
        if not size and not event.stream_ended:
            self._control_frame()  # an empty DATA frame carries nothing
            return
        length = request.headers.get("content-length")
        if length is not None and stream.body_size + size > int(length):
            self._malformed(stream)  # more than it announced: Go's "send_too_much" stream error
            return
        if stream.body_size + size > self._limits.max_body_bytes:
            self._refuse(stream, Refused(too_large_body(self._limits.max_body_bytes)))
            return
        if length is None or stream.queued:  # announced bodies were held up front (or at the grant)
            admission = self._admission
            if admission.buffered + size > admission.max_buffered or self._held + size > self._buffer_cap:
                admission.rejected["request_buffer"] += 1
                self._refuse(stream, Refused(too_much_buffered()))
                return
            self._hold(stream, size)
        stream.add_body(event.data or b"")

    def _remote_end(self, stream: H2Response) -> None:
        """END_STREAM: the request is complete, unless its body is shorter than it announced (malformed)."""
        stream.remote_end()
        request = stream.request
        if stream.wants_body and request is not None:
            length = request.headers.get("content-length")
            if length is not None and stream.body_size != int(length):
                self._malformed(stream)
                return
        self._request_complete(stream)

    def _malformed(self, stream: H2Response) -> None:
        """A request found malformed while its body arrives (RFC 9113 8.1.1): a stream error, no handler."""
        stream.refuse()
        self._drop(stream)
        self._forget(stream)
        self._reset_for_client(stream.sid, ErrorCodes.PROTOCOL_ERROR, "http2_protocol")

    def _reset_for_client(self, sid: int, code: ErrorCodes, limit: str | None) -> None:
        """RST_STREAM for the client's own error. It costs the client as its own resets do, from the
        same bucket: resets a client makes the server send are work at its pace too (Go's net/http2
        counts them, CVE-2025-8671); empty, GOAWAY ENHANCE_YOUR_CALM."""
        if limit is not None:
            self._admission.rejected[limit] += 1
        if self._resets.take(self._loop.time()):
            self._enhance_your_calm("http2_rapid_reset")
            return
        self._rst(sid, code)

    def _rst(self, sid: int, code: ErrorCodes) -> None:
        """RST_STREAM, unless ``h2`` closed the stream already: a frame later in the same read (the
        client's own RST_STREAM) is processed before this read's events are handled."""
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self._conn.reset_stream(sid, code)

    def _request_complete(self, stream: H2Response) -> None:
        request = stream.complete_request()
        if request is not None and not stream.gated:  # (a gated stream's task takes it)
            self._start(stream, request)

    def _start(self, stream: H2Response, request: Request, gated: bool = False) -> None:
        """The stream's task: its handler, or (``gated``) its admission, then its body, then its handler."""
        self._tasks += 1
        if gated:
            assert self._admit is not None
            task = self._loop.create_task(admit_then_handle(self, stream, request, self._admit, stream.gate()))
        else:
            task = self._loop.create_task(self._run(stream, request))
            if self._prestart is not None and not request.body:
                self._prestart(request, task)  # (before the task's first step: it is only scheduled)
        stream.run(task)
        # A callback, not a finally: a task cancelled before it ever ran (reset at once) runs no finally.
        task.add_done_callback(lambda _: self._handler_done(stream, request))

    def _on_body_timeout(self, stream: H2Response) -> None:
        if not stream.body_late():
            return
        self._admission.rejected["body_timeout"] += 1
        timeout = self._limits.body_timeout
        error = apierrors.StatusError(408, "Timeout", f"Timeout: the request body was not received within {timeout:g}s")
        self._refuse(stream, Refused(error))

    def _on_window(self, sid: int) -> None:
        blocked = self._blocked
        if not blocked:
            return
        if sid == 0:
            self._dirty.update(blocked)
            blocked.clear()
        else:
            stream = blocked.pop(sid, None)
            if stream is None:
                return
            self._dirty[sid] = stream
        self._schedule()

    def _on_reset(self, event: h2.events.StreamReset) -> None:
        stream = self._streams.get(cast(int, event.stream_id))
        if stream is None:
            return
        if event.remote_reset and not stream.end_sent and self._resets.take(self._loop.time()):
            self._enhance_your_calm("http2_rapid_reset")
            return
        self._drop(stream)
        self._forget(stream)

    # ------------------------------------------------------------ handlers

    async def _run(self, stream: H2Response, request: Request) -> None:
        try:
            await self._handler(request, stream)
        except apierrors.StatusError as err:
            if stream.started:
                logger.warning("%s %s failed after the response started: %r", request.method, request.path, err)
            else:
                extra = () if err.retry_after is None else (("Retry-After", str(err.retry_after)),)
                stream.send(err.code, err.body(), content_type=err.content_type, headers=extra)
        except asyncio.CancelledError:
            pass  # the stream was reset or the connection lost: nobody to answer
        except Exception:
            logger.exception("handler failed for %s %s", request.method, request.path)
            if not stream.started:
                stream.send(500, apierrors.internal_error().body())
        else:
            if not stream.started:
                logger.error("handler for %s %s returned without responding", request.method, request.path)
                stream.send(500, apierrors.internal_error().body())

    run = _run  # for ``h2gate.GatedStreams``, as the two methods below

    def grant_body(self, stream: H2Response) -> None:
        """Admitted: its announced body held (over the request buffer: a StatusError), what it withheld
        acknowledged (its window reopens), its body clock started."""
        length = cast(Request, stream.request).headers.get("content-length")
        if length is not None and stream.wants_body:
            rest, admission = int(length) - stream.body_size, self._admission
            if admission.buffered + rest > admission.max_buffered or self._held + rest > self._buffer_cap:
                admission.rejected["request_buffer"] += 1
                raise too_much_buffered()
            self._hold(stream, rest)
        self._reopen(stream)
        stream.grant(self._loop.call_later(self._limits.body_timeout, self._on_body_timeout, stream))

    def gate_refused(self, stream: H2Response) -> None:
        """Answered before its body was read: what comes of it is dropped, what it withheld acknowledged."""
        stream.stop_body()
        self._reopen(stream)

    def _reopen(self, stream: H2Response) -> None:
        """Acknowledge the DATA a queued stream withheld: its window (and the connection's) reopens."""
        withheld = stream.unwithhold()
        if withheld and not self.lost:
            with contextlib.suppress(h2.exceptions.ProtocolError):  # (a stream closed: the connection's only)
                self._conn.acknowledge_received_data(withheld, stream.sid)
            self._schedule()

    def _handler_done(self, stream: H2Response, request: Request) -> None:
        self._tasks -= 1
        stream.handler_returned()
        if not stream.finished and not stream.reset:
            self.reset_stream(stream, internal=True)  # a truncated body must not look complete
        if (request.close_connection or stream.status == 401) and not self.closing:
            # kube's UnauthenticatedHTTP2DOSMitigation: a client nobody authenticated gets one request.
            self._admission.rejected["http2_unauthenticated"] += 1
            self._goaway()
        self._maybe_forget(stream)

    # ------------------------------------------------------------ for H2Response

    def answered(self, stream: H2Response) -> None:
        """The stream's answer starts: its request bytes no longer count against the limits."""
        held = stream.release()
        if held:
            self._admission.buffered -= held
            self._held -= held

    def send_headers(self, stream: H2Response, fields: list[tuple[bytes, bytes]]) -> None:
        if stream.reset or self.closing:
            return
        try:
            self._conn.send_headers(stream.sid, fields)
        except h2.exceptions.ProtocolError:
            return  # closed by the client in this read (h2 may have forgotten it): its StreamReset drops it
        self._schedule()

    def mark(self, stream: H2Response) -> None:
        """``stream`` has bytes (or its end) to send: in the next pump."""
        if stream.sid not in self._blocked:
            self._dirty[stream.sid] = stream
            self._schedule()

    def reset_stream(self, stream: H2Response, *, internal: bool = False) -> None:
        if stream.reset or self.lost:
            return
        if not stream.end_sent:
            self._rst(stream.sid, ErrorCodes.INTERNAL_ERROR if internal else ErrorCodes.CANCEL)
            self._schedule()
        self._drop(stream)
        self._maybe_forget(stream)

    # ------------------------------------------------------------ writing

    def _schedule(self) -> None:
        if not self._pump_scheduled and not self.lost:
            self._pump_scheduled = True
            self._loop.call_soon(self._pump)

    def _pump(self) -> None:
        """Every marked stream's queue as DATA within its windows, then one write for the pass."""
        self._pump_scheduled = False
        if self.lost:
            return
        conn = self._conn
        if self._dirty and not self.flow.paused:
            dirty, self._dirty = self._dirty, {}
            max_frame = conn.max_outbound_frame_size
            for sid, stream in dirty.items():
                try:
                    sent = stream.send_frames(conn, max_frame)
                except h2.exceptions.StreamClosedError:  # closed under us: nothing more to send on it
                    self._drop(stream)
                    self._maybe_forget(stream)
                    continue
                if sent == BLOCKED:
                    self._blocked[sid] = stream
                    self._watch_stall()
                elif sent == ENDED:
                    self._maybe_forget(stream)
        self._write_pending()

    def _write(self, data: bytes) -> None:
        self._written += len(data)
        self._transport.write(data)

    def _write_pending(self) -> None:
        data = self._conn.data_to_send()
        if data and not self.lost:
            self._write(data)
        if self._goaway_last is not None and not self._streams and not self.closing:
            self._close()

    # ------------------------------------------------------------ stream lifetime

    def _hold(self, stream: H2Response, size: int) -> None:
        stream.hold(size)
        self._held += size
        self._admission.buffered += size

    def _refuse(self, stream: H2Response, refusal: Refused) -> None:
        """Answer ``stream`` with a Status now; the handler never sees it."""
        if refusal.limit is not None:
            self._admission.rejected[refusal.limit] += 1
        stream.refuse()
        self._reopen(stream)
        err = refusal.error
        extra = () if err.retry_after is None else (("Retry-After", str(err.retry_after)),)
        if not stream.started and not stream.reset:
            stream.send(err.code, err.body(), headers=extra)
        self._maybe_forget(stream)

    def _drop(self, stream: H2Response) -> None:
        """The stream is gone (reset, or the connection lost): stop its handler and release what it holds."""
        self.answered(stream)
        self._reopen(stream)
        self._dirty.pop(stream.sid, None)
        self._blocked.pop(stream.sid, None)
        stream.gone()

    def _maybe_forget(self, stream: H2Response) -> None:
        if stream.done:
            self._forget(stream)

    def _forget(self, stream: H2Response) -> None:
        if self._streams.pop(stream.sid, None) is None:
            return
        self.answered(stream)
        self._admission.h2_streams -= 1
        if not self._streams and not self.lost:
            if self._goaway_last is not None:
                self._schedule()  # written, then closed
            elif self._timer is None:
                self._idle_since = self._loop.time()
                self._timer = self._loop.call_later(self._limits.keepalive_timeout, self._on_timer)

    # ------------------------------------------------------------ closing

    @property
    def transport_ready(self) -> bool:
        return self._transport is not None and not self.lost

    def goaway(self) -> None:
        """Shutdown: let the open streams finish, take no new one (see ``H2Connections``)."""
        self._goaway()
        self._write_pending()

    def _goaway(self) -> None:
        """Graceful GOAWAY (NO_ERROR): the streams open finish, no new one is served, then close.

        Written by hand: ``h2`` moves to CLOSED on a GOAWAY and would refuse the open streams' DATA.
        """
        if self._goaway_last is not None or self.closing:
            return
        last = self._conn.highest_inbound_stream_id
        self._goaway_last = last
        frame = GoAwayFrame(0)
        frame.last_stream_id = last
        frame.error_code = ErrorCodes.NO_ERROR
        pending = self._conn.data_to_send()
        self._write(pending + frame.serialize())
        self._schedule()

    def _fatal(self, code: ErrorCodes) -> None:
        if not self.closing:
            self._conn.close_connection(code)
            self._close()

    def _close(self) -> None:
        if self.closing:
            return
        data = self._conn.data_to_send()
        if data and not self.lost:
            self._write(data)
        self.closing = True
        self.flow.closing()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for stream in list(self._streams.values()):
            self._drop(stream)
        self._transport.close()
        # A client that takes nothing would hold the connection open forever: the close (and
        # its GOAWAY) waits for the bytes before it.
        self._watch_stall()

    def _watch_stall(self) -> None:
        """Bytes wait for the client: from now, it must take some every --request-timeout."""
        if self._stall_timer is None and not self.lost and self._limits.send_timeout > 0:
            self._stall_mark = self._written - self._transport.get_write_buffer_size()
            self._stall_timer = self._loop.call_later(self._limits.send_timeout, self._on_stall_check)

    def _on_stall_check(self) -> None:
        """Close a connection whose waiting bytes did not move for a whole --request-timeout.

        Whatever its streams are (LISTs whose windows the client never opens, watches, answers
        whose handlers returned), if none of their bytes was taken in that time the client is
        not reading: its streams, their buffers and its descriptor go (Go's http2 WriteByteTimeout;
        watches keep their own lag rules while the connection's bytes move). Invariant 14.
        """
        self._stall_timer = None
        if self.lost:
            return
        buffered = self._transport.get_write_buffer_size()
        if not (self._blocked or buffered):
            self._stuck = {}
            return  # nothing waits: watched again at the next wait
        taken = self._written - buffered
        if taken != self._stall_mark:
            self._stall_mark = taken
            self._reset_stuck_answers()
            self._stall_timer = self._loop.call_later(self._limits.send_timeout, self._on_stall_check)
            return
        self._admission.rejected["send_timeout"] += 1
        logger.debug("closing %s: no byte taken in %gs", self._remote, self._limits.send_timeout)
        if not self.closing:
            self._conn.close_connection(ErrorCodes.NO_ERROR)
            self._close()
        self._transport.abort()

    def _reset_stuck_answers(self) -> None:
        """Reset the streams whose handler is done and whose answer, behind a window the client keeps
        closed, did not move since the last check: on a connection whose other streams move (so it
        stays open), each would otherwise keep its queue for as long as the connection lives."""
        stuck, self._stuck = self._stuck, {}
        for sid, stream in list(self._blocked.items()):
            if not (stream.finished and stream.handler_done):
                continue
            size = stream.write_buffer_size()
            if stuck.get(sid) == size:
                self._admission.rejected["send_timeout"] += 1
                self.reset_stream(stream)
            else:
                self._stuck[sid] = size

    def _on_timer(self) -> None:
        """No request yet within the head timeout, or idle (no stream) for the keep-alive timeout: close."""
        self._timer = None
        if self.closing or self._streams:
            return
        if self._conn.highest_inbound_stream_id == 0:
            self._admission.rejected["header_timeout"] += 1
            self._fatal(ErrorCodes.NO_ERROR)
            return
        remaining = self._idle_since + self._limits.keepalive_timeout - self._loop.time()
        if remaining > 0.001:
            self._timer = self._loop.call_later(remaining, self._on_timer)
        else:
            self._goaway()


class H2Connections:
    """What the HTTP/1.1 protocol hands a TLS connection to when ALPN chose ``h2``; knows the live ones.

    ``goaway_all`` at shutdown, as Go's ``http2.Server`` does: a GOAWAY (NO_ERROR) tells each client
    that its open streams finish here and new ones belong on a new connection (another worker or
    replica), instead of racing a request against the close.
    """

    def __init__(
        self,
        handler: Handler,
        limits: HttpLimits,
        h2limits: H2Limits,
        admission: Admission,
        server_line: bytes = b"",
        admit: Admit | None = None,
        prestart: Prestart | None = None,
    ) -> None:
        self._args = (handler, limits, h2limits, server_line, admission, admit, prestart)
        self._live: weakref.WeakSet[H2Protocol] = weakref.WeakSet()

    def __call__(self) -> H2Protocol:
        proto = H2Protocol(*self._args)
        self._live.add(proto)
        return proto

    def goaway_all(self) -> int:
        """GOAWAY on every open connection; how many got one."""
        sent = 0
        for proto in list(self._live):
            if not proto.closing and proto.transport_ready:
                proto.goaway()
                sent += 1
        return sent


def create_h2_factory(
    handler: Handler,
    limits: HttpLimits,
    h2limits: H2Limits,
    admission: Admission,
    server_line: bytes = b"",
    admit: Admit | None = None,
    prestart: Prestart | None = None,
) -> H2Connections:
    """What the HTTP/1.1 protocol hands a TLS connection to when ALPN chose ``h2``; ``admit`` and
    ``prestart``: as ``server.start_server``'s."""
    return H2Connections(handler, limits, h2limits, admission, server_line, admit, prestart)
