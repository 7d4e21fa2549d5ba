"""One handler, either protocol: a TLS server offering ``h2`` and ``http/1.1`` by ALPN (as ``watchcache serve
--http2``), and an httpx client held to the protocol a test is parametrised with.

Handler-level tests take the ``client_for`` fixture (tests/http/conftest.py) and run once per protocol, as
uvicorn runs one suite over both of its parsers: what a handler sees of a request, and what a client sees of
the handler's answer, must not depend on the wire. Wire-specific behaviour (pipelining, chunked framing,
flow-control windows, GOAWAY) stays in tests/http/test_http.py and tests/http/test_http2.py.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable
from contextlib import AbstractContextManager

import httpx

from harness.pki import Pair
from tests.support.serverthread import ServerThread

PROTOCOLS = ("HTTP/1.1", "HTTP/2")


class ProtocolClient:
    """httpx speaking only ``protocol`` (ALPN offers only it), checked on every response."""

    def __init__(self, server: ServerThread, protocol: str, ca: Pair) -> None:
        self.server = server
        self.protocol = protocol
        context = ssl.create_default_context(cafile=str(ca.crt))
        self.http = httpx.Client(
            base_url=f"https://127.0.0.1:{server.port}",
            http1=protocol == "HTTP/1.1",
            http2=protocol == "HTTP/2",
            verify=context,
            timeout=10,
        )

    @property
    def version(self) -> str:
        """What ``Request.http_version`` says on the server side."""
        return "1.1" if self.protocol == "HTTP/1.1" else "2"

    def request(
        self, method: str, target: str, *, headers: Iterable[tuple[str, str]] = (), body: bytes | None = None
    ) -> httpx.Response:
        response = self.http.request(method, target, headers=list(headers), content=body)
        assert response.http_version == self.protocol, response.http_version
        return response

    def get(self, target: str, *, headers: Iterable[tuple[str, str]] = ()) -> httpx.Response:
        return self.request("GET", target, headers=headers)

    def stream(self, method: str, target: str) -> AbstractContextManager[httpx.Response]:
        return self.http.stream(method, target)

    def close(self) -> None:
        self.http.close()
