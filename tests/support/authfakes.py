"""Fakes for the auth tests: a scripted review client, a settable clock, requests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

from watchcache.http.request import Request
from watchcache.http.routing import RequestInfo, parse_request_info


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


Answer = Callable[[str, dict[str, Any]], Any]


class FakeReviews:
    """A ReviewClient whose answers come from ``answer(path, body)`` (an exception is raised).

    ``hold()`` makes every post wait until ``release()``, so tests can pile up
    concurrent requests on one review.
    """

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self._gate: asyncio.Event | None = None

    def hold(self) -> None:
        self._gate = asyncio.Event()

    def release(self) -> None:
        assert self._gate is not None
        self._gate.set()

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append((path, body))
        if self._gate is not None:
            await self._gate.wait()
        result = self.answer(path, body)
        if isinstance(result, BaseException):
            raise result
        answer: dict[str, Any] = result
        return answer


def token_answer(users: dict[str, dict[str, Any]]) -> Answer:
    """TokenReview answers: ``users`` maps token -> status.user; other tokens are not authenticated."""

    def answer(path: str, body: dict[str, Any]) -> dict[str, Any]:
        token = body["spec"]["token"]
        if token in users:
            status: dict[str, Any] = {"authenticated": True, "user": users[token]}
        else:
            status = {"user": {}, "error": "invalid bearer token"}
        return {**body, "status": status}

    return answer


def request(target: str = "/api/v1/namespaces/ns-1/pods", *, token: str | None = None, **headers: str) -> Request:
    parts = urlsplit(target)
    hdrs = {k.replace("_", "-").lower(): v for k, v in headers.items()}
    if token is not None:
        hdrs["authorization"] = f"Bearer {token}"
    return Request(
        method="GET",
        raw_path=target.encode(),
        path=parts.path,
        query=parse_qs(parts.query),
        headers=hdrs,
        body=b"",
        http_version="1.1",
        remote="127.0.0.1:5555",
    )


def info_of(req: Request) -> RequestInfo:
    watch = req.query_value("watch") in ("true", "1")
    return parse_request_info(req.method, req.raw_path.split(b"?", 1)[0].decode(), watch)
