"""Pass-through: forward a request to the upstream and stream the answer back.

Used for everything the cache does not answer (writes, discovery, subresources, uncached
resources, Table requests) and for consistent reads the cache cannot prove fresh. The
request goes out as its client (``watchcache.upstream.identity``): a token as given, on a
connection that carries no identity of the proxy's; a certificate user through the
front-proxy certificate (or impersonation), or refused — so the upstream authorises the
client, not the proxy. Response bodies are streamed chunk by chunk with flow control
(``kubectl logs -f``, large lists).

``prepare`` is the one place that decides how a request goes upstream on its client's
behalf (route, header lines, TLS identity of the connection): the streamed pass-through
here and the connection-upgrade tunnels (``server/tunnel.py``) both use it.
"""

from __future__ import annotations

import logging
import re
import ssl
from collections.abc import Iterable
from dataclasses import dataclass

import aiohttp
from yarl import URL

from watchcache import apierrors
from watchcache.http.flowcontrol import ConnectionClosed
from watchcache.http.request import Request
from watchcache.http.response import Response
from watchcache.upstream.client import UpstreamClient
from watchcache.upstream.exchange import Answer, Exchanges
from watchcache.upstream.identity import PassthroughIdentity, Route

log = logging.getLogger("watchcache.server.passthrough")

# RFC 9110 7.6.1 hop-by-hop headers (plus what Connection names, per message), and what this
# hop recomputes: Host, the framing, and Expect (the whole body is already here: the client's
# 100-continue was answered by this proxy).
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "expect",
    }
)
_RESPONSE_DROP = _HOP_BY_HOP | {"date", "server", "content-type"}


def _dropped(always: frozenset[str], connection: list[str]) -> frozenset[str]:
    """``always`` plus the headers the ``Connection`` lines name (RFC 9110 7.6.1)."""
    if not connection:
        return always
    named = {token.strip().lower() for line in connection for token in line.split(",")}
    return always | named


def end_to_end_lines(request: Request) -> list[tuple[str, str]]:
    """The request's header lines as received, repeated lines kept, minus this hop's own.

    A list, not a mapping: kube-apiserver reads each ``Impersonate-Group`` and
    ``Impersonate-Extra-*`` line as one value (and each ``X-Stream-Protocol-Version`` line of an
    upgrade as one version), so two lines must stay two lines.
    """
    connection = request.headers.get("connection")
    drop = _dropped(_HOP_BY_HOP, [connection] if connection else [])
    return [(k, v) for k, v in request.header_lines() if k not in drop]


@dataclass(frozen=True, slots=True)
class Forwarding:
    """How one request goes to the upstream on its client's behalf."""

    route: Route
    # The client's header lines minus this hop's own, the identity's, and X-Forwarded-For.
    headers: list[tuple[str, str]]
    # The TLS context of the route's connections (None: plain http): no certificate of the
    # proxy's on ``CLIENT``, the front-proxy certificate on ``FRONT_PROXY``.
    ssl: ssl.SSLContext | None


def as_sent(lines: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """Header lines whose values, written as UTF-8, are the bytes the client sent.

    Both protocols hand header values over as latin-1 text: one character per byte received.
    aiohttp writes header text as UTF-8 (and so do tunnels, for the identity headers the proxy
    adds: a certificate's CN is text), which would double-encode every byte >= 0x80: ``kubectl
    --as josé`` (UTF-8 on the wire, as Go sends every header) would reach the upstream as another
    user. So values are read back as the UTF-8 they are, and go out byte for byte, on every
    forwarding path alike; bytes that are not UTF-8 cannot, and get a 400 (Go would pass them).
    """
    out = []
    for name, value in lines:
        if not value.isascii():
            try:
                value = value.encode("latin-1").decode("utf-8")
            except (UnicodeEncodeError, UnicodeDecodeError):
                raise apierrors.bad_request(
                    f"the value of request header {name!r} is not UTF-8: it cannot be forwarded as sent"
                ) from None
        out.append((name, value))
    return out


_UNSAFE_TARGET = re.compile(rb"[^\x21-\x7e]")


def escaped_target(target: bytes) -> str:
    """A request target's bytes as sent: escapes kept as they came, bytes outside ASCII's visible
    range percent-encoded, as Go's URL.EscapedPath does."""
    if _UNSAFE_TARGET.search(target) is not None:
        target = _UNSAFE_TARGET.sub(lambda m: b"%%%02X" % m[0][0], target)
    return target.decode("ascii")


def upstream_url(client: UpstreamClient, target: bytes) -> URL:
    """The upstream URL of a request target, its bytes as sent (``escaped_target``)."""
    try:
        return URL(client.url(escaped_target(target)), encoded=True)
    except ValueError:
        raise apierrors.bad_request("invalid request target") from None


def prepare(client: UpstreamClient, request: Request, identity: PassthroughIdentity) -> Forwarding:
    """Who ``request`` goes out as: the same for pass-through and tunnels. Raises the 403 of a
    client that cannot be presented as itself, the 400 of a header that cannot go out as sent."""
    route, headers = identity.outgoing(request, as_sent(end_to_end_lines(request)))
    added = client.route_headers(route)
    if added:
        headers = [*headers, *added.items()]
    forwarded = request.remote.rsplit(":", 1)[0].strip("[]")
    if forwarded:
        # On the client's route the lines are the client's own: an X-Forwarded-For among them is one it sent.
        if route is not Route.CLIENT or "x-forwarded-for" in request.headers:
            prior = ", ".join(v for k, v in headers if k == "x-forwarded-for")
            headers = [(k, v) for k, v in headers if k != "x-forwarded-for"]
            forwarded = f"{prior}, {forwarded}" if prior else forwarded
        headers.append(("x-forwarded-for", forwarded))
    return Forwarding(route, headers, client.passthrough_ssl.get(route))


_RESPONSE_DROP_BYTES = frozenset(name.encode("ascii") for name in _RESPONSE_DROP)


def answer_head(lines: Iterable[tuple[bytes, bytes]]) -> tuple[str, list[tuple[str, str]]]:
    """The Content-Type and ``response_headers`` of an answer's raw header lines, in one pass over
    the bytes (the upstream's whole head, for every passed-through GET): a line is decoded only
    if it is passed back."""
    content_type = None
    extra = []
    for name, value in lines:
        lower = name.lower()
        if lower in _RESPONSE_DROP_BYTES:
            if lower == b"connection":  # it names more to drop: the general path
                raw = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in lines]
                found = next((v for k, v in raw if k.lower() == "content-type"), "application/json")
                return found, response_headers(raw)
            if lower == b"content-type" and content_type is None:
                content_type = value.decode("latin-1")
            continue
        extra.append((name.decode("latin-1"), value.decode("latin-1")))
    return "application/json" if content_type is None else content_type, extra


def bodyless_type(lines: Iterable[tuple[bytes, bytes]]) -> str:
    """The Content-Type of an answer without a body, as the upstream sent it: "" (none) if it sent
    none. kube-apiserver's 304 has none, and an HTTP cache merges a 304's headers into the response
    it kept: client-go's (kubectl's discovery cache) then read a kept aggregated discovery
    (``application/json;g=apidiscovery.k8s.io;...``) as plain JSON, the legacy kind, and found no
    resources in it ("the server doesn't have a resource type")."""
    return next((v.decode("latin-1") for k, v in lines if k.lower() == b"content-type"), "")


def response_headers(lines: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The upstream's header lines to pass back, repeated lines kept: hop-by-hop ones (with those
    its ``Connection`` names) and those this server writes dropped. Values are latin-1 text (one
    character per byte), which both protocols write back as the bytes they were."""
    lines = list(lines)
    drop = _dropped(_RESPONSE_DROP, [v for k, v in lines if k.lower() == "connection"])
    return [(k, v) for k, v in lines if k.lower() not in drop]


@dataclass(slots=True)
class Early:
    """A GET sent to the upstream as it arrived, ahead of its handler's admission (``send_early``):
    how it went out and its answer (None: no pooled connection was idle, it goes out as usual), or
    why it cannot go out. ``exchange`` takes it; else the handler ``discard``s it at its end."""

    forwarding: Forwarding | None
    answer: Answer | None
    error: apierrors.StatusError | None = None
    taken: bool = False

    @property
    def sent(self) -> bool:
        return self.answer is not None

    def settled(self) -> bool:
        answer = self.answer
        return self.taken or answer is None or answer.complete or answer.error is not None

    def discard(self) -> bool:
        """The handler ended: an answer it did not take (refused, timed out, failed) is dropped, its
        connection closed unless the answer is complete (a complete one went back to the pool as it
        ended). True if there was one."""
        if self.taken:
            return False
        self.taken = True
        if self.answer is None:
            return False
        Exchanges.finish(self.answer)
        return True


def send_early(client: UpstreamClient, request: Request, identity: PassthroughIdentity) -> Early | None:
    """Send ``request`` (a GET ``exchange`` will carry) at once, so the upstream works while the handler's
    admission runs; None if it is not one ``exchange`` carries."""
    if not exchangeable(client, request):
        return None
    try:
        forwarding = prepare(client, request, identity)
    except apierrors.StatusError as e:  # raised by ``exchange``, if the handler gets there
        early = Early(None, None, e)
    else:
        answer = client.exchange_now(forwarding.route, escaped_target(request.raw_path), forwarding.headers)
        early = Early(forwarding, answer)
    request.early = early
    return early


def exchangeable(client: UpstreamClient, request: Request) -> bool:
    """Whether ``exchange`` may carry this request: a GET without a body, on a direct connection.
    The caller knows it ends (not a watch, not a stream)."""
    return client.exchanges is not None and request.method == "GET" and not request.body and request.upgrade is None


async def exchange(
    client: UpstreamClient, request: Request, response: Response, identity: PassthroughIdentity | None = None
) -> None:
    """``forward`` for a short GET (``exchangeable``): the upstream's answer held, up to 1 MiB, and
    sent whole with a Content-Length; a larger one streamed. Same headers, identity and errors."""
    identity = identity or PassthroughIdentity()
    early: Early | None = request.early  # type: ignore[assignment] # (ours: ``send_early``)
    sent = None
    if early is None or early.taken:
        forwarding = prepare(client, request, identity)
    else:
        early.taken = True
        if early.error is not None:
            raise early.error
        assert early.forwarding is not None
        forwarding, sent = early.forwarding, early.answer
    try:
        answer = await client.exchange(
            forwarding.route, escaped_target(request.raw_path), forwarding.headers, early=sent
        )
    except (OSError, TimeoutError) as e:
        log.warning("pass-through %s %s failed: %s", request.method, request.path, e)
        raise apierrors.StatusError(503, "ServiceUnavailable", "the upstream apiserver is unreachable") from None
    except ValueError as e:
        raise apierrors.bad_request(f"the request cannot be forwarded: {e}") from None
    try:
        explained = identity.explain(request, answer.status)
        if explained is not None:
            raise explained
        content_type, extra = answer_head(answer.headers)
        if answer.status in (204, 304):
            response.send(answer.status, b"", content_type=bodyless_type(answer.headers), headers=extra)
            return
        await answer.settle()
        if answer.complete:  # (the chunks as they are: the response joins them with its head)
            response.send(answer.status, answer.chunks, content_type=content_type, headers=extra)
            return
        response.start_chunked(answer.status, content_type=content_type, headers=extra)
        try:
            while chunks := await answer.more():
                if response.closed:
                    return
                response.write_chunk(chunks)
                if not response.writable:
                    await response.drain()
        except ConnectionClosed:
            return
        except (OSError, TimeoutError) as e:
            log.info("pass-through %s %s ended by the upstream: %s", request.method, request.path, e)
            response.abort()
            return
        response.end_chunked()
    finally:
        client.exchanges.finish(answer)  # type: ignore[union-attr]


async def forward(
    client: UpstreamClient, request: Request, response: Response, identity: PassthroughIdentity | None = None
) -> None:
    identity = identity or PassthroughIdentity()
    forwarding = prepare(client, request, identity)
    session, _ = client.passthrough_session(forwarding.route)
    url = upstream_url(client, request.raw_path)
    try:
        upstream = await session.request(
            request.method,
            url,
            headers=forwarding.headers,
            data=request.body or None,
            allow_redirects=False,
            server_hostname=client.config.tls_server_name,
            # As sent: aiohttp would label a body without Content-Type application/octet-stream,
            # which the apiserver refuses (it reads a missing Content-Type as JSON).
            skip_auto_headers=() if "content-type" in request.headers else ("Content-Type",),
        )
    except (aiohttp.ClientError, OSError, TimeoutError) as e:
        log.warning("pass-through %s %s failed: %s", request.method, request.path, e)
        raise apierrors.StatusError(503, "ServiceUnavailable", "the upstream apiserver is unreachable") from None
    except ValueError as e:
        # The client library refused what the client sent (a header it will not write): the
        # client's input, not an outage and not a 500.
        raise apierrors.bad_request(f"the request cannot be forwarded: {e}") from None
    async with upstream:
        explained = identity.explain(request, upstream.status)
        if explained is not None:
            raise explained
        # The raw lines: aiohttp's decoded ones are UTF-8 text, which a header like a webhook's
        # ``Warning: ... €`` would not survive being written back as latin-1.
        raw = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in upstream.raw_headers]
        extra = response_headers(raw)
        content_type = next((v for k, v in raw if k.lower() == "content-type"), "application/json")
        if upstream.status in (204, 304) or request.method == "HEAD":
            response.send(upstream.status, b"", content_type=bodyless_type(upstream.raw_headers), headers=extra)
            return
        response.start_chunked(upstream.status, content_type=content_type, headers=extra)
        try:
            async for chunk in upstream.content.iter_any():
                if response.closed:
                    return
                response.write_chunk([chunk])
                if not response.writable:
                    await response.drain()
        except ConnectionClosed:
            return
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            log.info("pass-through %s %s ended by the upstream: %s", request.method, request.path, e)
            response.abort()
            return
        response.end_chunked()
