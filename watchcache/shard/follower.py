"""The follower side: a local replica of a resource another worker owns.

Created on the first request for the resource (``Followers.ensure``), fed by the owner's
stream: the first time, the owner's whole window (so watches resume here exactly as on the
owner) and ready once caught up to the owner's head. After a reconnect (owner restarted,
stream ended because this follower fell behind) it keeps its state, window and watchers and
*resumes* from its rv: the owner sends the events after it (backfilling from the upstream if
its own window starts later), so local watchers get exactly the upstream's events. Only if
the owner cannot (it relisted in between) does a fresh state come, delivered to local
watchers as the difference (``Cacher.relist``), so they continue (invariants 7 and 11). A request here older than
this window asks the owner for the span before it (``Follower.fetch``, this cache's
``Backfills``). Dropped when idle.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import cast

from watchcache.backoff import Backoff
from watchcache.cache.object import CachedObject
from watchcache.cache.store import BackfillRefused, CacheConfig, ResourceCache
from watchcache.dispatch.backfill import BackfillFailed, BackfillLimits, Backfills, Fetched
from watchcache.dispatch.cacher import Cacher
from watchcache.resources import ResourceType
from watchcache.shard import follow_pb2 as pb
from watchcache.shard.convert import SpanParts, changes_from_pb, object_from_pb
from watchcache.shard.framing import FrameDecoder, encode_frame

log = logging.getLogger("watchcache.shard.follower")


class StreamEnded(ConnectionError):
    """The owner closed the follow stream before this follower had caught up."""


class _Retry(Exception):
    """A backfill request to ask again at once: this window moved past the span's end meanwhile."""


_REFUSED = {BackfillRefused.RELIST: BackfillFailed.RELIST, BackfillRefused.ROOM: BackfillFailed.BOUND}


class Follower:
    def __init__(
        self,
        resource: ResourceType,
        cacher: Cacher,
        socket_path: str,
        me: int,
        *,
        resume: bool = False,
        protobuf: bool = False,
    ) -> None:
        self.resource = resource
        # Follows the owner's protobuf cache of the resource rather than its JSON cache.
        self.protobuf = protobuf
        self.cacher = cacher
        self.socket_path = socket_path
        self.me = me
        # Resume a broken stream from this cache's rv (else: a fresh snapshot, as a new follower).
        self.resume = resume
        self.backoff = Backoff(0.05, 2.0)
        self.resyncs = 0
        self.resumes = 0
        # Set while a stream is caught up: backfill requests go on it.
        self.live = asyncio.Event()
        self._send: Callable[[bytes], None] | None = None
        # Backfill requests sent and not answered, by rv: the answer's events put in front.
        self._asked: dict[int, asyncio.Future[Fetched]] = {}
        self.fetch_timeout = 30.0

    async def run(self) -> None:
        while True:
            try:
                await self._follow_once()
                delay = 0.0
            except asyncio.CancelledError:
                raise
            except (OSError, ValueError) as e:
                delay = self.backoff.next()
                log.info("following %s: %s; again in %.2fs", self.resource.qualified, _brief(e), delay)
            await asyncio.sleep(delay)

    async def _follow_once(self) -> None:
        """One follow stream, until the owner ends it; raises if it ends before catching up."""
        session = _Session(self)
        loop = asyncio.get_running_loop()
        transport, conn = await loop.create_unix_connection(lambda: _FollowStream(session), self.socket_path)
        try:
            resume_from = self.cacher.rv if self.resume and self.cacher.ready else 0
            request = pb.FollowRequest(
                resource=self.resource.path_id(), follower=self.me, resume_from=resume_from, protobuf=self.protobuf
            )
            transport.write(encode_frame(pb.WorkerRequest(follow=request)))
            self._send = transport.write
            await conn.done
        finally:
            self.live.clear()
            self._send = None
            # Asked on this stream and not answered: that fetch failed. Not asked again at once on
            # the next stream: if answering it is what cut the stream (the owner's answer raised), an
            # immediate re-ask cuts the next one too, in a loop (970 streams in 5 s, seen in a test).
            # ``Backfills`` retries a failed fetch after its backoff, a bounded number of times.
            ended = BackfillFailed(BackfillFailed.UNREACHABLE, "the follow stream ended before the owner answered")
            for fut in self._asked.values():
                if not fut.done():
                    fut.set_exception(ended)
                    fut.exception()
            transport.abort()
        if not session.caught_up:
            raise StreamEnded("the owner ended the stream before it caught up")

    async def fetch(self, cacher: Cacher, rv: int) -> Fetched:
        """This cache's ``Backfills`` fetch: the span before the window, from the owner (see the module doc)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.fetch_timeout
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    await self.live.wait()
                    send = self._send
                    if send is None:  # not yet: the stream that set ``live`` is being set up
                        await asyncio.sleep(0.01)
                        continue
                    fut: asyncio.Future[Fetched] = loop.create_future()
                    self._asked[rv] = fut
                    request = pb.BackfillRequest(resource_version=rv, through=cacher.cache.oldest_rv)
                    send(encode_frame(pb.WorkerRequest(backfill=request)))
                    try:
                        return await fut
                    finally:
                        if self._asked.get(rv) is fut:
                            del self._asked[rv]
            except _Retry:
                continue
            except TimeoutError:
                raise BackfillFailed(
                    BackfillFailed.FAILED, f"no answer from the owner within {self.fetch_timeout:g}s"
                ) from None

    def answered(self, rv: int, fetched: Fetched | None, error: BackfillFailed | _Retry | None = None) -> None:
        fut = self._asked.get(rv)
        if fut is None or fut.done():
            return
        if error is not None:
            fut.set_exception(error)
            fut.exception()
        else:
            fut.set_result(fetched or Fetched(0, 0))


class _FollowStream(asyncio.Protocol):
    """Applies each frame in the callback its bytes arrive in: no loop pass between owner and watchers."""

    def __init__(self, session: _Session) -> None:
        self.session = session
        self.decoder = FrameDecoder()
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio's, so no isinstance check here.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.done.done():
            return
        try:
            self.session.handle([pb.FollowBatch.FromString(payload) for payload in self.decoder.feed(data)])
        except Exception as e:  # a broken stream or a change the cache refuses: follow again
            self.done.set_exception(e if isinstance(e, (OSError, ValueError)) else ValueError(repr(e)))
            if self.transport is not None:
                self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            if exc is not None:
                self.done.set_exception(exc)
            else:
                self.done.set_result(None)


class _Session:
    """The state of one follow stream on the follower: snapshot parts, staging cache, caught up yet."""

    def __init__(self, follower: Follower) -> None:
        self.follower = follower
        cacher = follower.cacher
        # A resync builds the owner's state aside and hands it over as a relist (a diff for watchers).
        self.staging = ResourceCache(follower.resource, CacheConfig(), cacher.clock) if cacher.ready else None
        self.objects: list[CachedObject] = []
        self.caught_up = False
        self.span: SpanParts | None = None

    def handle(self, batches: list[pb.FollowBatch]) -> None:
        """The messages of one read, in order; consecutive event messages are applied as ONE batch.

        A busy owner's changes arrive several to a read; one apply is one dispatch, so each
        local watcher gets one append (and one write) for all of them, as on the owner.
        """
        changes: list[tuple[str, CachedObject]] = []
        for batch in batches:
            if batch.WhichOneof("kind") == "events":
                changes += changes_from_pb(batch.events.changes)
                continue
            if changes:
                self._apply(changes)
                changes = []
            self._handle(batch)
        if changes:
            self._apply(changes)

    def _apply(self, changes: list[tuple[str, CachedObject]]) -> None:
        if self.staging is not None:
            self.staging.apply(changes)
        else:
            self.follower.cacher.apply(changes)

    def _handle(self, batch: pb.FollowBatch) -> None:
        follower = self.follower
        cacher = follower.cacher
        staging = self.staging
        kind = batch.WhichOneof("kind")
        if kind == "progress":
            if self.caught_up:
                cacher.progress(batch.progress)
                return
            self.caught_up = True
            follower.backoff.reset()
            if staging is not None:
                staging.progress(batch.progress)
                cacher.relist(list(staging.snapshot().iter_range("", None)), staging.rv)
                follower.resyncs += 1
                self.staging = None
            else:
                cacher.progress(batch.progress)
                cacher.mark_ready()
            follower.live.set()
            log.info("following %s: caught up at rv %d", follower.resource.qualified, cacher.rv)
        elif kind == "resume":
            # The owner goes on from this cache's rv: its events apply here directly, watchers go on.
            self.staging = None
            follower.resumes += 1
            log.info("following %s: resuming from rv %d", follower.resource.qualified, batch.resume.resource_version)
        elif kind == "span":
            part = batch.span
            if self.span is None or self.span.rv != part.resource_version:
                self.span = SpanParts(part.resource_version, part.through)
            self.span.add(part)
            if part.last:
                parts, self.span = self.span, None
                self._backfill(parts)
        elif kind == "backfill_failed":
            answer = batch.backfill_failed
            # The owner's answer comes after its own attempts (and its own wait): final for this fetch.
            failed = BackfillFailed(answer.outcome, answer.message, retried=True)
            follower.answered(answer.resource_version, None, failed)
        elif kind == "snapshot":
            self.objects.extend(object_from_pb(o) for o in batch.snapshot.objects)
            if batch.snapshot.last:
                if staging is not None:
                    staging.replace(self.objects, batch.snapshot.resource_version)
                else:
                    cacher.replace(self.objects, batch.snapshot.resource_version, ready=False)
                    # The owner's resume barrier (a relist group's rv) holds here too.
                    cacher.cache.set_unresumable(batch.snapshot.unresumable_resource_version or None)
                self.objects = []
        elif kind == "relist":
            changes = changes_from_pb(batch.relist.changes)
            cacher.relist(_after(cacher.cache, changes), batch.relist.resource_version)

    def _backfill(self, parts: SpanParts) -> None:
        """The owner's span: checked against this cache's own state and put in front of its window."""
        follower = self.follower
        try:
            events = follower.cacher.backfill(parts.span())
        except BackfillRefused as e:
            if e.reason == BackfillRefused.SHORT:  # this window moved on since the request: ask again
                follower.answered(parts.rv, None, _Retry())
                return
            log.warning("following %s: the owner's span from %d refused: %s", follower.resource.qualified, parts.rv, e)
            follower.answered(parts.rv, None, BackfillFailed(_REFUSED.get(e.reason, BackfillFailed.MISMATCH), str(e)))
            return
        follower.answered(parts.rv, Fetched(len(events), parts.bytes))


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
        backfill: BackfillLimits | None = None,
        protobuf: bool = False,
    ) -> None:
        self.cachers = cachers
        # Followers of the owners' protobuf caches (their own ``cachers``, not the JSON ones).
        self.protobuf = protobuf
        self.socket_of = socket_of
        self.me = me
        self.config = config
        # Resume broken streams and backfill from the owner (None: --no-backfill, snapshots as before).
        self.backfill = backfill if backfill is not None and backfill.enabled else None
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
        limits = self.backfill
        follower = Follower(
            resource, cacher, self.socket_of(resource), self.me, resume=limits is not None, protobuf=self.protobuf
        )
        if limits is not None:
            follower.fetch_timeout = limits.fetch_timeout
            owner = f"the owner ({os.path.basename(follower.socket_path)})"
            cacher.backfills = Backfills(
                cacher,
                follower.fetch,
                wait=limits.wait,
                coalesce=limits.coalesce,
                source=owner,
                unreachable_for=limits.unreachable_for,
            )
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

    def drop(self, resource: ResourceType) -> None:
        """Stop following ``resource`` now (its cache stopped: ``service/ondemand.py``)."""
        entry = self.followers.pop(resource, None)
        if entry is not None:
            entry[1].cancel()
            entry[0].cacher.stop()
            if self.cachers.get(resource) is entry[0].cacher:
                del self.cachers[resource]

    def stop(self) -> None:
        for _, task in self.followers.values():
            task.cancel()
