"""Cacher: one resource's cache, its watches, and the waits of requests for freshness.

This is where the I/O-free core meets the event loop. The feed (reflector, simulated
cluster, follower stream) calls ``replace``/``apply``/``progress``; each call updates
the ``ResourceCache``, fans the new events out through the ``Dispatcher`` *in the same
synchronous step* (so a watcher registered between two calls can neither miss nor
repeat an event: invariant 2), and wakes requests waiting for an rv.

Ownership: everything here runs on the event loop thread; no locks.

Readiness (kube's ``ready.go``)::

    PENDING --replace()--> READY --stop()--> STOPPED

A watch's life, in one place (kube's ``Cacher.Watch`` and ``cacheWatcher``, etcd's ``demux``
with its active/lagging split). The HTTP handler (``server/watch.py``) builds a
``WatchRequest``, has the read's owner start it (``dispatch/reads.py``), and then only writes
what the watcher has pending and tells ``catch_up`` when its client has drained::

    reads.start_watch(ctx, cacher, request, sink)
      | async step: a start rv before the window waits for a backfill of the older history
      | (dispatch/backfill.py; bounded by --backfill-wait)
      v
    start_watch(request, sink)  synchronous, no await (invariant 2)
      |  plan: initial events from a snapshot | backlog from history | start at the head
      |  queue them, then dispatcher.add
      +--start rv before the window--> ResourceVersionTooOld, no watcher: 410 Expired (invariant 3)
      v
    ACTIVE --pending over its cap, or picked by the WatchBudget--> LAGGING       (invariant 6)
                                                                    | buffer dropped, resume_rv kept
    LAGGING --client drained: catch_up() replays a bounded step--> LAGGING
    LAGGING --catch_up() replays up to the newest event----------> ACTIVE       (same step: no gap)
    LAGGING --history moved past resume_rv: history_gone()-------> LAGGING, backfilling: catch_up()
                                                                    again once it is there, else
                                                                    CLOSED (410 Expired; 429 while
                                                                    the upstream cannot be asked)
    any ------close(reason): timeout, client gone, shutdown, error-> CLOSED --ended()--> unregistered
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from sortedcontainers import SortedList

from watchcache import apierrors
from watchcache.cache.encoding import FULL_JSON, Encoding
from watchcache.cache.events import WatchEvent
from watchcache.cache.listing import candidates
from watchcache.cache.object import CachedObject
from watchcache.cache.predicate import SelectionPredicate
from watchcache.cache.semantics import Mode, WatchPlan
from watchcache.cache.store import CacheConfig, ResourceCache, ResourceVersionTooOld, Span
from watchcache.dispatch.bodies import ListBodies
from watchcache.dispatch.dispatcher import Dispatcher
from watchcache.dispatch.outcomes import BackfillFailed, RetryLater, before_window, watch_too_old
from watchcache.resources import ResourceType
from watchcache.watchers.budget import WatchBudget
from watchcache.watchers.watcher import CloseReason, Watcher, WatchSink

log = logging.getLogger("watchcache.dispatch.cacher")

# A lagging watcher whose history went is backfilled at most this many times (then 410).
BACKFILLS_PER_WATCHER = 2


class CacherState(enum.Enum):
    """PENDING --replace--> READY --stop--> STOPPED; READY --suspend--> SUSPENDED --replace--> READY.

    SUSPENDED: its feed stopped while another encoding's cache serves the resource's clients
    (``upstream/encodings.py``); it holds nothing, and a read calls ``resume`` and waits for the
    resync. Not a readiness failure: the resource is served.
    """

    PENDING = "pending"
    READY = "ready"
    SUSPENDED = "suspended"
    STOPPED = "stopped"


class OlderHistory(Protocol):
    """Where a cache's history older than its window comes from (``dispatch.backfill.Backfills``).

    A seam, so that the cacher does not import its backfill (which sits above it)."""

    async def reach_back(self, rv: int, timeout: float | None = None) -> BackfillFailed | None:
        """None once the window reaches back to ``rv``; else why it could not (bounded by ``timeout``)."""

    def stop(self) -> None:
        """No more fetches: every request waiting for one fails now."""


class Replica(Protocol):
    """A follower's feed on the owner: told every change, in order, synchronously."""

    def on_events(self, events: list[WatchEvent]) -> None: ...

    def on_progress(self, rv: int) -> None: ...

    def on_relist(self, events: list[WatchEvent], rv: int) -> None: ...

    def cut(self, why: str) -> None:
        """End the follower's stream: it missed a change, so it must resync from a snapshot."""


@dataclass(frozen=True, slots=True)
class WatchRequest:
    """A watch in the cacher's terms: what it selects, where it starts, how it is written and bounded.

    The HTTP handler builds it from the query, so the start is tested without sockets.
    """

    predicate: SelectionPredicate
    # Where it starts (Most Recent, Any, NotOlderThan, Exact), and whether initial events come first.
    plan: WatchPlan
    # Seconds until the server ends it (None: never): a bookmark falls due 2 s before (kube's nextBookmarkTime).
    timeout: float | None = None
    encoding: Encoding = FULL_JSON
    allow_bookmarks: bool = False
    bookmark_interval: float = 10.0
    # Unsent bytes this watcher may hold before it lags (invariant 6), and the process-wide budget.
    max_pending_bytes: int = 16 << 20
    budget: WatchBudget | None = None


class Cacher:
    # Slots: its attributes are read on every event, and CPython 3.11 keeps instance attributes
    # inline only while a class's shared keys stay under a cap of about 30: adding the 30th
    # (``list_bodies``) cost ~750 instructions per event applied and flushed (loadtest/bench/reads.py
    # watch-event). Slots have no such cliff. A new attribute goes here.
    __slots__ = (
        "_backfilled",
        "_backfilling",
        "_ready",
        "_seq",
        "_waiters",
        "backfilled_events",
        "backfills",
        "cache",
        "clock",
        "created",
        "dispatcher",
        "events_received",
        "failures",
        "initializations",
        "last_used",
        "list_bodies",
        "list_fetched",
        "list_returned",
        "lists",
        "ready_wait",
        "replicas",
        "resource",
        "resume",
        "split_groups",
        "state",
        "watch_bytes_sent",
        "watch_frames_sent",
        "watch_requests",
        "watchers_caught_up",
        "watchers_expired",
        "watchers_lagged",
        "watchers_retry_later",
        "watchers_terminated",
    )

    def __init__(
        self,
        resource: ResourceType,
        config: CacheConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.resource = resource
        self.clock = clock
        self.cache = ResourceCache(resource, config or CacheConfig(), clock)
        self.dispatcher = Dispatcher(resource, self.count_failure, epoch=clock())
        self.state = CacherState.PENDING
        self._ready = asyncio.Event()
        # (rv, seq, future): requests waiting until the cache reaches rv. Sorted, so that waking
        # takes the front and a wait that ends any other way removes its own entry (O(log n)).
        self._waiters: SortedList[tuple[int, int, asyncio.Future[None]]] = SortedList()
        self._seq = itertools.count()
        self.events_received = 0
        # Followers in other workers fed from this cache (owner side of the shard stream).
        self.replicas: list[Replica] = []
        # How long a request waits for this cache to sync before 429 (None: the server's default).
        self.ready_wait: float | None = None
        # When a request last read this cache (idle followers are dropped), and when it was made.
        self.last_used = self.created = clock()
        # Counted here (the handlers count through the ``count_*`` methods), exported at scrape time
        # (watchcache.metrics).
        self.watch_requests = 0
        self.initializations = 0
        self.watchers_terminated = 0
        self.lists = 0
        self.list_fetched = 0
        self.list_returned = 0
        self.watch_frames_sent = 0
        self.watch_bytes_sent = 0
        # Slow-watcher outcomes: fell behind, caught up from history, ended with 410, or with 429
        # (the history it fell into could not be fetched now: the client watches again from its rv).
        self.watchers_lagged = 0
        self.watchers_caught_up = 0
        self.watchers_expired = 0
        self.watchers_retry_later = 0
        # Groups of events sharing an rv that arrived in more than one batch (see _group_continued).
        self.split_groups = 0
        # Deliveries that raised, by path ("flush", "dispatch", "replica"): each ended only the
        # watcher or follower stream concerned.
        self.failures: dict[str, int] = {}
        # Where older history comes from when a request needs it (None: nowhere, 410 as before).
        self.backfills: OlderHistory | None = None
        self.backfilled_events = 0
        # While SUSPENDED: starts its feed again; called by the first read (set by ``upstream/encodings.py``).
        self.resume: Callable[[], object] | None = None
        # Lagging watchers whose history is being backfilled, and how many times each was.
        self._backfilling: set[Watcher] = set()
        self._backfilled: dict[Watcher, int] = {}
        # LIST answers shared by identical LISTs at this cache's newest snapshot (a relist storm).
        self.list_bodies = ListBodies()

    @property
    def ready(self) -> bool:
        return self.state is CacherState.READY

    @property
    def rv(self) -> int:
        return self.cache.rv

    # ------------------------------------------------------------------ feed

    def replace(self, objects: Iterable[CachedObject], rv: int, *, ready: bool = True) -> None:
        """The initial state; ``ready=False`` when more of the initial stream is still to come."""
        self.cache.replace(objects, rv)
        self.initializations += 1
        if ready:
            self.mark_ready()
        self._wake_waiters()

    def mark_ready(self) -> None:
        if self.state in (CacherState.PENDING, CacherState.SUSPENDED):
            self.state = CacherState.READY
            self.resume = None
            self._ready.set()

    def suspend(self, resume: Callable[[], object]) -> None:
        """Its feed has stopped: unsynced, its objects and history freed, until the next ``replace``.

        Only a cache nobody reads is suspended (no watcher, no follower), so this ends no stream;
        a read waiting for an rv wakes now, unsatisfied. The next read calls ``resume``.
        """
        self.state = CacherState.SUSPENDED
        self._ready.clear()
        self.resume = resume
        self.cache.replace((), self.cache.rv)
        for _, _, fut in self._waiters:
            if not fut.done():
                fut.set_result(None)
        self._waiters.clear()

    @property
    def serving(self) -> bool:
        """Synced, or suspended while another encoding serves (what readiness asks)."""
        return self.state in (CacherState.READY, CacherState.SUSPENDED)

    def apply(self, changes: Sequence[tuple[str, CachedObject]]) -> list[WatchEvent]:
        """Apply a batch, then hand its events to every path: replicas, watchers, waiters.

        The paths are independent: each is fed whatever another did (see ``_feed`` and
        ``Dispatcher.dispatch``), so a failure on one costs no other an event (invariant 11).
        Only the cache itself may refuse the batch (``ResourceVersionOrderError``), before
        anything changed (invariant 1). Fanned out in this same step, so a watch started
        between two calls sees each event once (invariant 2).
        """
        head = self.cache.rv
        events = self.cache.apply(changes)
        self.events_received += len(events)
        if events and events[0].rv == head:
            self._group_continued(events)
        # Followers first: their stream is woken before this worker's own fan-out runs, so a
        # busy owner does not hold every other worker's watchers back by a loop pass.
        failed: list[tuple[Replica, Exception]] | None = None
        # _feed's loop, inlined on this hot path (a call per replica would cost ~90 ns more).
        for replica in self.replicas:
            try:
                replica.on_events(events)
            except Exception as e:
                failed = [*(failed or ()), (replica, e)]
        if failed:
            self._cut(failed)
        self.dispatcher.dispatch(events)
        self._wake_waiters()
        return events

    def _group_continued(self, events: list[WatchEvent]) -> None:
        """The rest of a group arrived in a later batch (an upstream watch cache's group, split by a read): invariant 3.

        A watcher that started at the group's rv (its client listed or resumed there) or got a
        bookmark at it holds the group's first part as if it were all of it: the rest would go
        missing (its start rv filters it out) or arrive after the bookmark's promise. Those the
        rest concerns are ended with 410, so their clients relist; others go on. Watchers that
        started before the group get the rest live, as usual.
        """
        rv = events[0].rv
        self.split_groups += 1
        rest = [e for e in events if e.rv == rv]
        # One ERROR frame per encoding, shared by the watchers of that encoding.
        frames: dict[Encoding, bytes] = {}
        for watcher in list(self.dispatcher.watchers()):
            if watcher.closed or (watcher.start_rv != rv and watcher.bookmark_rv != rv):
                continue
            try:
                if any(watcher.predicate.concerns(e) for e in rest):
                    frame = frames.get(watcher.encoding)
                    if frame is None:
                        message = f"too old resource version: {rv} ({self.cache.oldest_rv}): more events at {rv} came"
                        error = apierrors.resource_expired(message)
                        frame = frames[watcher.encoding] = watcher.encoding.error_frame(error)
                    watcher.expire(frame)
            except Exception:
                log.exception("ending %r, which saw part of the group at %d, failed", watcher, rv)
                self.dispatcher.fail(watcher)

    def relist(self, objects: Iterable[CachedObject], rv: int) -> list[WatchEvent]:
        """A fresh list after the upstream's 410: watchers get the difference, not a 410 of their own (invariant 7).

        Watchers that allow bookmarks then get a BOOKMARK at ``rv`` at once, so a client
        that reconnects resumes from ``rv`` (inside the new window) rather than from an
        object's older resourceVersion.

        Before the diff, those watchers get a BOOKMARK at the old rv annotated with ``rv``
        (``RELIST_DIFF_ANNOTATION``; clients ignore annotations they do not know). The
        diff's intermediate states are no state of the upstream (its deletions' rvs are
        unknown): a watchcache tier in front, told so, buffers the diff and applies it as
        one relist at ``rv`` of its own instead of serving those states as real ones.
        """
        before = self.cache.rv
        events = self.cache.relist(objects, rv)
        self.initializations += 1
        self.events_received += len(events)
        if events:
            self._announce_relist(before, rv)
        self.dispatcher.dispatch(events)
        frames: dict[Encoding, bytes] = {}
        for watcher in list(self.dispatcher.watchers()):
            try:
                frame = frames.get(watcher.encoding)
                if frame is None:
                    frame = frames[watcher.encoding] = watcher.encoding.bookmark_frame(self.resource, rv)
                watcher.bookmark(rv, frame)
            except Exception:
                log.exception("the relist bookmark for %r failed; ending it", watcher)
                self.dispatcher.fail(watcher)
        if self.replicas:
            self._feed(_on_relist, events, rv)
        self._wake_waiters()
        return events

    def backfill(self, span: Span) -> list[WatchEvent]:
        """Put a span of older history in front of the window (``ResourceCache.backfill``: checked, or refused).

        Nothing is delivered: the span is history every watcher here is past. Followers do not
        get it unasked; one that needs it asks (``shard``), with its own window's start.
        """
        events = self.cache.backfill(span)
        self.backfilled_events += len(events)
        return events

    def _announce_relist(self, before: int, rv: int) -> None:
        frames: dict[Encoding, bytes] = {}
        for watcher in list(self.dispatcher.watchers()):
            try:
                frame = frames.get(watcher.encoding)
                if frame is None:
                    frame = frames[watcher.encoding] = watcher.encoding.bookmark_frame(
                        self.resource, before, relist_diff_end=rv
                    )
                watcher.announce(before, frame)
            except Exception:
                log.exception("the relist announcement for %r failed; ending it", watcher)
                self.dispatcher.fail(watcher)

    def progress(self, rv: int) -> None:
        if self.cache.progress(rv):
            if self.replicas:
                self._feed(_on_progress, rv)
            self._wake_waiters()

    def _feed(self, call: Callable[..., None], *args: object) -> None:
        """``call(replica, *args)`` for every replica; one that raises is cut, the others are fed (invariant 11).

        A cut follower resyncs from a snapshot and hands its watchers the difference (as one
        that fell too far behind does), so it loses nothing either.
        """
        failed: list[tuple[Replica, Exception]] = []
        # A try costs nothing until it catches (CPython 3.11): see loadtest/bench_isolation.py.
        for replica in self.replicas:
            try:
                call(replica, *args)
            except Exception as e:
                failed.append((replica, e))
        if failed:
            self._cut(failed)

    def _cut(self, failed: list[tuple[Replica, Exception]]) -> None:
        for replica, error in failed:
            log.error("feeding a follower of %s failed; cutting its stream", self.resource.qualified, exc_info=error)
            self.count_failure("replica")
            if replica in self.replicas:
                self.replicas.remove(replica)
            try:
                replica.cut(f"feeding it raised {type(error).__name__}: {error}")
            except Exception:
                log.exception("cutting a follower's stream failed")

    def stop(self) -> None:
        """No more feed: every wait ends now (with False unless its rv was reached, or it was synced)."""
        self.state = CacherState.STOPPED
        self._ready.set()  # wait_ready returns ``ready``: False
        for _, _, fut in self._waiters:
            if not fut.done():
                fut.set_result(None)
        self._waiters.clear()
        if self.backfills is not None:
            self.backfills.stop()

    # ------------------------------------------------------------------ waiting

    async def wait_ready(self, timeout: float) -> bool:
        if self.ready:
            return True
        try:
            await asyncio.wait_for(self._ready.wait(), timeout)
        except TimeoutError:
            return False
        return self.ready

    async def wait_for_rv(self, rv: int, timeout: float) -> bool:
        """True once the cache has reached ``rv`` (by events or progress); False after ``timeout`` seconds.

        However the wait ends (reached, timed out, cancelled, cacher stopped), its entry is gone
        when this returns: a client asking for far-future rvs leaves nothing behind (invariant 8).
        """
        if self.cache.rv >= rv:
            return True
        if timeout <= 0 or self.state is CacherState.STOPPED:
            return False
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (rv, next(self._seq), fut)
        self._waiters.add(entry)
        try:
            async with asyncio.timeout(timeout):
                await fut
        except TimeoutError:
            pass
        finally:
            # Timed out or cancelled (the timeout cancels ``fut`` too): take the entry off. A woken
            # entry was taken off by ``_wake_waiters`` already; discarding it again is a no-op.
            if not fut.done() or fut.cancelled():
                fut.cancel()
                self._waiters.discard(entry)
        return self.cache.rv >= rv

    @property
    def waiting(self) -> int:
        """Requests waiting for this cache to reach an rv."""
        return len(self._waiters)

    def _wake_waiters(self) -> None:
        waiters = self._waiters
        rv = self.cache.rv
        while waiters and waiters[0][0] <= rv:
            _, _, fut = waiters.pop(0)
            if not fut.done():
                fut.set_result(None)

    def count_failure(self, path: str) -> None:
        self.failures[path] = self.failures.get(path, 0) + 1

    # ------------------------------------------------------------------ what the handlers count

    def touch(self) -> None:
        """A request reads this cache now (an idle follower is dropped)."""
        self.last_used = self.clock()

    def count_list(self, returned: int, scanned: int) -> None:
        """A LIST was answered: ``returned`` items, ``scanned`` objects examined to find them."""
        self.lists += 1
        self.list_fetched += scanned
        self.list_returned += returned

    def count_watch_request(self) -> None:
        self.watch_requests += 1

    def count_sent(self, frames: int, nbytes: int) -> None:
        """A watcher's frames were written to its client."""
        self.watch_frames_sent += frames
        self.watch_bytes_sent += nbytes

    # ------------------------------------------------------------------ watches

    def start_watch(self, request: WatchRequest, sink: WatchSink) -> Watcher:
        """The synchronous section of a watch's start: read the state, queue it, register.

        No ``await`` from the state read to ``dispatcher.add``: an event applied before it is in
        the state or the backlog, one applied after reaches the watcher through the dispatcher,
        never both, never neither (invariant 2). A client's watch comes through ``reads.start_watch``,
        which first waits for the history before the window if the start needs it. Raises
        ``ResourceVersionTooOld`` when the start rv is before the window (nothing registered).
        """
        plan = request.plan
        predicate = request.predicate
        cache = self.cache
        snapshot = None
        backlog: list[WatchEvent] = []
        if plan.initial_events:
            snapshot = cache.snapshot()
            start_rv = snapshot.rv
        elif plan.mode is Mode.EXACT:
            start_rv = plan.rv
            # Outside the window (and its backfill failed), or ambiguous for this watch
            # (invariant 3): ResourceVersionTooOld, the client relists.
            backlog = cache.events_since(plan.rv, predicate)
        else:
            start_rv = cache.rv
        watcher = Watcher(
            self.resource,
            predicate,
            start_rv,
            sink,
            allow_bookmarks=request.allow_bookmarks,
            deadline=None if request.timeout is None else self.clock() + request.timeout,
            bookmark_interval=request.bookmark_interval,
            max_pending_bytes=request.max_pending_bytes,
            encoding=request.encoding,
            budget=request.budget,
            owner=self,
        )
        try:
            if snapshot is not None:
                # A kubelet's watch list reads its node's pods (the index) or one key, not every object.
                objects = candidates(snapshot, predicate, namespaced=self.resource.namespaced)
                parts, count = request.encoding.initial_events(self.resource, objects, predicate.matches)
                watcher.deliver_initial(parts, start_rv, count)
                if plan.initial_events_end_bookmark:
                    watcher.bookmark(start_rv, initial_events_end=True)
            for event in backlog:
                watcher.deliver(event)
            self.dispatcher.add(watcher, self.clock())
        except BaseException:
            # Never registered, or half: it leaves the budget and the dispatcher.
            watcher.close(CloseReason.INTERNAL_ERROR)
            raise
        return watcher

    def catch_up(self, watcher: Watcher) -> bool:
        """One step of a LAGGING watcher's catch-up, run once its client has drained (the sink says when).

        Replays the history after ``resume_rv`` until about half the watcher's cap is queued
        (whole rv groups); when that reaches the newest event the watcher is live again, in
        this same step (invariant 6). Returns True while more is to be replayed: call again
        once the client has read what was queued.
        """
        if watcher.closed or not watcher.lagging:
            return False
        try:
            events = self.cache.events_since(watcher.resume_rv, watcher.predicate)
        except ResourceVersionTooOld as e:
            return self.history_gone(watcher, e)
        if watcher.replay(events):
            self.watchers_caught_up += 1
            return False
        return True

    def history_gone(self, watcher: Watcher, error: ResourceVersionTooOld) -> bool:
        """The history moved past a lagging watcher's ``resume_rv``: the one place that decides what then.

        With a source of older history (``backfills``) and a ``resume_rv`` before the window, the
        watcher stays LAGGING while the history before the window is fetched, and its sink is told
        (``lagging``) once it is there, so that it runs ``catch_up`` again; at most
        ``BACKFILLS_PER_WATCHER`` times. Otherwise, or if the backfill fails, the watch ends with
        410 Expired and its client relists (invariant 6). Returns whether ``catch_up`` may be
        called again at once.
        """
        backfills = self.backfills
        if watcher in self._backfilling:
            return False  # under way: the sink is told when it ends
        tries = self._backfilled.get(watcher, 0)
        if backfills is not None and watcher.resume_rv < self.cache.oldest_rv and tries < BACKFILLS_PER_WATCHER:
            self._backfilled[watcher] = tries + 1
            self._backfilling.add(watcher)
            task = asyncio.ensure_future(self._backfill_lagging(watcher, error))
            task.add_done_callback(_retrieve)
            return False
        self._expire(watcher, error, None)
        return False

    async def _backfill_lagging(self, watcher: Watcher, error: ResourceVersionTooOld) -> None:
        assert self.backfills is not None
        try:
            failed = await self.backfills.reach_back(watcher.resume_rv)
        finally:
            self._backfilling.discard(watcher)
        if watcher.closed or not watcher.lagging:
            return
        if failed is not None:
            self._expire(watcher, error, failed)
            return
        try:
            watcher.sink.lagging(watcher)  # catch up from the history now in front of the window
        except Exception:
            log.exception("resuming %r after its backfill failed; ending it", watcher)
            watcher.close(CloseReason.INTERNAL_ERROR)

    def _expire(self, watcher: Watcher, error: ResourceVersionTooOld, backfill: BackfillFailed | None) -> None:
        refusal = before_window(watch_too_old(self.resource, error), backfill)
        if isinstance(refusal, RetryLater):  # the client watches again from its rv, later
            self.watchers_retry_later += 1
            watcher.expire(watcher.encoding.error_frame(refusal.status()), CloseReason.RETRY_LATER)
            return
        self.watchers_expired += 1
        watcher.expire(watcher.encoding.error_frame(refusal.status()))

    # WatchOwner: told by the watchers ``start_watch`` registered.
    def lagged(self, watcher: Watcher) -> None:
        self.watchers_lagged += 1

    def ended(self, watcher: Watcher, reason: str) -> None:
        if reason in (CloseReason.BUFFER_OVERFLOW, CloseReason.EXPIRED, CloseReason.RETRY_LATER):
            self.watchers_terminated += 1
        self._backfilled.pop(watcher, None)
        self.dispatcher.remove(watcher)

    def add_watcher(self, watcher: Watcher) -> None:
        """Register a watcher built elsewhere (tests, benchmarks); a client's watch goes through ``start_watch``."""
        self.dispatcher.add(watcher, self.clock())

    def remove_watcher(self, watcher: Watcher) -> None:
        self.dispatcher.remove(watcher)

    def tick(self) -> None:
        """Periodic housekeeping (about once a second): expire history, send due bookmarks."""
        self.cache.expire()
        if self.ready:
            self.dispatcher.send_due_bookmarks(self.clock(), self.cache.rv)


def _retrieve(task: asyncio.Future[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("a lagging watcher's backfill raised", exc_info=task.exception())


def _on_relist(replica: Replica, events: list[WatchEvent], rv: int) -> None:
    replica.on_relist(events, rv)


def _on_progress(replica: Replica, rv: int) -> None:
    replica.on_progress(rv)
