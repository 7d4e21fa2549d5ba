"""Pass-through: forward a request to the upstream and stream the answer back.

Used for everything the cache does not answer (writes, discovery, subresources, uncached
resources, Table requests) and for consistent reads the cache cannot prove fresh. The
request goes out as its client (``watchcache.upstream.identity``): a token as given, on a
connection that carries no identity of the proxy's; a certificate user through the
front-proxy certificate (or impersonation), or refused — so the upstream authorises the
client, not the proxy. Response bodies are streamed chunk by chunk with flow control
(``kubectl logs -f``, large lists).
"""

from __future__ import annotations

import logging

import aiohttp

from watchcache import apierrors
from watchcache.server.http import ConnectionClosed, Request, Response
from watchcache.upstream.client import UpstreamClient
from watchcache.upstream.identity import PassthroughIdentity

log = logging.getLogger("watchcache.upstream.passthrough")

# RFC 9110 7.6.1 hop-by-hop headers, plus what we recompute.
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
    }
)
_RESPONSE_DROP = _HOP_BY_HOP | {"date", "server", "content-type", "cache-control"}


async def forward(
    client: UpstreamClient, request: Request, response: Response, identity: PassthroughIdentity | None = None
) -> None:
    identity = identity or PassthroughIdentity()
    route, lines = identity.outgoing(request, ((k, v) for k, v in request.headers.items() if k not in _HOP_BY_HOP))
    session, own = client.passthrough_session(route)
    headers = [*lines, *own.items()]
    forwarded = request.remote.rsplit(":", 1)[0].strip("[]")
    if forwarded:
        prior = request.headers.get("x-forwarded-for")
        headers = [(k, v) for k, v in headers if k != "x-forwarded-for"]
        headers.append(("x-forwarded-for", f"{prior}, {forwarded}" if prior else forwarded))
    try:
        upstream = await session.request(
            request.method,
            client.url(request.raw_path.decode("latin-1")),
            headers=headers,
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
    async with upstream:
        explained = identity.explain(request, upstream.status)
        if explained is not None:
            raise explained
        extra = [(k, v) for k, v in upstream.headers.items() if k.lower() not in _RESPONSE_DROP]
        content_type = upstream.headers.get("Content-Type", "application/json")
        if upstream.status in (204, 304) or request.method == "HEAD":
            response.send(upstream.status, b"", content_type=content_type, headers=extra)
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
