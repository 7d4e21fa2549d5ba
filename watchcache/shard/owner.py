"""The owner side of the shard stream: serve a resource's cache to followers in other workers.

A follower gets the owner's state at the start of its history window (``snapshot(oldest_rv)``,
the MVCC read), then every event of the window, then a progress mark at the owner's rv when
it registered — from there on every change as it happens. So the follower ends up with the
same window as the owner, and a client can resume a watch on any worker.

The replica feed is registered in the same synchronous step as the snapshot and history are
taken, so nothing falls between them. It is bounded: a follower that falls more than
``max_pending`` messages behind has its stream ended and follows again from a snapshot.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

import grpc

from watchcache.cache.events import WatchEvent
from watchcache.cache.object import CachedObject
from watchcache.dispatch.cacher import Cacher
from watchcache.resources import ResourceType
from watchcache.shard import follow_pb2 as pb
from watchcache.shard import follow_pb2_grpc as rpc
from watchcache.shard.convert import events_to_pb, relist_to_pb, snapshot_to_pb

log = logging.getLogger("watchcache.shard.owner")

SNAPSHOT_BATCH = 500
EVENT_BATCH = 500
# Messages are also cut at about this many object bytes (at least one object each): large objects
# would otherwise make messages of tens of MB. The follower's channel takes any size, since one
# object or one relist can be larger than any fixed limit.
MESSAGE_BYTES = 2 << 20


def event_batches(events: list[WatchEvent]) -> list[list[WatchEvent]]:
    """``events`` cut into runs of at most EVENT_BATCH events and MESSAGE_BYTES, never inside an rv group."""
    out: list[list[WatchEvent]] = []
    start = 0
    size = 0
    for i, event in enumerate(events):
        n = len(event.object.body)
        if i > start and event.rv != events[i - 1].rv and (i - start >= EVENT_BATCH or size + n > MESSAGE_BYTES):
            out.append(events[start:i])
            start, size = i, 0
        size += n
    if start < len(events):
        out.append(events[start:])
    return out


def object_batches(objects: list[CachedObject]) -> list[list[CachedObject]]:
    """``objects`` cut into runs of at most SNAPSHOT_BATCH objects and MESSAGE_BYTES (at least one object)."""
    out: list[list[CachedObject]] = [[]]
    size = 0
    for obj in objects:
        n = len(obj.body)
        if out[-1] and (len(out[-1]) >= SNAPSHOT_BATCH or size + n > MESSAGE_BYTES):
            out.append([])
            size = 0
        out[-1].append(obj)
        size += n
    return out


class ReplicaFeed:
    """Messages for one follower, queued synchronously by the Cacher, sent by the stream.

    Consecutive event batches queue as one list of events and go out as ONE message (up to
    EVENT_BATCH changes): every gRPC message costs the busy owner and follower loops a few
    passes, so a follower that is behind catches up in fewer, larger steps. The protobuf is
    built when the stream takes the messages, not in the cacher's synchronous fan-out.
    """

    def __init__(self, max_pending: int) -> None:
        self.max_pending = max_pending
        self.pending: list[pb.FollowBatch | list[WatchEvent]] = []
        self.overflowed = False
        # Object bytes in pending[-1] when it is a list of events still open to merging.
        self._tail_bytes = 0
        self._wake = asyncio.Event()

    def _push(self, msg: pb.FollowBatch | list[WatchEvent]) -> None:
        if self.overflowed:
            return
        if len(self.pending) >= self.max_pending:
            self.overflowed = True
            self.pending.clear()
        else:
            self.pending.append(msg)
        self._wake.set()

    def on_events(self, events: list[WatchEvent]) -> None:
        if not events:
            return
        size = sum(len(e.object.body) for e in events)
        last = self.pending[-1] if self.pending else None
        if (
            isinstance(last, list)
            and len(last) + len(events) <= EVENT_BATCH
            and self._tail_bytes + size <= MESSAGE_BYTES
        ):
            last.extend(events)
            self._tail_bytes += size
            return
        batches = event_batches(events)  # copies: the cacher's list is never merged into
        for batch in batches:
            self._push(batch)
        self._tail_bytes = size if len(batches) == 1 else sum(len(e.object.body) for e in batches[-1])

    def on_progress(self, rv: int) -> None:
        # Consecutive progress marks collapse into the newest.
        last = self.pending[-1] if self.pending else None
        if isinstance(last, pb.FollowBatch) and last.WhichOneof("kind") == "progress":
            self.pending[-1] = pb.FollowBatch(progress=rv)
            return
        self._push(pb.FollowBatch(progress=rv))

    def on_relist(self, events: list[WatchEvent], rv: int) -> None:
        self._push(relist_to_pb(events, rv))

    async def take(self) -> list[pb.FollowBatch]:
        while not self.pending and not self.overflowed:
            self._wake.clear()
            await self._wake.wait()
        items, self.pending = self.pending, []
        return [events_to_pb(item) if isinstance(item, list) else item for item in items]


def _history_batches(events: list[WatchEvent]) -> list[pb.FollowBatch]:
    """History as Events messages (see ``event_batches``)."""
    return [events_to_pb(batch) for batch in event_batches(events)]


class OwnerService(rpc.OwnerServicer):
    def __init__(
        self, owned: Callable[[str], Cacher | None], *, max_pending: int = 10_000, ready_wait: float = 600.0
    ) -> None:
        self._owned = owned
        self.max_pending = max_pending
        self.ready_wait = ready_wait
        self.streams = 0
        # This worker's Prometheus exposition (set by the process assembly).
        self.metrics_text: Callable[[], bytes] = lambda: b""

    async def Metrics(  # the gRPC method's name
        self, request: pb.MetricsRequest, context: grpc.aio.ServicerContext
    ) -> pb.MetricsReply:
        return pb.MetricsReply(text=self.metrics_text())

    async def Follow(  # the gRPC method's name
        self, request: pb.FollowRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.FollowBatch]:
        cacher = self._owned(request.resource)
        if cacher is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"this worker does not own {request.resource}")
            return
        if not await cacher.wait_ready(self.ready_wait):
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"{request.resource} is not synced yet")
            return
        # ---- synchronous: snapshot, history and registration in one step.
        cache = cacher.cache
        oldest = cache.oldest_rv
        objects = list(cache.snapshot(oldest).iter_range("", None))
        history = list(cache.history)
        head_rv = cache.rv
        unresumable = cache.unresumable_rv or 0
        feed = ReplicaFeed(self.max_pending)
        cacher.replicas.append(feed)
        # ---- end of the synchronous section.
        self.streams += 1
        log.info(
            "worker %d follows %s (%d objects, %d events of history)",
            request.follower,
            request.resource,
            len(objects),
            len(history),
        )
        try:
            batches = object_batches(objects)
            for i, batch in enumerate(batches):
                last = i == len(batches) - 1
                yield snapshot_to_pb(batch, oldest, last, unresumable if last else 0)
            for msg in _history_batches(history):
                yield msg
            yield pb.FollowBatch(progress=head_rv)
            while True:
                msgs = await feed.take()
                if feed.overflowed:
                    log.warning("follower %d of %s fell behind; ending its stream", request.follower, request.resource)
                    return
                for msg in msgs:
                    yield msg
        finally:
            self.streams -= 1
            cacher.replicas.remove(feed)


def resource_lookup(cachers: dict[ResourceType, Cacher], owned: set[str]) -> Callable[[str], Cacher | None]:
    def lookup(resource_id: str) -> Cacher | None:
        if resource_id not in owned:
            return None
        return next((c for t, c in cachers.items() if t.path_id() == resource_id), None)

    return lookup
