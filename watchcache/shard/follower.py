"""The follower side: a local replica of a resource another worker owns.

Created on the first request for the resource (``Followers.ensure``), fed by the owner's
stream: the first time, the owner's whole window (so watches resume here exactly as on the
owner) and ready once caught up to the owner's head; after a reconnect (owner restarted,
stream ended because this follower fell behind, owner relisted), a fresh state delivered
to local watchers as the difference (``Cacher.relist``), so they continue. Dropped when idle.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import grpc

from watchcache.cache.object import CachedObject
from watchcache.cache.store import CacheConfig, ResourceCache
from watchcache.dispatch.cacher import Cacher
from watchcache.resources import ResourceType
from watchcache.shard import follow_pb2 as pb
from watchcache.shard import follow_pb2_grpc as rpc
from watchcache.shard.convert import changes_from_pb, object_from_pb
from watchcache.upstream.reflector import Backoff

# Messages are cut at about 2 MB by the owner, but one object or one relist can be larger than
# any fixed limit (gRPC's default is 4 MB); this is a unix socket between our own workers.
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1)]

log = logging.getLogger("watchcache.shard.follower")


class Follower:
    def __init__(self, resource: ResourceType, cacher: Cacher, socket_path: str, me: int) -> None:
        self.resource = resource
        self.cacher = cacher
        self.socket_path = socket_path
        self.me = me
        self.backoff = Backoff(0.05, 2.0)
        self.resyncs = 0

    async def run(self) -> None:
        while True:
            try:
                await self._follow_once()
                delay = 0.0
            except asyncio.CancelledError:
                raise
            except (grpc.aio.AioRpcError, OSError, ValueError) as e:
                delay = self.backoff.next()
                log.info("following %s: %s; again in %.2fs", self.resource.qualified, _brief(e), delay)
            await asyncio.sleep(delay)

    async def _follow_once(self) -> None:
        cacher = self.cacher
        resync = cacher.ready
        # A resync builds the owner's state aside and hands it over as a relist (a diff for watchers).
        staging = ResourceCache(self.resource, CacheConfig(), cacher.clock) if resync else None
        objects: list[CachedObject] = []
        async with grpc.aio.insecure_channel(f"unix:{self.socket_path}", options=CHANNEL_OPTIONS) as channel:
            stream = rpc.OwnerStub(channel).Follow(pb.FollowRequest(resource=self.resource.path_id(), follower=self.me))
            caught_up = False
            async for batch in stream:
                kind = batch.WhichOneof("kind")
                if kind == "snapshot":
                    objects.extend(object_from_pb(o) for o in batch.snapshot.objects)
                    if batch.snapshot.last:
                        if staging is not None:
                            staging.replace(objects, batch.snapshot.resource_version)
                        else:
                            cacher.replace(objects, batch.snapshot.resource_version, ready=False)
                            # The owner's resume barrier (a relist group's rv) holds here too.
                            cacher.cache.unresumable_rv = batch.snapshot.unresumable_resource_version or None
                        objects = []
                elif kind == "events":
                    changes = changes_from_pb(batch.events.changes)
                    if staging is not None:
                        staging.apply(changes)
                    else:
                        cacher.apply(changes)
                elif kind == "progress":
                    if caught_up:
                        cacher.progress(batch.progress)
                        continue
                    caught_up = True
                    self.backoff.reset()
                    if staging is not None:
                        staging.progress(batch.progress)
                        cacher.relist(list(staging.snapshot().iter_range("", None)), staging.rv)
                        self.resyncs += 1
                        staging = None
                    else:
                        cacher.progress(batch.progress)
                        cacher.mark_ready()
                    log.info("following %s: caught up at rv %d", self.resource.qualified, cacher.rv)
                elif kind == "relist":
                    changes = changes_from_pb(batch.relist.changes)
                    cacher.relist(_after(cacher.cache, changes), batch.relist.resource_version)


def _after(state: ResourceCache, changes: list[tuple[str, CachedObject]]) -> list[CachedObject]:
    """The state's objects with ``changes`` applied (DELETED removes by key)."""
    current = {o.key: o for o in state.snapshot().iter_range("", None)}
    for kind, obj in changes:
        if kind == "DELETED":
            current.pop(obj.key, None)
        else:
            current[obj.key] = obj
    return list(current.values())


def _brief(e: BaseException) -> str:
    if isinstance(e, grpc.aio.AioRpcError):
        return f"{e.code().name}: {e.details()}"
    return f"{type(e).__name__}: {e}"


class Followers:
    """Creates followers on demand and drops idle ones."""

    def __init__(
        self,
        cachers: dict[ResourceType, Cacher],
        socket_of: Callable[[ResourceType], str],
        me: int,
        config: CacheConfig,
        *,
        ready_wait: float = 5.0,
        idle_timeout: float = 300.0,
    ) -> None:
        self.cachers = cachers
        self.socket_of = socket_of
        self.me = me
        self.config = config
        self.ready_wait = ready_wait
        self.idle_timeout = idle_timeout
        self.followers: dict[ResourceType, tuple[Follower, asyncio.Task[None]]] = {}

    def ensure(self, resource: ResourceType) -> Cacher:
        entry = self.followers.get(resource)
        if entry is not None:
            return entry[0].cacher
        cacher = Cacher(resource, self.config)
        # Until synced, requests wait (bounded) instead of getting 429 at once.
        cacher.ready_wait = self.ready_wait
        follower = Follower(resource, cacher, self.socket_of(resource), self.me)
        self.cachers[resource] = cacher
        self.followers[resource] = (follower, asyncio.ensure_future(follower.run()))
        return cacher

    def drop_idle(self) -> None:
        now = time.monotonic()
        for resource, (follower, task) in list(self.followers.items()):
            if len(follower.cacher.dispatcher) == 0 and now - follower.cacher.last_used > self.idle_timeout:
                log.info("dropping idle follower of %s", resource.qualified)
                task.cancel()
                follower.cacher.stop()
                del self.followers[resource]
                self.cachers.pop(resource, None)

    def stop(self) -> None:
        for _, task in self.followers.values():
            task.cancel()
