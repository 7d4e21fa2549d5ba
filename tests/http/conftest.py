"""Fixtures of the HTTP tests: ``serve`` (HTTP/1.1 on a uvloop thread, raw sockets) and ``client_for`` (one
handler over TLS, a client speaking HTTP/1.1 or HTTP/2: each test that takes it runs once per protocol)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness.pki import Pair, Pki
from tests.support.protocols import PROTOCOLS, ProtocolClient
from tests.support.serverthread import ServerThread, serve
from watchcache.http.limits import H2Limits, HttpLimits
from watchcache.http.request import Handler
from watchcache.http.tls import ServingCert

__all__ = ["client_for", "serve", "serving_cert"]

ClientFor = Callable[..., ProtocolClient]


@pytest.fixture(scope="session")
def serving_cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Pair, Pair]:
    """(CA, server certificate for 127.0.0.1)."""
    pki = Pki(Path(tmp_path_factory.mktemp("http-pki")))
    ca = pki.ca("ca", "/CN=http-test-ca")
    return ca, pki.issue(ca, "server", "/CN=watchcache", ip_san="127.0.0.1")


@pytest.fixture(params=PROTOCOLS)
def client_for(request: pytest.FixtureRequest, serving_cert: tuple[Pair, Pair]) -> Iterator[ClientFor]:
    """``client_for(handler, limits=HttpLimits())``: serve ``handler`` over TLS offering both protocols; a client
    speaking this test's one."""
    ca, cert = serving_cert
    started: list[tuple[ServerThread, ProtocolClient]] = []

    def start(handler: Handler, limits: HttpLimits | None = None) -> ProtocolClient:
        tls = ServingCert(str(cert.crt), str(cert.key), http2=True)
        server = ServerThread(handler, limits or HttpLimits(), ssl=tls.context, h2=H2Limits())
        client = ProtocolClient(server, request.param, ca)
        started.append((server, client))
        return client

    yield start
    for server, client in started:
        client.close()
        server.stop()
