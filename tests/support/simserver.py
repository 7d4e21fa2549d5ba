"""The simulated cluster on a real socket inside the test's event loop, counting what it is asked.

As ``watchcache sim`` (the same wiring: its storage is a Cacher per resource with a history
window, answering Exact LISTs and watches at old rvs within it, 410 outside), with a tick
that sends due bookmarks, and every request counted by (verb, resource) as the proxy's
upstream would count them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from watchcache.cache.store import CacheConfig
from watchcache.http.request import Request
from watchcache.http.routing import parse_request_info
from watchcache.http.server import start_server
from watchcache.service.options import RunOptions
from watchcache.sim.cluster import SimCluster
from watchcache.sim.options import SimOptions
from watchcache.sim.wiring import wire_sim
from watchcache.upstream.client import UpstreamClient
from watchcache.upstream.config import UpstreamConfig


@dataclass
class SimServer:
    url: str
    cluster: SimCluster
    # (verb, resource) -> requests: verb is LIST, WATCH, GET or the method.
    requests: collections.Counter[tuple[str, str]]
    # The query of every request, in order.
    queries: list[tuple[str, dict[str, str]]]

    def count(self, verb: str, resource: str) -> int:
        return self.requests[(verb, resource)]


@contextlib.asynccontextmanager
async def sim_server(
    *, objects: int = 50, namespaces: int = 2, cache: CacheConfig | None = None
) -> AsyncIterator[SimServer]:
    options = RunOptions(port=0, cache=cache or CacheConfig())
    wiring = await wire_sim(options, SimOptions(objects=objects, namespaces=namespaces, churn=0))
    cluster = wiring.ctx.upstream.cluster  # type: ignore[attr-defined]
    requests: collections.Counter[tuple[str, str]] = collections.Counter()
    queries: list[tuple[str, dict[str, str]]] = []

    def count(request: Request) -> None:
        query = {k: v[0] for k, v in request.query.items()}
        info = parse_request_info(request.method, request.path, query.get("watch") in ("1", "true"))
        verb = info.verb.upper() if info.is_resource_request else request.method
        requests[(verb, info.resource)] += 1
        queries.append((verb, query))

    wiring.handler.admission.append(count)
    server = await start_server(wiring.handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]

    async def tick() -> None:
        while True:
            await asyncio.sleep(0.25)
            for cacher in list(cluster.cachers.values()):
                cacher.tick()

    ticker = asyncio.ensure_future(tick())
    try:
        yield SimServer(f"http://127.0.0.1:{port}", cluster, requests, queries)
    finally:
        ticker.cancel()
        server.close()
        for cacher in cluster.cachers.values():
            for watcher in list(cacher.dispatcher.watchers()):
                watcher.close("shutdown")
            cacher.stop()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(server.wait_closed(), 2.0)
        cluster.close()


@contextlib.asynccontextmanager
async def upstream_client(url: str) -> AsyncIterator[UpstreamClient]:
    client = UpstreamClient(UpstreamConfig(server=url))
    await client.start()
    try:
        yield client
    finally:
        await client.close()
