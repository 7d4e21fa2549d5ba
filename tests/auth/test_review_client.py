"""UpstreamReviewClient: reviews go to the upstream over the proxy's own session and identity."""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest
from aiohttp import web

from watchcache.auth.gate import Gate
from watchcache.auth.review import TOKEN_REVIEW_PATH, ReviewError, UpstreamReviewClient
from watchcache.upstream.client import UpstreamClient
from watchcache.upstream.config import UpstreamConfig

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def with_server(handler: Handler, body: Callable[[UpstreamClient], Awaitable[Any]]) -> Any:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    client = UpstreamClient(UpstreamConfig(server=f"http://127.0.0.1:{port}", token="proxy-token"))
    await client.start()
    try:
        return await body(client)
    finally:
        await client.close()
        await runner.cleanup()


def test_a_review_is_posted_as_json_with_the_proxys_token() -> None:
    seen: list[tuple[str, str, dict[str, str], Any]] = []

    async def handler(req: web.Request) -> web.Response:
        body = orjson.loads(await req.read())
        seen.append((req.method, req.path, dict(req.headers), body))
        answer = {**body, "status": {"authenticated": True, "user": {"username": "alice"}}}
        return web.Response(status=201, body=orjson.dumps(answer), content_type="application/json")

    async def go(client: UpstreamClient) -> Any:
        return await UpstreamReviewClient(client).post(
            TOKEN_REVIEW_PATH, {"kind": "TokenReview", "spec": {"token": "t"}}
        )

    answer = asyncio.run(with_server(handler, go))
    assert answer["status"]["user"] == {"username": "alice"}
    method, path, headers, body = seen[0]
    assert (method, path) == ("POST", TOKEN_REVIEW_PATH)
    assert headers["Authorization"] == "Bearer proxy-token"
    assert headers["Content-Type"] == "application/json"
    assert body == {"kind": "TokenReview", "spec": {"token": "t"}}


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (403, b'{"kind":"Status","reason":"Forbidden","message":"no create on tokenreviews"}', "HTTP 403: Forbidden"),
        (500, b"oops", "HTTP 500: oops"),
        (201, b"not json", "not JSON"),
        (201, b"[1]", "not an object"),
    ],
)
def test_anything_but_a_2xx_object_is_a_review_error(status: int, body: bytes, message: str) -> None:
    async def handler(req: web.Request) -> web.Response:
        return web.Response(status=status, body=body)

    async def go(client: UpstreamClient) -> None:
        with pytest.raises(ReviewError, match=message):
            await UpstreamReviewClient(client).post(TOKEN_REVIEW_PATH, {})

    asyncio.run(with_server(handler, go))


def test_an_unreachable_upstream_is_a_review_error_and_the_gate_answers_401() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed

    async def go() -> None:
        client = UpstreamClient(UpstreamConfig(server=f"http://127.0.0.1:{port}"))
        await client.start()
        try:
            with pytest.raises(ReviewError, match=re.escape("POST /apis/authentication.k8s.io/v1/tokenreviews")):
                await UpstreamReviewClient(client).post(TOKEN_REVIEW_PATH, {})
            gate = Gate.for_upstream(client)
            with pytest.raises(Exception) as err:
                await gate.tokens.authenticate_token("t")  # type: ignore[union-attr]
            assert getattr(err.value, "code", None) == 401
        finally:
            await client.close()

    asyncio.run(go())


def test_a_client_not_started_is_a_review_error() -> None:
    client = UpstreamClient(UpstreamConfig(server="http://127.0.0.1:1"))
    with pytest.raises(ReviewError, match="not started"):
        asyncio.run(UpstreamReviewClient(client).post(TOKEN_REVIEW_PATH, {}))


def test_a_burst_of_reviews_shares_a_bounded_number_of_connections() -> None:
    """200 reviews at once (a kubelet burst: each its own node, verb and selector) are all answered,
    on at most REVIEW_CONCURRENCY connections; without the bound the session dialed one per review."""
    peers: set[Any] = set()
    in_flight = [0, 0]  # now, most

    async def handler(req: web.Request) -> web.Response:
        peers.add(req.transport.get_extra_info("peername") if req.transport else None)
        in_flight[0] += 1
        in_flight[1] = max(in_flight)
        await asyncio.sleep(0.01)
        in_flight[0] -= 1
        return web.Response(status=201, body=await req.read(), content_type="application/json")

    async def go(client: UpstreamClient) -> list[Any]:
        reviews = UpstreamReviewClient(client, concurrency=8)
        return await asyncio.gather(*(reviews.post(TOKEN_REVIEW_PATH, {"spec": {"token": str(i)}}) for i in range(200)))

    answers = asyncio.run(with_server(handler, go))
    assert [a["spec"]["token"] for a in answers] == [str(i) for i in range(200)]
    assert in_flight[1] == 8
    assert len(peers) <= 8


def test_a_review_waiting_for_its_turn_past_the_timeout_is_a_review_error() -> None:
    """The wait for a turn counts in the review's timeout: 0.2 s answers, one at a time, 0.3 s each."""

    async def handler(req: web.Request) -> web.Response:
        await asyncio.sleep(0.2)
        return web.Response(status=201, body=b"{}", content_type="application/json")

    async def go(client: UpstreamClient) -> list[Any]:
        reviews = UpstreamReviewClient(client, timeout=0.3, concurrency=1)
        return await asyncio.gather(*(reviews.post(TOKEN_REVIEW_PATH, {}) for _ in range(2)), return_exceptions=True)

    first, second = asyncio.run(with_server(handler, go))
    assert first == {}
    assert isinstance(second, ReviewError), second


def test_reviews_go_on_the_clients_pooled_exchange_connections() -> None:
    """Not aiohttp's session: its POST cost ~30% of the proxy's CPU in a kubelet burst."""

    async def handler(req: web.Request) -> web.Response:
        return web.Response(status=201, body=await req.read(), content_type="application/json")

    async def go(client: UpstreamClient) -> tuple[list[Any], int]:
        reviews = UpstreamReviewClient(client)
        answers = [await reviews.post(TOKEN_REVIEW_PATH, {"spec": {"token": str(i)}}) for i in range(3)]
        assert client.exchanges is not None
        return answers, len(client.exchanges.pools["own"].idle)

    answers, idle = asyncio.run(with_server(handler, go))
    assert [a["spec"]["token"] for a in answers] == ["0", "1", "2"]
    assert idle == 1  # one keep-alive connection, reused by each review in turn
