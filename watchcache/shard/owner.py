"""The owner side of the follow stream: serve a resource's cache to followers in other workers.

A follower gets the owner's state at the start of its history window (``snapshot(oldest_rv)``,
the MVCC read), then every event of the window, then a progress mark at the owner's rv when
it registered — from there on every change as it happens. So the follower ends up with the
same window as the owner, and a client can resume a watch on any worker.

A follower whose stream broke (this worker restarted, or it fell behind) keeps its state and
window and asks to *resume* from its rv: it gets the events after it (backfilled from the
upstream first if this window starts later), so its watchers go on with exactly the
upstream's events. Only when that cannot be (a relist of this cache in between) does it get a
snapshot, which it hands its watchers as a difference. A follower may also ask for the
history before its window (a client resuming there): this worker backfills from the upstream
if its own window does not reach back either (one fetch, whoever asks), then sends the span.

The replica feed is registered in the same synchronous step as the snapshot and history are
taken, so nothing falls between them (as a watch's start: invariant 2). Live changes are
written to the follower's socket by the cacher itself, in the step that applies them (see
``framing``); while the snapshot is still being sent they queue behind it. The feed is bounded:
a follower whose unsent bytes pass ``max_buffer`` has its stream cut and follows again from a
snapshot, and a feed that raises is cut alike (invariant 11): its watchers get the difference,
never a gap.

The same socket answers the other workers' requests for this worker's metrics (a scrape that
reaches any worker covers all of them): a ``WorkerRequest`` frame says which.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import cast

from watchcache.cache.events import WatchEvent
from watchcache.cache.object import CachedObject
from watchcache.cache.store import ResourceVersionTooOld
from watchcache.dispatch.backfill import BackfillFailed, reach_back
from watchcache.dispatch.cacher import Cacher
from watchcache.shard import follow_pb2 as pb
from watchcache.shard.convert import events_to_pb, relist_to_pb, snapshot_to_pb, span_to_pb
from watchcache.shard.framing import FrameDecoder, FramingError, encode_frame

log = logging.getLogger("watchcache.shard.owner")

SNAPSHOT_BATCH = 500
EVENT_BATCH = 500
# Messages are also cut at about this many object bytes (at least one object each): large objects
# would otherwise make messages of tens of MB.
MESSAGE_BYTES = 2 << 20
# Unsent bytes for one follower before its stream is cut (it then resyncs from a snapshot).
MAX_BUFFER = 64 << 20
# The kernel buffer of a follow connection (SO_SNDBUF; capped by net.core.wmem_max). What the socket
# does not take waits in the transport's buffer until this worker's loop next polls for writes, that
# is after its flush pass: on a saturated owner (1,000 watchers x 1,000 events/s, passes of 100+
# events) the default 208 KB took less than one pass's events, and the follower's watchers lagged the
# owner's by p50 1.9 s against 0.26 s while the follower sat idle 63 % of the time. 4 MB holds ~1,000
# pod events: the follower gets a pass's events in the step that applies them (docs/lab/performance-notebook.md).
FOLLOW_SNDBUF = 4 << 20


def event_batches(events: list[WatchEvent]) -> list[list[WatchEvent]]:
    """``events`` in runs of at most EVENT_BATCH events and MESSAGE_BYTES, never inside an rv group (invariant 3)."""
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
    """One follower's stream, written by the Cacher synchronously (a ``Replica``).

    Until ``go_live`` (the snapshot and history are still being sent) frames queue here;
    from then on they go straight to the transport.
    """

    def __init__(self, transport: asyncio.WriteTransport, max_buffer: int) -> None:
        self.transport = transport
        self.max_buffer = max_buffer
        self.queue: list[bytes] | None = []
        self.queued_bytes = 0
        self.overflowed = False

    def send(self, msg: pb.FollowBatch) -> None:
        """Write ``msg`` in order with the changes (queued behind the snapshot until live)."""
        self._write(msg)

    def _write(self, msg: pb.FollowBatch) -> None:
        if self.overflowed or self.transport.is_closing():
            return
        frame = encode_frame(msg)
        if self.queue is not None:
            self.queue.append(frame)
            self.queued_bytes += len(frame)
            size = self.queued_bytes + self.transport.get_write_buffer_size()
        else:
            self.transport.write(frame)
            size = self.transport.get_write_buffer_size()
        if size > self.max_buffer:
            self.cut(f"{size} bytes unsent")

    def cut(self, why: str) -> None:
        self.overflowed = True
        self.queue = None
        log.warning("ending a follower's stream (%s): it follows again from a snapshot", why)
        self.transport.abort()

    def go_live(self) -> None:
        queue, self.queue = self.queue, None
        if queue and not self.overflowed:
            self.transport.writelines(queue)

    # Replica
    def on_events(self, events: list[WatchEvent]) -> None:
        for batch in event_batches(events):
            self._write(events_to_pb(batch))

    def on_progress(self, rv: int) -> None:
        self._write(pb.FollowBatch(progress=rv))

    def on_relist(self, events: list[WatchEvent], rv: int) -> None:
        self._write(relist_to_pb(events, rv))


class _FollowConnection(asyncio.Protocol):
    """One connection from another worker: a WorkerRequest frame in; FollowBatch frames out
    for a follower, or one MetricsReply."""

    def __init__(self, server: FollowServer) -> None:
        self.server = server
        self.transport: asyncio.WriteTransport | None = None
        self.decoder = FrameDecoder()
        self.task: asyncio.Task[None] | None = None
        self.cacher: Cacher | None = None
        self.feed: ReplicaFeed | None = None
        self.requested = False
        self.follow: pb.FollowRequest | None = None
        # Backfill requests of the follower being answered.
        self.backfills: set[asyncio.Future[None]] = set()
        self.lost = False
        self.writable = asyncio.Event()
        self.writable.set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio's, so no isinstance check here.
        self.transport = cast(asyncio.WriteTransport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, FOLLOW_SNDBUF)
            except OSError as e:  # the stream still works, with the default buffer
                log.warning("follow connection: SO_SNDBUF %d refused: %s", FOLLOW_SNDBUF, e)

    def data_received(self, data: bytes) -> None:
        if self.transport is None or self.lost:
            return
        try:
            requests = [pb.WorkerRequest.FromString(frame) for frame in self.decoder.feed(data)]
        except (FramingError, ValueError) as e:
            log.warning("bad worker request: %s", e)
            self.transport.abort()
            return
        for request in requests:
            self._request(request)

    def _request(self, request: pb.WorkerRequest) -> None:
        assert self.transport is not None
        kind = request.WhichOneof("kind")
        if self.requested:
            # On a follow stream, the follower may ask for older history (one request at a time).
            if kind == "backfill" and self.follow is not None:
                self.backfills.add(asyncio.ensure_future(self._backfill(request.backfill)))
            return
        self.requested = True
        if kind == "metrics":
            self.transport.write(encode_frame(pb.MetricsReply(text=self.server.metrics_text())))
            self.transport.close()
        elif kind == "status":
            self.transport.write(encode_frame(pb.StatusReply(json=self.server.status_json())))
            self.transport.close()
        elif kind == "follow":
            self.follow = request.follow
            self.task = asyncio.ensure_future(self._serve(request.follow))
        else:
            log.warning("worker request of unknown kind %s", kind)
            self.transport.abort()

    async def _backfill(self, request: pb.BackfillRequest) -> None:
        try:
            await self.server.answer_backfill(self, request)
        except asyncio.CancelledError:
            raise
        except Exception:  # this follower's path only: cut its stream, it follows again
            log.exception("answering a backfill request of %s failed", self.follow.resource if self.follow else "?")
            if self.transport is not None:
                self.transport.abort()
        finally:
            self.backfills.discard(asyncio.current_task())

    async def _serve(self, request: pb.FollowRequest) -> None:
        try:
            await self.server.serve(self, request)
        except asyncio.CancelledError:
            raise
        except Exception:  # never leave a follower waiting on a stream nobody writes
            log.exception("follow stream of %s for worker %d failed", request.resource, request.follower)
            if self.transport is not None:
                self.transport.abort()

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.writable.set()
        if self.feed is not None and self.cacher is not None:
            # Already gone if the cacher cut it (feeding it raised).
            if self.feed in self.cacher.replicas:
                self.cacher.replicas.remove(self.feed)
            self.feed = None
        if self.task is not None and not self.task.done():
            self.task.cancel()
        for task in list(self.backfills):
            task.cancel()


class FollowServer:
    """Accepts followers on this worker's socket; ``owned`` maps a resource id to its cache."""

    def __init__(
        self,
        owned: Callable[[str], Cacher | None],
        *,
        max_buffer: int = MAX_BUFFER,
        ready_wait: float = 600.0,
        resume_wait: float = 5.0,
    ) -> None:
        self._owned = owned
        self.max_buffer = max_buffer
        self.ready_wait = ready_wait
        # How long a resuming follower ahead of this cache waits for it (it restarted: it lists anew).
        self.resume_wait = resume_wait
        # Follow streams that resumed from a follower's rv, and those that could not (a snapshot instead).
        self.resumed = 0
        self.resume_refused = 0
        # This worker's Prometheus exposition, for the other workers (set by the process assembly).
        self.metrics_text: Callable[[], bytes] = lambda: b""
        # This worker's status (JSON), for the other workers' /debug/cache and /readyz?verbose.
        self.status_json: Callable[[], bytes] = lambda: b"{}"
        # A resource id to this worker's protobuf cache of it, started if need be (None: there is
        # none, e.g. the upstream refuses protobuf): what a protobuf follower follows.
        self.owned_protobuf: Callable[[str], Cacher | None] = lambda resource: None

    def protocol(self) -> asyncio.Protocol:
        return _FollowConnection(self)

    async def serve(self, conn: _FollowConnection, request: pb.FollowRequest) -> None:
        transport = conn.transport
        assert transport is not None
        cacher = self.owned_protobuf(request.resource) if request.protobuf else self._owned(request.resource)
        if cacher is None:
            what = "a protobuf cache of " if request.protobuf else ""
            log.warning("worker %d asked for %s%s, which this worker has not", request.follower, what, request.resource)
            transport.close()
            return
        if not await cacher.wait_ready(self.ready_wait) or conn.lost:
            transport.close()
            return
        resume = request.resume_from
        if resume and not await self._can_resume(cacher, resume, request.follower):
            resume = 0
        if conn.lost:
            return
        # ---- synchronous (invariant 2): the events after the follower's rv (or a snapshot and history), registration.
        cache = cacher.cache
        if resume:
            try:
                await self._resume(conn, cacher, cache.events_since(resume), request)
                return
            except ResourceVersionTooOld as e:  # can only be an rv several events share
                log.info("worker %d cannot resume %s at %d: %s", request.follower, request.resource, resume, e)
                self.resume_refused += 1
        oldest = cache.oldest_rv
        objects = list(cache.snapshot(oldest).iter_range("", None))
        history = list(cache.history)
        head_rv = cache.rv
        # A resume the owner refuses that the follower could not tell from its copy: the rv of the
        # relist's frames, or of a group at the window's start partly evicted (ResourceCache.ambiguous).
        unresumable = cache.unresumable_rv or (oldest if cache.history.evicted_at_oldest > 1 else 0)
        feed = ReplicaFeed(transport, self.max_buffer)
        cacher.replicas.append(feed)
        conn.cacher, conn.feed = cacher, feed
        # ---- end of the synchronous section.
        log.info(
            "worker %d follows %s%s (%d objects, %d events of history)",
            request.follower,
            "the protobuf cache of " if request.protobuf else "",
            request.resource,
            len(objects),
            len(history),
        )
        batches = object_batches(objects)
        for i, batch in enumerate(batches):
            last = i == len(batches) - 1
            transport.write(encode_frame(snapshot_to_pb(batch, oldest, last, unresumable if last else 0)))
            await conn.writable.wait()  # flow control: the snapshot can be large
            if conn.lost:
                return
        for events in event_batches(history):
            transport.write(encode_frame(events_to_pb(events)))
            await conn.writable.wait()
            if conn.lost:
                return
        transport.write(encode_frame(pb.FollowBatch(progress=head_rv)))
        feed.go_live()

    async def _can_resume(self, cacher: Cacher, rv: int, follower: int) -> bool:
        """Whether this cache can hand a follower the events after ``rv``: it has reached ``rv``, and its
        window reaches back to it (after a backfill from the upstream if needed)."""
        name = cacher.resource.qualified
        if rv > cacher.rv and not await cacher.wait_for_rv(rv, self.resume_wait):
            log.info("worker %d resumes %s at %d, ahead of this cache (%d): a snapshot", follower, name, rv, cacher.rv)
            self.resume_refused += 1
            return False
        failed = await reach_back(cacher, rv)
        if failed is not None:
            log.info("worker %d cannot resume %s at %d (%s %s): a snapshot", follower, name, rv, failed.outcome, failed)
            self.resume_refused += 1
            return False
        return True

    async def _resume(
        self, conn: _FollowConnection, cacher: Cacher, events: list[WatchEvent], request: pb.FollowRequest
    ) -> None:
        """Called in the step that took ``events`` (every event after the follower's rv): register, then send."""
        transport = conn.transport
        assert transport is not None
        head_rv = cacher.rv
        feed = ReplicaFeed(transport, self.max_buffer)
        cacher.replicas.append(feed)
        conn.cacher, conn.feed = cacher, feed
        self.resumed += 1
        log.info(
            "worker %d resumes %s from rv %d (%d events to catch up)",
            request.follower,
            request.resource,
            request.resume_from,
            len(events),
        )
        transport.write(encode_frame(pb.FollowBatch(resume=pb.Resume(resource_version=request.resume_from))))
        for batch in event_batches(events):
            transport.write(encode_frame(events_to_pb(batch)))
            await conn.writable.wait()
            if conn.lost:
                return
        transport.write(encode_frame(pb.FollowBatch(progress=head_rv)))
        feed.go_live()

    async def answer_backfill(self, conn: _FollowConnection, request: pb.BackfillRequest) -> None:
        """A follower's request for the history from ``request.resource_version``: a Span, or BackfillFailed.

        This cache's window is brought back first if needed (its single flight: one upstream fetch
        for every follower and client that needs it), then the span is cut from it, in order with
        the changes on this stream; the follower checks it as any span (invariant 13).
        """
        cacher, feed = conn.cacher, conn.feed
        if cacher is None or feed is None:
            return
        rv = request.resource_version
        failed = await reach_back(cacher, rv)
        if conn.lost or feed is not conn.feed:
            return
        if failed is None:
            try:
                span = cacher.cache.span(rv, request.through)
            except ResourceVersionTooOld as e:  # the window moved on meanwhile
                failed = BackfillFailed(BackfillFailed.FAILED, str(e))
            else:
                parts = span_to_pb(span, MESSAGE_BYTES)
                size = sum(part.ByteSize() for part in parts)
                if size <= self.max_buffer // 2:
                    for part in parts:
                        feed.send(part)
                    return
                failed = BackfillFailed(
                    BackfillFailed.BOUND, f"a span of {size} bytes is too large for a follow stream"
                )
        answer = pb.BackfillFailed(resource_version=rv, outcome=failed.outcome, message=str(failed))
        feed.send(pb.FollowBatch(backfill_failed=answer))


async def _ask(socket_path: str, request: pb.WorkerRequest, timeout: float) -> bytes:
    """Send one request on another worker's socket; the one reply frame."""
    reader, writer = await asyncio.open_unix_connection(socket_path)
    try:
        writer.write(encode_frame(request))
        decoder = FrameDecoder()
        async with asyncio.timeout(timeout):
            while True:
                data = await reader.read(1 << 16)
                if not data:
                    raise ConnectionError("the worker closed the connection before its reply")
                frames = decoder.feed(data)
                if frames:
                    return bytes(frames[0])
    finally:
        writer.close()


async def fetch_metrics(socket_path: str, timeout: float = 2.0) -> bytes:
    """Another worker's own metrics, asked for on its socket."""
    frame = await _ask(socket_path, pb.WorkerRequest(metrics=pb.MetricsRequest()), timeout)
    return bytes(pb.MetricsReply.FromString(frame).text)


async def fetch_status(socket_path: str, timeout: float = 2.0) -> bytes:
    """Another worker's status (JSON), asked for on its socket."""
    frame = await _ask(socket_path, pb.WorkerRequest(status=pb.StatusRequest()), timeout)
    return bytes(pb.StatusReply.FromString(frame).json)
