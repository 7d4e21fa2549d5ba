"""The simulated cluster as an upstream, in-process.

``SimUpstream`` is what ``watchcache sim`` serves from: its own storage *is* the cache.
``EmbeddedUpstream`` is what ``watchcache serve`` uses until it is pointed at a real
apiserver: a simulated cluster in the same process feeding the proxy's own caches
through exactly the ordered stream a reflector produces (``replace`` once, then
``apply`` per commit and ``progress`` for every other resource), so the proxy path
is exercised end to end without a network hop.
"""

from __future__ import annotations

from watchcache.cache.object import CachedObject
from watchcache.dispatch.cacher import Cacher
from watchcache.resources import ResourceType
from watchcache.server.http import Request
from watchcache.server.routing import RequestInfo
from watchcache.sim.cluster import SimCluster
from watchcache.sim.writes import handle_write


class SimUpstream:
    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster

    async def consistent_rv(self, resource: ResourceType) -> int:
        return self.cluster.rv

    async def write(self, request: Request, info: RequestInfo, resource: ResourceType) -> tuple[int, bytes]:
        content_type = request.headers.get("content-type", "application/json")
        return handle_write(
            self.cluster, request.method, resource, info.namespace, info.name, content_type, request.body
        )


class EmbeddedUpstream(SimUpstream):
    def __init__(self, cluster: SimCluster, cachers: dict[ResourceType, Cacher]) -> None:
        super().__init__(cluster)
        self.cachers = cachers
        for resource, cacher in cachers.items():
            source = cluster.cachers[resource].cache
            cacher.replace(list(source.snapshot().iter_range("", None)), cluster.rv)
        cluster.subscribe(self._on_commit)

    def _on_commit(self, resource: ResourceType, changes: list[tuple[str, CachedObject]], rv: int) -> None:
        for other, cacher in self.cachers.items():
            if other is resource:
                cacher.apply(changes)
            else:
                cacher.progress(rv)
