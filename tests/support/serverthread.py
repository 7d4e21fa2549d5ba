"""Run the HTTP server on a uvloop loop in a background thread; tests talk to it over real sockets.

With ``h2=True`` (and a TLS context offering ``h2`` by ALPN) the same server serves HTTP/2 as well, as
``watchcache serve --http2`` does: one handler, either protocol (tests/support/protocols.py).
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar, cast

import pytest
import uvloop

from watchcache.http.h2protocol import create_h2_factory
from watchcache.http.limits import H2Limits, HttpLimits
from watchcache.http.request import Handler
from watchcache.http.server import start_server

T = TypeVar("T")


class ServerThread:
    def __init__(self, handler: Handler, limits: HttpLimits, ssl: Any = None, h2: H2Limits | None = None) -> None:
        self.loop = uvloop.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="http-test-loop", daemon=True)
        self.thread.start()
        # Shared by the server's connections; tests read its counters.
        self.admission = limits.admission()
        h2_factory = create_h2_factory(handler, limits, h2, self.admission) if h2 is not None else None
        server = start_server(handler, "127.0.0.1", 0, limits=limits, admission=self.admission, ssl=ssl, h2=h2_factory)
        self.server = cast(asyncio.Server, self.call(server))
        self.host, self.port = self.server.sockets[0].getsockname()[:2]

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 5.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def connect(self, timeout: float = 5.0, rcvbuf: int | None = None) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.settimeout(timeout)
        sock.connect((self.host, self.port))
        return sock

    async def _shutdown(self) -> None:
        self.server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def stop(self) -> None:
        self.call(self._shutdown())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def serve() -> Iterator[Callable[..., ServerThread]]:
    """``serve(handler, limits=HttpLimits(), ssl=None)`` starts a server, stopped at teardown."""
    servers: list[ServerThread] = []

    def start(handler: Handler, limits: HttpLimits | None = None, ssl: Any = None) -> ServerThread:
        srv = ServerThread(handler, limits or HttpLimits(), ssl)
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.stop()


Serve = Callable[..., ServerThread]
"""The type of the ``serve`` fixture."""
