"""The listening socket: one protocol per connection, HTTP/1.1 or, on TLS with ALPN ``h2``, HTTP/2.

Which protocol a TLS connection speaks is known once its handshake is done (ALPN). As hypercorn's
``ProtocolWrapper`` does, such a connection starts with a chooser that, at ``connection_made``,
makes the protocol ALPN chose and hands it the transport; so the HTTP/1.1 module
(:mod:`watchcache.http.h1protocol`) and the HTTP/2 module (:mod:`watchcache.http.h2protocol`) never
import each other, and the HTTP/2 side is handed in as a factory (``h2``). Without it (plain TCP,
or ``--http2`` off) connections go to HTTP/1.1 directly.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

from watchcache.http.admission import Admission
from watchcache.http.h1protocol import create_protocol_factory
from watchcache.http.limits import HttpLimits
from watchcache.http.request import Admit, Handler, Prestart

__all__ = ["start_server"]


class _ByAlpn(asyncio.Protocol):
    """A TLS connection until its handshake is done: then the protocol ALPN chose takes it over."""

    __slots__ = ("_h1", "_h2")

    def __init__(self, h1: Callable[[], asyncio.BaseProtocol], h2: Callable[[], asyncio.BaseProtocol]) -> None:
        self._h1 = h1
        self._h2 = h2

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        ssl_object = transport.get_extra_info("ssl_object")
        http2 = ssl_object is not None and ssl_object.selected_alpn_protocol() == "h2"
        protocol = self._h2() if http2 else self._h1()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)


async def start_server(
    handler: Handler,
    host: str,
    port: int,
    *,
    limits: HttpLimits = HttpLimits(),
    sock: socket.socket | None = None,
    server_header: str | None = None,
    ssl: Any = None,
    admission: Admission | None = None,
    h2: Callable[[], asyncio.BaseProtocol] | None = None,
    admit: Admit | None = None,
    prestart: Prestart | None = None,
) -> asyncio.AbstractServer:
    """Listen on ``host:port`` (or on ``sock``, already listening: ``http.listener``); TLS with ``ssl``,
    HTTP/2 with ``h2`` (``h2protocol.create_h2_factory``) when the TLS context offers it (ALPN);
    ``admit``: the handler's admission of a request before its body is read (``request.Admit``);
    ``prestart``: what starts before a bodyless request's handler (``request.Prestart``)."""
    loop = asyncio.get_running_loop()
    factory: Callable[[], asyncio.BaseProtocol]
    factory = h1 = create_protocol_factory(
        handler, limits, server_header=server_header, admission=admission, admit=admit, prestart=prestart
    )
    kwargs: dict[str, Any] = {"backlog": 2048}
    if ssl is not None:
        kwargs["ssl"] = ssl
        # A connection is counted (Admission) once its handshake is done: until then it is bound by
        # the head timeout, as the handshake is part of sending a request (asyncio's default is 60 s).
        kwargs["ssl_handshake_timeout"] = limits.header_timeout
        if h2 is not None:
            factory = lambda: _ByAlpn(h1, h2)  # noqa: E731
    if sock is not None:
        return await loop.create_server(factory, sock=sock, **kwargs)
    return await loop.create_server(factory, host, port, **kwargs)
