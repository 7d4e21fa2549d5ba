"""Pass-through headers over real sockets: client -> our HTTP server -> forward() -> an echo upstream.

Each test runs on both paths a pass-through takes: aiohttp's (``forward``, a POST here) and the
pooled exchange of short GETs (``exchange``), which must forward and answer the same headers.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest

from tests.support.authfakes import request
from tests.support.echo_upstream import EchoUpstream, raw_request
from tests.support.serverthread import ServerThread
from watchcache.auth.authn import CertAuthenticator
from watchcache.http.request import Request
from watchcache.http.response import Response
from watchcache.server import passthrough
from watchcache.server.decision import _impersonating
from watchcache.upstream.client import UpstreamClient
from watchcache.upstream.config import from_flags
from watchcache.upstream.identity import IdentityOptions, PassthroughIdentity, Route

Serve = Callable[..., ServerThread]


@pytest.fixture(params=["forward", "exchange"])
def proxy(serve: Serve, request: pytest.FixtureRequest) -> Iterator[tuple[ServerThread, EchoUpstream]]:
    with EchoUpstream() as upstream:
        client = UpstreamClient(from_flags(upstream.url))

        async def handler(req: Request, response: Response) -> None:
            if passthrough.exchangeable(client, req):
                await passthrough.exchange(client, req, response)
            else:
                await passthrough.forward(client, req, response)

        srv = serve(handler)
        srv.call(client.start())
        METHOD[srv] = "GET" if request.param == "exchange" else "POST"
        yield srv, upstream
        srv.call(client.close())


METHOD: dict[ServerThread, str] = {}


def forward(srv: ServerThread, headers: bytes, body: bytes = b"") -> tuple[int, list[tuple[str, str]], dict]:
    """The request (a POST with ``body``, or a GET without one on the exchange path) and the echo."""
    method = METHOD[srv]
    if method == "GET":
        head = b"GET /api/v1/namespaces/default/secrets/s HTTP/1.1\r\nHost: proxy\r\n" + headers + b"\r\n"
        status, lines, payload = raw_request(srv.host, srv.port, head, b"")
        echoed = json.loads(payload)
        assert (echoed["method"], echoed["body"]) == ("GET", "")
        return status, lines, echoed
    head = b"POST /apis/authentication.k8s.io/v1/selfsubjectreviews HTTP/1.1\r\nHost: proxy\r\n" + headers
    head += b"Content-Length: %d\r\n\r\n" % len(body)
    status, lines, payload = raw_request(srv.host, srv.port, head, body)
    return status, lines, json.loads(payload)


def test_repeated_request_headers_are_forwarded_as_repeated_lines(proxy: tuple[ServerThread, EchoUpstream]) -> None:
    srv, _ = proxy
    status, _, echoed = forward(
        srv,
        b"Impersonate-User: x\r\nImpersonate-Group: a\r\nImpersonate-Group: b\r\n"
        b"Impersonate-Extra-Scopes: s1\r\nimpersonate-extra-scopes: s2\r\n"
        b"Impersonate-Group: c, d\r\n",  # one line with a comma stays one line
        b"{}",
    )
    assert status == 200
    lines = [tuple(line) for line in echoed["lines"]]
    assert [v for n, v in lines if n == "impersonate-group"] == ["a", "b", "c, d"]
    assert [v for n, v in lines if n == "impersonate-extra-scopes"] == ["s1", "s2"]
    assert ("impersonate-user", "x") in lines
    assert echoed["body"] == ("{}" if echoed["method"] == "POST" else "")


def test_hop_by_hop_and_connection_named_headers_are_dropped_both_ways(
    proxy: tuple[ServerThread, EchoUpstream],
) -> None:
    srv, _ = proxy
    status, lines, echoed = forward(
        srv,
        b"Connection: keep-alive, X-Hop-Request\r\nConnection: X-Second-Hop\r\nX-Hop-Request: secret\r\n"
        b"X-Second-Hop: secret\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\nProxy-Authorization: Basic eDp5\r\n"
        b"Upgrade: h2c\r\nX-End-To-End: kept\r\nAuthorization: Bearer t\r\n",
    )
    assert status == 200
    sent = {n for n, _ in echoed["lines"]}
    assert not sent & {"x-hop-request", "x-second-hop", "keep-alive", "te", "proxy-authorization", "upgrade"}
    assert "connection" not in sent or dict(map(tuple, echoed["lines"]))["connection"] in ("keep-alive", "close")
    assert {"x-end-to-end", "authorization"} <= sent
    # The answer: the upstream's Connection, Keep-Alive and the header its Connection names are
    # dropped; its repeated Warning lines arrive as two lines.
    received = {n for n, _ in lines}
    assert "x-hop-response" not in received and "keep-alive" not in received
    assert [v for n, v in lines if n == "warning"] == ['299 - "first"', '299 - "second"']
    assert ("x-upstream", "kept") in lines


def test_a_304_without_a_content_type_comes_back_without_one(proxy: tuple[ServerThread, EchoUpstream]) -> None:
    """kube-apiserver's 304 has no Content-Type, and an HTTP cache merges a 304's headers into the
    response it kept: one added here made kubectl's discovery cache read its aggregated discovery as
    plain JSON ("the server doesn't have a resource type")."""
    srv, _ = proxy
    head = f'{METHOD[srv]} /api HTTP/1.1\r\nHost: proxy\r\nIf-None-Match: "e1"\r\nContent-Length: 0\r\n\r\n'
    status, lines, body = raw_request(srv.host, srv.port, head.encode())
    assert (status, body) == (304, b"")
    names = [n for n, _ in lines]
    assert "content-type" not in names, lines
    assert ("etag", '"e1"') in lines and ("vary", "Accept") in lines


def test_the_upstreams_cache_control_comes_back_alone_and_ours_only_without_one(
    proxy: tuple[ServerThread, EchoUpstream],
) -> None:
    """kube-apiserver's discovery says ``public`` (its filter writes ``no-cache, private`` only where a
    handler wrote none): a passed-through answer keeps the upstream's line, never two."""
    srv, _ = proxy
    head = f'{METHOD[srv]} /api HTTP/1.1\r\nHost: proxy\r\nIf-None-Match: "e1"\r\nContent-Length: 0\r\n\r\n'
    status, lines, _ = raw_request(srv.host, srv.port, head.encode())
    assert status == 304
    assert [v for n, v in lines if n == "cache-control"] == ["public"]
    _, lines, _ = forward(srv, b"Accept: application/json\r\n")
    assert [v for n, v in lines if n == "cache-control"] == ["no-cache, private"]


def test_x_forwarded_for_appends_the_client(proxy: tuple[ServerThread, EchoUpstream]) -> None:
    srv, _ = proxy
    _, _, echoed = forward(srv, b"X-Forwarded-For: 10.0.0.1\r\nX-Forwarded-For: 10.0.0.2\r\n")
    xff = [v for n, v in echoed["lines"] if n == "x-forwarded-for"]
    assert xff == ["10.0.0.1, 10.0.0.2, 127.0.0.1"]


def test_without_x_forwarded_for_the_client_is_the_one_line(proxy: tuple[ServerThread, EchoUpstream]) -> None:
    srv, _ = proxy
    _, _, echoed = forward(srv, b"Accept: application/json\r\n")
    assert [v for n, v in echoed["lines"] if n == "x-forwarded-for"] == ["127.0.0.1"]


RAW_HEADS = [
    [],
    [(b"Content-Type", b"application/yaml"), (b"Audit-Id", b"a1"), (b"Date", b"x"), (b"Content-Length", b"2")],
    [(b"content-type", b""), (b"Content-Type", b"text/plain")],  # the first wins, empty included
    [(b"Warning", b'299 - "\xe2\x82\xac"'), (b"warning", b"two"), (b"Cache-Control", b"no-store")],
    [(b"X-Kubernetes-PF-FlowSchema-UID", b"f"), (b"Transfer-Encoding", b"chunked"), (b"Server", b"kube")],
    [(b"Connection", b"keep-alive, X-Hop"), (b"X-Hop", b"h"), (b"Content-Type", b"application/json"), (b"X-K", b"k")],
    [(b"X-A", b"1"), (b"connection", b"X-A"), (b"Keep-Alive", b"timeout=5"), (b"X-B", b"2")],
]


@pytest.mark.parametrize("raw", RAW_HEADS)
def test_answer_head_is_response_headers_and_the_first_content_type_in_one_pass(raw: list) -> None:
    lines = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in raw]
    content_type = next((v for k, v in lines if k.lower() == "content-type"), "application/json")
    assert passthrough.answer_head(raw) == (content_type, passthrough.response_headers(lines))


class RouteClient:
    """What ``prepare`` reads of an ``UpstreamClient``: the headers a route adds, its TLS contexts."""

    passthrough_ssl: dict = {}

    @staticmethod
    def route_headers(route: Route) -> dict[str, str]:
        return {"Authorization": "Bearer proxy-token"} if route is Route.PROXY else {}


CERT_USER = {"subject": ((("commonName", "cert-user"),), (("organizationName", "cert-group"),))}


@pytest.mark.parametrize("client_xff", [None, "10.0.0.1"])
def test_prepare_on_the_proxys_route_adds_its_headers_then_the_client_address(client_xff: str | None) -> None:
    identity = PassthroughIdentity(IdentityOptions("impersonate"), CertAuthenticator())
    headers = {"accept": "application/json", "authorization": "Bearer t"}
    if client_xff:
        headers["x-forwarded-for"] = client_xff
    req = request("/api/v1/namespaces/ns-1/configmaps/c", **headers)
    req.peercert = CERT_USER
    forwarding = passthrough.prepare(RouteClient(), req, identity)  # type: ignore[arg-type]
    assert forwarding.route is Route.PROXY
    assert forwarding.headers == [
        ("accept", "application/json"),
        ("Impersonate-User", "cert-user"),
        ("Impersonate-Group", "cert-group"),
        ("Authorization", "Bearer proxy-token"),
        ("x-forwarded-for", f"{client_xff}, 127.0.0.1" if client_xff else "127.0.0.1"),
    ]


@pytest.mark.parametrize(
    ("names", "impersonating"),
    [
        ((), False),
        (("accept", "authorization"), False),
        (("accept", "impersonate-user"), True),
        (("impersonate-group",), True),
        (("impersonate-extra-scopes", "accept"), True),
        (("x-impersonate-user", "impersonate"), False),  # a prefix, not a substring
    ],
)
def test_an_impersonate_header_is_found_among_the_names(names: tuple[str, ...], impersonating: bool) -> None:
    assert _impersonating(dict.fromkeys(names, "v")) is impersonating
