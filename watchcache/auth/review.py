"""How reviews reach the upstream: a one-method protocol, and its implementation over the
proxy's own upstream session.

Both ``TokenReview`` and ``SubjectAccessReview`` are a POST of a JSON object answered by
the same object with a ``status``. They are sent with **the proxy's identity** (its token
or client certificate), on the upstream client's pooled exchange connections
(``UpstreamClient.post_review``; its aiohttp ``session`` through an http(s)/socks proxy), which needs ``create`` on
``tokenreviews`` and ``subjectaccessreviews`` (the ``system:auth-delegator`` ClusterRole;
``deploy/kubernetes/base/rbac.yaml`` grants it). Anything but a 2xx JSON object is a
``ReviewError``; the callers fail closed on it.

At most ``REVIEW_CONCURRENCY`` reviews are posted at once per process; the others wait their turn
(within the review's timeout). The session dials a connection for every request in flight that
finds none idle, so a burst of kubelets, whose every first request needs a review of its own
(node, verb and selector differ), dialed a TLS connection per review: 1,657 connections from one
worker to kube-apiserver at K = 5,000, a TLS handshake each on both sides. A client-go webhook
client multiplexes its reviews on one HTTP/2 connection instead.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

import aiohttp
import orjson

TOKEN_REVIEW_PATH = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEW_PATH = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
#: Reviews in flight at once per process (so at most as many connections for them).
REVIEW_CONCURRENCY = 32


class ReviewError(Exception):
    """A review got no usable answer: network failure, non-2xx, or a body that is not a review."""


class ReviewClient(Protocol):
    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` as JSON to ``path``; the decoded 2xx answer, or raise ReviewError."""
        ...


def _status_message(data: bytes) -> str:
    try:
        status = orjson.loads(data)
    except orjson.JSONDecodeError:
        return data[:200].decode("utf-8", "replace")
    if isinstance(status, dict) and status.get("kind") == "Status":
        return f"{status.get('reason', '')}: {status.get('message', '')}"
    return "(not a Status)"


class _Tokens(Protocol):
    async def fresh_headers(self) -> dict[str, str]: ...

    def rejected(self, headers: dict[str, str]) -> None: ...


class _Config(Protocol):
    @property
    def tls_server_name(self) -> str | None: ...


class UpstreamSession(Protocol):
    """What the review client uses of ``upstream.client.UpstreamClient``: auth sits below the
    upstream package in the layering (invariant 12), so it names the shape, not the class."""

    @property
    def session(self) -> aiohttp.ClientSession | None: ...

    @property
    def tokens(self) -> _Tokens: ...

    @property
    def config(self) -> _Config: ...

    def url(self, path: str) -> str: ...

    async def post_review(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes] | None: ...


class UpstreamReviewClient:
    """``ReviewClient`` over ``UpstreamClient.session`` (the proxy's own identity)."""

    def __init__(
        self, client: UpstreamSession, *, timeout: float = 10.0, concurrency: int = REVIEW_CONCURRENCY
    ) -> None:
        self.client = client
        self.timeout = timeout
        self.turns = asyncio.Semaphore(concurrency)

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        session = self.client.session
        if session is None:
            raise ReviewError("upstream client not started")
        try:
            async with asyncio.timeout(self.timeout), self.turns:  # the wait for a turn within the timeout
                credential = await self.client.tokens.fresh_headers()
                headers = {"Accept": "application/json", "Content-Type": "application/json", **credential}
                payload = orjson.dumps(body)
                posted = await self.client.post_review(path, payload, headers)  # a pooled exchange
                if posted is not None:
                    code, data = posted
                else:  # through an http(s)/socks proxy: aiohttp's session
                    async with session.post(
                        self.client.url(path),
                        data=payload,
                        headers=headers,
                        timeout=aiohttp.ClientTimeout(total=self.timeout),
                        server_hostname=self.client.config.tls_server_name,
                    ) as resp:
                        data = await resp.read()
                        code = resp.status
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as e:
            raise ReviewError(f"POST {path}: {type(e).__name__}: {e}") from None
        if code == 401:
            self.client.tokens.rejected(credential)
        if not 200 <= code < 300:
            raise ReviewError(f"POST {path}: HTTP {code}: {_status_message(data)}")
        try:
            answer = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise ReviewError(f"POST {path}: answer is not JSON") from None
        if not isinstance(answer, dict):
            raise ReviewError(f"POST {path}: answer is not an object")
        return answer
