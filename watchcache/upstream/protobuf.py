"""Protobuf caches: one per resource that protobuf clients read, made on first use, dropped when idle.

A resource's JSON cache is fed by its reflector. When a client asks for full objects in protobuf
(kube's components, client-go's typed clients), the proxy serves kube-apiserver's own bytes from a
second cache of the resource, fed by a protobuf list+watch of the upstream (``pbreflector.py``):
at most one extra upstream watch per resource, only while protobuf clients read it (and while
JSON clients read it too: else the JSON feed is suspended, ``encodings.py``). Its life::

    (none) --a protobuf read or follower--> SYNCING --listed--> READY --idle--> (none)
                                               |
                                               +--406/415 from the upstream--> REFUSED
    REFUSED --retry_after--> (none)

    idle: synced, and no watcher, no read and no follower for idle_timeout (a cache slower to sync
    than idle_timeout is kept for the clients waiting for it).

Until it is READY, ``cacher`` returns None and the request is answered as before the cache
existed: JSON to a client that accepts it (client-go's ``protobuf, */*``), pass-through
(``protobuf``) to one that accepts protobuf only. Except in its first ``first_wait`` seconds
(``serving``): kube's components start their informers all at once and keep each first watch for
5-10 minutes, so a read then waits for the new cache to sync, as a follower's first read waits for
its snapshot, rather than settle those watches on JSON. Each cache is consistent by itself: its reads
and watches are the upstream's states at its own rvs (it never mixes with the JSON cache's).

Only the worker that owns a resource runs its protobuf cache (``owns``); another worker follows
it over the follow stream (``shard/``: a protobuf follower, made on first use and dropped when
idle, as a JSON follower), so the upstream still sees one protobuf watch per resource. The
owner's cache is not dropped while followers follow it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from watchcache.cache.protobuf import FULL_PROTOBUF, protobuf_supported
from watchcache.cache.store import CacheConfig
from watchcache.dispatch.cacher import Cacher
from watchcache.resources import ResourceType
from watchcache.upstream.backfill import UpstreamBackfill
from watchcache.upstream.client import UpstreamClient
from watchcache.upstream.failures import LastFailures
from watchcache.upstream.pbreflector import NotServedInProtobuf, ProtobufCodec, ProtobufReflector, learn_empty_object
from watchcache.upstream.reflector import ReflectorConfig

log = logging.getLogger("watchcache.upstream.protobuf")

# A read in a new protobuf cache's first seconds waits for it to sync (``serving``): its LIST and
# its kind's empty object (a bookmark, within ~2 s). As a follower's first read (shard/follower.py).
# Measured through the reference control plane (tests/reference/test_control_plane.py): without it,
# 27 of the components' 34 protobuf reads got JSON, their informers' first lists and watches.
FIRST_WAIT = 5.0


class ProtobufCaches:
    """The protobuf caches of one worker (see the module doc)."""

    def __init__(
        self,
        client: UpstreamClient,
        config: CacheConfig,
        reflector: ReflectorConfig,
        *,
        owns: Callable[[ResourceType], bool] = lambda resource: True,
        idle_timeout: float = 300.0,
        retry_after: float = 300.0,
        first_wait: float = FIRST_WAIT,
        failures: LastFailures | None = None,
        after_relist: Callable[[Cacher], object] | None = None,
        backfill: UpstreamBackfill | None = None,
    ) -> None:
        self.client = client
        self.config = config
        self.reflector_config = reflector
        self.owns = owns
        self.idle_timeout = idle_timeout
        self.retry_after = retry_after
        self.first_wait = first_wait
        self.failures = failures
        self.after_relist = after_relist
        # History older than a cache's window, from the upstream in protobuf (None: --no-backfill, 410).
        self.backfill = backfill
        self.caches: dict[ResourceType, tuple[Cacher, asyncio.Task[None]]] = {}
        # In a worker group: a follower of the owner's protobuf cache (set by the shard's wiring).
        self.follow: Callable[[ResourceType], Cacher] | None = None
        # Resources whose upstream refused protobuf: not asked again before this time (monotonic).
        self.refused: dict[ResourceType, float] = {}
        self.started = 0
        self.dropped = 0
        # A follower worker learns its kinds' empty objects (its bookmarks' template) by a watch-list
        # of its own: the owner learns from its reflector, and the follow stream carries no bookmark.
        self._learning: dict[ResourceType, asyncio.Task[bool]] = {}

    def cacher(self, resource: ResourceType) -> Cacher | None:
        """The synced protobuf cache of ``resource``, or None (then started, if it may be).

        On a worker that does not own the resource: a follower of the owner's protobuf cache
        (``follow``), made on first use, as the JSON caches' followers.
        """
        entry = self.caches.get(resource)
        if entry is not None:
            cacher = entry[0]
            # Asked for, synced or not: a cache slower to sync than idle_timeout is not dropped while
            # its clients wait for it (with a short --encoding-idle-timeout it was, and started again).
            cacher.last_used = cacher.clock()
            return cacher if cacher.ready else None
        if not protobuf_supported(resource):
            return None
        if not self.owns(resource):
            follower = self.follow(resource) if self.follow is not None else None
            if follower is not None:
                self._learn_empty(resource)
            return follower if follower is not None and follower.ready else None
        self.ensure(resource)
        return None

    def _learn_empty(self, resource: ResourceType) -> None:
        """A follower's watch-list for ``resource``'s empty object, once per worker and resource: an
        upstream without watch-lists is not asked again at every read (its bookmarks stay bare)."""
        if resource not in self._learning and not FULL_PROTOBUF.knows_empty(resource):
            self._learning[resource] = asyncio.ensure_future(learn_empty_object(self.client, resource))

    async def serving(self, resource: ResourceType) -> Cacher | None:
        """``cacher``; but while the cache is new (made less than ``first_wait`` s ago), the read waits
        for it to sync until then (see the module doc). Bounded whatever happens: a cache the upstream
        refuses stops, and its waits end with it."""
        cacher = self.cacher(resource)
        if cacher is not None:
            return cacher
        entry = self.caches.get(resource)
        if entry is not None:
            pending: Cacher | None = entry[0]
        elif self.follow is not None and protobuf_supported(resource) and not self.owns(resource):
            pending = self.follow(resource)
        else:
            return None
        if pending is None:
            return None
        remaining = pending.created + self.first_wait - pending.clock()
        if remaining <= 0 or not await pending.wait_ready(remaining):
            return None
        learning = self._learning.get(resource)
        if learning is not None and not learning.done():
            # (a follower's first watch ends its initial events with a bookmark: kube's, once learned)
            remaining = pending.created + self.first_wait - pending.clock()
            await asyncio.wait([learning], timeout=max(remaining, 0.0))
        return pending

    def synced(self, resource: ResourceType) -> Cacher | None:
        """This worker's synced protobuf cache of ``resource``, or None (never starts one)."""
        entry = self.caches.get(resource)
        return entry[0] if entry is not None and entry[0].ready else None

    def ensure(self, resource: ResourceType) -> Cacher | None:
        """This worker's protobuf cache of ``resource``, started if need be, synced or not (what a
        follower in another worker follows); None if it can have none (now)."""
        entry = self.caches.get(resource)
        if entry is not None:
            return entry[0]
        if not protobuf_supported(resource) or not self.owns(resource):
            return None
        if time.monotonic() < self.refused.get(resource, 0.0):
            return None
        self._start(resource)
        return self.caches[resource][0]

    def _start(self, resource: ResourceType) -> None:
        cacher = Cacher(resource, self.config)
        if self.backfill is not None:
            cacher.backfills = self.backfill.backfills(cacher, ProtobufCodec(resource))
        reflector = ProtobufReflector(self.client, cacher, self.reflector_config, self.failures)
        reflector.after_relist = self.after_relist
        task = asyncio.ensure_future(reflector.run())
        task.add_done_callback(lambda t: self._ended(resource, cacher, t))
        self.caches[resource] = (cacher, task)
        self.started += 1
        log.info("protobuf cache of %s: started (a protobuf client asked)", resource.qualified)

    def _ended(self, resource: ResourceType, cacher: Cacher, task: asyncio.Task[None]) -> None:
        if self.caches.get(resource, (None,))[0] is cacher:
            del self.caches[resource]
        cacher.stop()
        if task.cancelled():
            return
        error = task.exception()
        if isinstance(error, NotServedInProtobuf):
            log.info("protobuf cache of %s: the upstream does not serve it in protobuf (%s)", resource.qualified, error)
        else:
            log.error("protobuf cache of %s ended: %r", resource.qualified, error)
        self.refused[resource] = time.monotonic() + self.retry_after

    def cachers(self) -> list[Cacher]:
        """Every protobuf cache of this worker, synced or not (the process ticks them and ends their watchers)."""
        return [cacher for cacher, _ in self.caches.values()]

    def drop_idle(self) -> None:
        """Housekeeping: stop the caches no protobuf client has read for ``idle_timeout``."""
        now = time.monotonic()
        for resource, (cacher, task) in list(self.caches.items()):
            # Not while it syncs: the reads that asked for it may be waiting for it (``serving``).
            idle = cacher.ready and len(cacher.dispatcher) == 0 and not cacher.replicas
            if idle and now - cacher.last_used > self.idle_timeout:
                log.info("protobuf cache of %s: dropped (idle)", resource.qualified)
                del self.caches[resource]
                task.cancel()
                cacher.stop()
                self.dropped += 1

    def stop(self) -> None:
        for cacher, task in self.caches.values():
            task.cancel()
            cacher.stop()
        self.caches.clear()
        for learning in self._learning.values():
            learning.cancel()
