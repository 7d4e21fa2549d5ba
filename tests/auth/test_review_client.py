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
