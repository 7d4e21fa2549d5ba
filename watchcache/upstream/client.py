"""The HTTP client to the upstream apiserver (aiohttp), for the proxy's own requests.

Two sessions: ``session`` carries the proxy's identity (reflectors, discovery,
consistency probes); ``passthrough`` carries no identity of its own (no client
certificate, no token) so that forwarded requests run with the client's credentials only.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import orjson

from watchcache.resources import ResourceType
from watchcache.upstream.config import TokenSource, UpstreamConfig

USER_AGENT = "watchcache/0.1"


class UpstreamError(Exception):
    """A non-2xx answer, with the upstream's Status when it sent one."""

    def __init__(self, code: int, message: str, status: dict[str, Any] | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.status = status

    @property
    def reason(self) -> str:
        return str((self.status or {}).get("reason", ""))


class WatchStalled(Exception):
    """No byte (not even a bookmark) for longer than the stall timeout."""


def collection_path(resource: ResourceType, namespace: str | None = None) -> str:
    base = f"/apis/{resource.group}/{resource.version}" if resource.group else f"/api/{resource.version}"
    if namespace:
        return f"{base}/namespaces/{namespace}/{resource.resource}"
    return f"{base}/{resource.resource}"


async def _error_from(resp: aiohttp.ClientResponse) -> UpstreamError:
    body = await resp.read()
    try:
        status = orjson.loads(body)
        if isinstance(status, dict) and status.get("kind") == "Status":
            return UpstreamError(resp.status, str(status.get("message", "")), status)
    except orjson.JSONDecodeError:
        pass
    return UpstreamError(resp.status, body[:200].decode("utf-8", "replace"))


class UpstreamClient:
    def __init__(self, config: UpstreamConfig) -> None:
        self.config = config
        self.tokens = TokenSource(config)
        self.session: aiohttp.ClientSession | None = None
        self.passthrough: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        own = aiohttp.TCPConnector(ssl=self.config.ssl_context() or False, limit=0)
        bare = aiohttp.TCPConnector(ssl=self.config.ssl_context(with_client_cert=False) or False, limit=0)
        timeout = aiohttp.ClientTimeout(total=None, connect=10.0)
        self.session = aiohttp.ClientSession(
            connector=own, timeout=timeout, headers={"User-Agent": USER_AGENT}, auto_decompress=True
        )
        # Pass-through bytes go to the client as they came (gzip included), so no decompression.
        self.passthrough = aiohttp.ClientSession(connector=bare, timeout=timeout, auto_decompress=False)

    async def close(self) -> None:
        for s in (self.session, self.passthrough):
            if s is not None:
                await s.close()

    def url(self, path: str) -> str:
        return self.config.server + path

    def _own(self) -> aiohttp.ClientSession:
        assert self.session is not None, "UpstreamClient.start() not called"
        return self.session

    async def get_json(self, path: str, params: Mapping[str, str] | None = None, timeout: float = 30.0) -> Any:
        headers = {"Accept": "application/json", **self.tokens.headers()}
        async with self._own().get(
            self.url(path),
            params=params,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout),
            server_hostname=self.config.tls_server_name,
        ) as resp:
            if resp.status != 200:
                raise await _error_from(resp)
            return orjson.loads(await resp.read())

    async def list_rv(self, resource: ResourceType) -> int:
        """The upstream's current resourceVersion: a consistent (quorum) LIST of one item."""
        data = await self.get_json(collection_path(resource), {"limit": "1"}, timeout=10.0)
        return int(data["metadata"]["resourceVersion"])

    async def watch(
        self, resource: ResourceType, params: Mapping[str, str], *, stall_timeout: float
    ) -> AsyncIterator[list[bytes]]:
        """Yield the complete event lines of a watch stream, a batch per network read.

        Raises WatchStalled if nothing arrives for ``stall_timeout`` seconds, UpstreamError
        for a non-200 answer. Lines are split here (aiohttp's readline caps line length far
        below the size of large objects).
        """
        headers = {"Accept": "application/json", **self.tokens.headers()}
        async with self._own().get(
            self.url(collection_path(resource)),
            params={"watch": "1", **params},
            headers=headers,
            server_hostname=self.config.tls_server_name,
        ) as resp:
            if resp.status != 200:
                raise await _error_from(resp)
            pending = b""
            while True:
                try:
                    async with asyncio.timeout(stall_timeout):
                        chunk = await resp.content.readany()
                except TimeoutError:
                    raise WatchStalled(f"no data for {stall_timeout:.0f}s") from None
                if not chunk:
                    return
                data = pending + chunk if pending else chunk
                lines = data.split(b"\n")
                pending = lines.pop()
                if lines:
                    yield [line for line in lines if line]
