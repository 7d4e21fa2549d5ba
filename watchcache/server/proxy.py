"""The upstream as the proxy sees it: consistent-read proofs, pass-through and upgrade tunnels."""

from __future__ import annotations

import asyncio
from contextlib import AbstractContextManager

from watchcache.dispatch.cacher import Cacher
from watchcache.dispatch.freshness import Reached
from watchcache.http.request import Request
from watchcache.http.response import Response
from watchcache.http.routing import RequestInfo
from watchcache.server import passthrough
from watchcache.server.limits import long_running
from watchcache.server.tunnel import Tunnels
from watchcache.upstream.client import UpstreamClient
from watchcache.upstream.consistency import ConsistentReads
from watchcache.upstream.identity import PassthroughIdentity


class ProxyUpstream:
    # kube-apiserver answers an Exact LIST older than its watch cache from etcd (200 until etcd
    # compacts that revision, then 410): only it can say which.
    answers_old_reads = True
    # A read at an rv this cache did not reach in time may be one the apiserver has: it serves some
    # resources from etcd (events, by default: no watch cache, so no bookmark proves this cache's
    # progress) and its own cache may be ahead of this one. Its answer, 200 or its 504, is kube's.
    answers_reads_ahead = True
    # kube-apiserver reads a consistent GET from etcd (``ShouldDelegateConsistentRead``): one round
    # trip, which no proof of the cache's freshness beats, and which costs it what it costs anyway.
    delegates_consistent_gets = True

    def __init__(
        self,
        client: UpstreamClient,
        consistent: ConsistentReads,
        identity: PassthroughIdentity | None = None,
        tunnels: Tunnels | None = None,
    ) -> None:
        self.client = client
        self.consistent = consistent
        self.identity = identity or PassthroughIdentity()
        self.tunnels = tunnels if tunnels is not None else Tunnels(client, identity=self.identity)

    async def current_rv(self, cacher: Cacher, timeout: float) -> int:
        return await self.consistent.current_rv(cacher, timeout)

    def proving(self, cacher: Cacher) -> AbstractContextManager[asyncio.Future[None] | None]:
        return self.consistent.proving(cacher)

    def unprovable(self, cacher: Cacher) -> bool:
        return self.consistent.unprovable(cacher)

    async def prove_scope(self, cacher: Cacher, namespace: str | None, timeout: float) -> Reached:
        return await self.consistent.prove_scope(cacher, namespace, timeout)

    def send_early(self, request: Request) -> passthrough.Early | None:
        return passthrough.send_early(self.client, request, self.identity)

    async def forward(self, request: Request, response: Response, info: RequestInfo | None) -> None:
        if request.upgrade is not None:
            await self.tunnels.forward(request, response)
        elif (info is None or not long_running(info)) and passthrough.exchangeable(self.client, request):
            await passthrough.exchange(self.client, request, response, self.identity)
        else:
            await passthrough.forward(self.client, request, response, self.identity)
