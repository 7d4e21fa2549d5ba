"""Connection upgrades passed through: ``kubectl exec``, ``attach``, ``cp``, ``port-forward``.

An upgrade request (``Connection: Upgrade`` with ``Upgrade: websocket`` or ``SPDY/3.1``) is
sent to the upstream on a connection of its own, with the client's identity exactly as
pass-through forwards it (``passthrough.prepare``). If the upstream answers ``101 Switching
Protocols``, that head goes to the client as received and the two connections become one
byte tunnel; any other answer (kube's 400, 403, 404 Status) is streamed back as a normal
response and the client's connection closes.

The tunnel never looks at the bytes (WebSocket, SPDY, SPDY over WebSocket are all the same
to it). Each side's ``data_received`` writes straight to the other side's transport, and
each direction has flow control: while one transport's write buffer is above its high-water
mark, the other transport stops reading — so a tunnel holds at most about two write buffers
and two reads, whatever the peers do. Limits: an idle timeout (no byte either way), a total
lifetime, and a cap on open tunnels per worker (429 when full).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import httptools

from watchcache import apierrors
from watchcache.http.flowcontrol import ConnectionClosed
from watchcache.http.request import Request
from watchcache.http.response import Response
from watchcache.server.passthrough import prepare, response_headers
from watchcache.upstream.client import UpstreamClient
from watchcache.upstream.dialing import open_connection
from watchcache.upstream.identity import PassthroughIdentity

log = logging.getLogger("watchcache.server.tunnel")

#: Metric label of an ``Upgrade`` value; kube speaks these two.
_PROTOCOLS = {"websocket": "websocket", "spdy/3.1": "spdy"}
#: An upstream response head larger than this is refused (kube's are well under 1 KB).
_MAX_HEAD = 64 * 1024

# Outcomes of an upgrade request, for watchcache_tunnels_total{outcome}.
SWITCHED = "switched"  # 101 from the upstream: a tunnel
REFUSED = "refused"  # any other answer from the upstream, passed to the client
FAILED = "failed"  # the upstream could not be reached or broke off before answering
REJECTED = "rejected"  # over --max-tunnels: 429 without asking the upstream


@dataclass(frozen=True)
class TunnelLimits:
    """Per-worker limits; the defaults are what a long ``kubectl exec -it`` session expects."""

    # No byte either way for this long closes the tunnel (the kubelet's own default,
    # --streaming-connection-idle-timeout=4h, so the proxy is never first to cut an idle shell).
    idle_timeout: float = 4 * 3600.0
    # A tunnel is closed after this long whatever it does (bounds sessions across rollouts).
    max_duration: float = 24 * 3600.0
    # Open tunnels per worker before 429: each may hold up to ~1 MB of buffers.
    max_tunnels: int = 1000
    # Write-buffer marks of the upstream connection (the client's are the HTTP server's).
    high_water: int = 256 * 1024
    low_water: int = 64 * 1024
    connect_timeout: float = 10.0


def protocol_label(upgrade: str) -> str:
    return _PROTOCOLS.get(upgrade.strip().lower(), "other")


class Tunnels:
    """The connection upgrades of one worker: admission, the open tunnels, their counters."""

    def __init__(
        self, client: UpstreamClient, limits: TunnelLimits = TunnelLimits(), identity: PassthroughIdentity | None = None
    ) -> None:
        self.client = client
        self.limits = limits
        self.identity = identity or PassthroughIdentity()
        url = urlsplit(client.config.server)
        self._tls = url.scheme == "https"
        self._host = url.hostname or "localhost"
        self._port = url.port or (443 if self._tls else 80)
        self._netloc = url.netloc
        self._prefix = url.path.rstrip("/")
        self.live: set[Tunnel] = set()
        # Plain counters, read at scrape time (server/metrics.py, TunnelCollector).
        self.open: dict[str, int] = {}
        self.outcomes: dict[tuple[str, str], int] = {}
        self.ends: dict[str, int] = {}
        self.bytes_to_upstream = 0
        self.bytes_to_client = 0
        # The handler's rejections by limit (watchcache_rejected_requests_total{limit="tunnels"}).
        self.rejected: dict[str, int] = {}

    def _count(self, protocol: str, outcome: str) -> None:
        key = (protocol, outcome)
        self.outcomes[key] = self.outcomes.get(key, 0) + 1

    async def forward(self, request: Request, response: Response) -> None:
        """Answer an upgrade request through the upstream; returns when its tunnel has closed."""
        assert request.upgrade is not None
        protocol = protocol_label(request.upgrade)
        if sum(self.open.values()) >= self.limits.max_tunnels:
            self._count(protocol, REJECTED)
            self.rejected["tunnels"] = self.rejected.get("tunnels", 0) + 1
            raise apierrors.too_many_requests("too many connection upgrades open on this server, try again later", 1)
        if not request.raw_path.startswith(b"/"):
            raise apierrors.bad_request("an upgrade request needs an origin-form target (a path)")
        self.open[protocol] = self.open.get(protocol, 0) + 1
        try:
            await self._forward(request, response, protocol)
        finally:
            self.open[protocol] -= 1

    async def _forward(self, request: Request, response: Response, protocol: str) -> None:
        tunnel = Tunnel(self, protocol)
        self.live.add(tunnel)
        try:
            upstream = await self._connect(request, tunnel)
            try:
                status = await upstream.head
            except ConnectionError as e:
                self._count(protocol, FAILED)
                if tunnel.reason in ("idle-timeout", "max-duration"):
                    raise apierrors.StatusError(
                        504, "Timeout", "the upstream apiserver did not answer the upgrade request in time"
                    ) from None
                log.warning("upgrade %s %s: the upstream broke off: %s", request.method, request.path, e)
                raise apierrors.StatusError(
                    503, "ServiceUnavailable", "the upstream apiserver closed the connection before answering"
                ) from None
            if status != 101:
                self._count(protocol, REFUSED)
                explained = self.identity.explain(request, status)
                if explained is not None:
                    raise explained
                await _relay_answer(upstream, response)
                return
            try:
                client, early = response.switch_protocols(upstream.raw_head, tunnel.client_side)
            except ConnectionClosed:
                self._count(protocol, FAILED)
                return
            self._count(protocol, SWITCHED)
            tunnel.bridge(client, early, upstream.leftover)
            await tunnel.done
        finally:
            # Normally a no-op (the tunnel has ended); else the handler was cancelled (shutdown),
            # or the upgrade was refused and its upstream connection is no longer needed.
            tunnel.close("shutdown", abort=True)
            self.live.discard(tunnel)

    async def _connect(self, request: Request, tunnel: Tunnel) -> UpstreamSide:
        forwarding = prepare(self.client, request, self.identity)
        target = self._prefix.encode("latin-1") + request.raw_path
        lines = [f"Host: {self._netloc}"]
        lines += [f"{name}: {value}" for name, value in forwarding.headers]
        lines += ["Connection: Upgrade", f"Upgrade: {request.upgrade}", "", ""]
        # Header values as pass-through writes them (UTF-8: the bytes the client sent, prepare's as_sent).
        head = b"%s %s HTTP/1.1\r\n" % (request.method.encode("latin-1"), target) + "\r\n".join(lines).encode("utf-8")
        sni = (self.client.config.tls_server_name or self._host) if self._tls else None
        try:
            async with asyncio.timeout(self.limits.connect_timeout):
                transport, upstream = await open_connection(
                    self.client.config,
                    lambda: UpstreamSide(tunnel),
                    self._host,
                    self._port,
                    ssl_context=forwarding.ssl,
                    server_hostname=sni,
                )
        except (OSError, TimeoutError) as e:  # ssl.SSLError is an OSError
            self._count(tunnel.protocol, FAILED)
            log.warning("upgrade %s %s: upstream unreachable: %s", request.method, request.path, e)
            raise apierrors.StatusError(503, "ServiceUnavailable", "the upstream apiserver is unreachable") from None
        transport = cast(asyncio.Transport, transport)
        transport.set_write_buffer_limits(high=self.limits.high_water, low=self.limits.low_water)
        transport.write(head)
        return cast(UpstreamSide, upstream)

    def close_all(self) -> None:
        """Shutdown: every tunnel is cut (its clients reconnect, as after an apiserver restart)."""
        for tunnel in list(self.live):
            tunnel.close("shutdown", abort=True)


async def _relay_answer(upstream: UpstreamSide, response: Response) -> None:
    """A non-101 answer (kube's Status for a refused exec): passed back as pass-through does."""
    headers = response_headers(upstream.headers)
    content_type = next((v for k, v in upstream.headers if k.lower() == "content-type"), None)
    if upstream.status in (204, 304):
        # As sent, none if none (``passthrough.bodyless_type``: an HTTP cache merges a 304's headers).
        response.send(upstream.status, b"", content_type=content_type or "", headers=headers)
        return
    content_type = content_type or "application/json"
    response.start_chunked(upstream.status, content_type=content_type, headers=headers)
    try:
        while chunk := await upstream.next_body():
            if response.closed:
                return
            response.write_chunk([chunk])
            if not response.writable:
                await response.drain()
    except ConnectionClosed:
        return
    except ConnectionError:
        response.abort()  # a truncated body must not look complete
        return
    response.end_chunked()


class Tunnel:
    """One upgraded connection pair: the byte relay, its flow control, timers and end."""

    def __init__(self, tunnels: Tunnels, protocol: str) -> None:
        self.tunnels = tunnels
        self.protocol = protocol
        self.loop = asyncio.get_running_loop()
        self.client_side = ClientSide(self)
        self.client: asyncio.Transport | None = None
        self.upstream: asyncio.Transport | None = None
        self.client_lost = False
        self.upstream_lost = False
        self.client_eof = False
        self.upstream_eof = False
        self.reason: str | None = None
        self.done: asyncio.Future[None] = self.loop.create_future()
        self.started = self.last_active = self.loop.time()
        self._timer: asyncio.TimerHandle | None = self.loop.call_at(self._deadline(), self._on_timer)

    def _deadline(self) -> float:
        limits = self.tunnels.limits
        return min(self.last_active + limits.idle_timeout, self.started + limits.max_duration)

    def _on_timer(self) -> None:
        # One timer; traffic only moves last_active, so no re-arming per chunk.
        self._timer = None
        now = self.loop.time()
        limits = self.tunnels.limits
        if now >= self.started + limits.max_duration:
            self.close("max-duration", abort=True)
        elif now >= self.last_active + limits.idle_timeout:
            self.close("idle-timeout", abort=True)
        else:
            self._timer = self.loop.call_at(self._deadline(), self._on_timer)

    def bridge(self, client: asyncio.Transport, early: bytes, leftover: bytes) -> None:
        """Start relaying: what each side sent ahead of the switch goes first."""
        self.client = client
        upstream = self.upstream
        assert upstream is not None
        if self.client_lost or self.upstream_lost:
            self.close("client-closed" if self.client_lost else "upstream-closed")
            return
        if leftover:
            self.to_client(leftover)
        if early:
            self.to_upstream(early)
        upstream.resume_reading()  # paused at the 101 head until the client side was ready
        side = upstream.get_protocol()
        if isinstance(side, UpstreamSide) and side.eof_pending:
            # After what resuming delivers (scheduled, like this, on the loop).
            self.loop.call_soon(self._upstream_eof)

    def _upstream_eof(self) -> None:
        if not self.half_closed("upstream") and not self.upstream_lost and self.upstream is not None:
            self.upstream.close()

    def to_upstream(self, data: bytes) -> None:
        self.last_active = self.loop.time()
        self.tunnels.bytes_to_upstream += len(data)
        if self.upstream is not None and not self.upstream_lost:
            self.upstream.write(data)

    def to_client(self, data: bytes) -> None:
        self.last_active = self.loop.time()
        self.tunnels.bytes_to_client += len(data)
        if self.client is not None and not self.client_lost:
            self.client.write(data)

    def half_closed(self, side: str) -> bool:
        """One side sent EOF: pass it on where TCP allows; returns whether to keep that side open."""
        if side == "client":
            self.client_eof = True
            own, other = self.client, self.upstream
        else:
            self.upstream_eof = True
            own, other = self.upstream, self.client
        if self.client_eof and self.upstream_eof:
            self.close("closed")
            return False
        if other is not None and other.can_write_eof():
            other.write_eof()
            # Over TLS a half-closed transport cannot stay open: it closes, then the other side.
            return own is not None and own.get_extra_info("sslcontext") is None
        self.close(f"{side}-closed")
        return False

    def lost(self, side: str) -> None:
        if side == "client":
            self.client_lost = True
        else:
            self.upstream_lost = True
        self.close(f"{side}-closed")
        if self.client_lost and self.upstream_lost and not self.done.done():
            self.done.set_result(None)

    def close(self, reason: str, *, abort: bool = False) -> None:
        """End the tunnel: both transports close (flushing, unless ``abort``); idempotent."""
        if self.reason is None:
            self.reason = reason
            if self.client is not None:  # a tunnel, not a refused or failed upgrade
                self.tunnels.ends[reason] = self.tunnels.ends.get(reason, 0) + 1
        for transport, gone in ((self.client, self.client_lost), (self.upstream, self.upstream_lost)):
            if transport is not None and not gone:
                if abort:
                    transport.abort()
                else:
                    transport.close()
        if self.client is None:
            self.client_lost = True  # never switched: the HTTP layer owns the client connection
        if self.upstream is None:
            self.upstream_lost = True
        if self.client_lost and self.upstream_lost:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if not self.done.done():
                self.done.set_result(None)

    def pause(self, transport: asyncio.Transport | None, lost: bool) -> None:
        if transport is not None and not lost and not transport.is_closing():
            transport.pause_reading()

    def resume(self, transport: asyncio.Transport | None, lost: bool) -> None:
        if transport is not None and not lost and not transport.is_closing():
            transport.resume_reading()


class ClientSide(asyncio.Protocol):
    """The client's connection after the switch (``Response.switch_protocols`` routes its events here)."""

    def __init__(self, tunnel: Tunnel) -> None:
        self.tunnel = tunnel

    def data_received(self, data: bytes) -> None:
        self.tunnel.to_upstream(data)

    def eof_received(self) -> bool:
        return self.tunnel.half_closed("client")

    def pause_writing(self) -> None:  # the client reads slower than the upstream sends
        t = self.tunnel
        t.pause(t.upstream, t.upstream_lost)

    def resume_writing(self) -> None:
        t = self.tunnel
        t.resume(t.upstream, t.upstream_lost)

    def connection_lost(self, exc: Exception | None) -> None:
        self.tunnel.lost("client")


class UpstreamSide(asyncio.Protocol):
    """The connection to the upstream: its response head, then a non-101 body or the tunnel."""

    def __init__(self, tunnel: Tunnel) -> None:
        self.tunnel = tunnel
        self.transport: asyncio.Transport | None = None
        loop = asyncio.get_running_loop()
        self.head: asyncio.Future[int] = loop.create_future()  # the status code
        self.parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)
        self.raw = bytearray()
        self.raw_head = b""
        self.leftover = b""
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self.tunnelling = False
        # A non-101 answer's body, read as the client takes it.
        self.body: deque[bytes] = deque()
        self.body_bytes = 0
        self.body_done = False
        self.error: ConnectionError | None = None
        self.wakeup: asyncio.Future[None] | None = None
        # The upstream's EOF came before the tunnel was bridged (see eof_received).
        self.eof_pending = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = self.tunnel.upstream = cast(asyncio.Transport, transport)

    # -- httptools callbacks (the response head and a non-101 body)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        assert self.parser is not None
        self.status = self.parser.get_status_code()
        if self.status != 101 and not self.head.done():
            self.head.set_result(self.status)

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        self.body_bytes += len(body)
        if self.body_bytes > self.tunnel.tunnels.limits.high_water and self.transport is not None:
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.body_done = True
        self._wake()

    # -- asyncio.Protocol

    def data_received(self, data: bytes) -> None:
        if self.tunnelling:
            self.tunnel.to_client(data)
            return
        parser = self.parser
        if parser is None:
            return  # the answer is complete: nothing more is expected
        if not self.head.done():
            self.raw += data
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            # A 101: the head ends at this offset of ``data``; what follows is already the tunnel's.
            offset = exc.args[0]
            end = len(self.raw) - len(data) + offset
            self.raw_head, self.leftover = bytes(self.raw[:end]), data[offset:]
            self.raw = bytearray()
            self.parser = None
            self.tunnelling = True
            assert self.transport is not None
            self.transport.pause_reading()  # until the client side is switched and bridged
            if not self.head.done():
                self.head.set_result(101)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionError(f"malformed response from the upstream: {exc}"))
        if self.head.done():
            self.raw = bytearray()
        elif len(self.raw) > _MAX_HEAD:
            self._fail(ConnectionError("the upstream's response head is too large"))

    def eof_received(self) -> bool:
        if self.tunnelling:
            if self.tunnel.client is None:
                # Not bridged yet: over TLS the EOF can overtake the bytes held while reading is
                # paused at the 101 (the TLS layer keeps them); pass it on after them, from bridge().
                self.eof_pending = True
                return True
            return self.tunnel.half_closed("upstream")
        if self.head.done() and not self._framed():
            self.body_done = True  # a body without Content-Length or chunked coding ends here
            self._wake()
        return False

    def _framed(self) -> bool:
        names = {k.lower() for k, _ in self.headers}
        return "content-length" in names or "transfer-encoding" in names

    def pause_writing(self) -> None:  # the upstream reads slower than the client sends
        t = self.tunnel
        t.pause(t.client, t.client_lost)

    def resume_writing(self) -> None:
        t = self.tunnel
        t.resume(t.client, t.client_lost)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.body_done:
            self.error = ConnectionError(str(exc) if exc else "the upstream closed the connection")
        if not self.head.done():
            self.head.set_exception(self.error or ConnectionError("closed"))
        self._wake()
        self.tunnel.lost("upstream")

    # -- a non-101 body, for the handler

    async def next_body(self) -> bytes:
        """The next chunk of the answer's body; b"" at its end; ConnectionError if cut short."""
        while not self.body:
            if self.body_done:
                return b""
            if self.error is not None:
                raise self.error
            self.wakeup = asyncio.get_running_loop().create_future()
            await self.wakeup
        chunk = self.body.popleft()
        self.body_bytes -= len(chunk)
        transport = self.transport
        if self.body_bytes <= self.tunnel.tunnels.limits.low_water and transport and not transport.is_closing():
            transport.resume_reading()
        return chunk

    def _wake(self) -> None:
        if self.wakeup is not None and not self.wakeup.done():
            self.wakeup.set_result(None)

    def _fail(self, error: ConnectionError) -> None:
        self.error = error
        self.parser = None
        if not self.head.done():
            self.head.set_exception(error)
        if self.transport is not None:
            self.transport.abort()
