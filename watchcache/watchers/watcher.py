"""One client watch: what it selects, where it starts, and the frames waiting for it.

A ``Watcher`` never writes by itself. ``select_frame`` turns an event into the frame a
predicate must see (ADDED/MODIFIED/DELETED, with kube's selector-transition rules); the
dispatcher evaluates it once per *group* of watchers with an equal predicate and hands
each watcher the group's frames of a batch as one shared bytes object
(``deliver_batch``), so live fan-out costs one append per watcher per batch, not one
per event. The ``WatchSink`` (the HTTP stream) is told once that there is something to
flush, and flushes what is pending in one write. The watcher is testable without sockets.

Slow consumers: the watcher's half of the lag cycle, whose whole (start, lag, catch-up,
live or 410) is drawn and driven in :mod:`watchcache.dispatch.cacher` (``Cacher.catch_up``).
A lagging watcher (``lag``) drops its unsent live frames (memory stays bounded), ignores new
events, and remembers ``resume_rv``: the rv of the last live frame it handed to the writer.
``replay`` queues the history after ``resume_rv`` that the cacher hands it, in bounded steps;
once it has replayed up to the newest event it is live again, in the same synchronous step,
so nothing falls between replay and live dispatch (invariant 6).

Initial events (the state sent at the start of a watch, and the initial-events-end
bookmark) are never dropped: they are shared object bytes held by the cache anyway,
and they cannot be replayed from history.

A watcher also goes LAGGING when the process-wide ``WatchBudget`` of unsent bytes is
exceeded and it is among those furthest behind (:mod:`watchcache.watchers.budget`). It
reports its unsent bytes to the budget in steps, from the comparison ``_enqueue`` already
makes against its own cap, so the fan-out costs the same with a budget as without.

The watcher tells its ``WatchSink`` (the HTTP stream: flushing, flow control) that it has
frames, lagged or ended, and its ``WatchOwner`` (the cacher that registered it) that it
lagged or ended: counts, and leaving the dispatcher.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Protocol

from watchcache.cache.encoding import FULL_JSON, Encoding
from watchcache.cache.events import ADDED, DELETED, MODIFIED, WatchEvent
from watchcache.cache.predicate import SelectionPredicate
from watchcache.resources import ResourceType
from watchcache.watchers.budget import WatchBudget


class WatchSink(Protocol):
    def wake(self, watcher: Watcher) -> None:
        """There are frames pending (called once per empty → non-empty transition)."""

    def closed(self, watcher: Watcher, reason: str) -> None:
        """The watcher ended (timeout, overflow, shutdown, client gone)."""

    def lagging(self, watcher: Watcher) -> None:
        """The watcher dropped its buffer; catch it up from history once its client drains."""


class WatchOwner(Protocol):
    """The cacher that registered the watcher (``dispatch.cacher.Cacher``), as kube's ``forget`` callback;
    ``dispatch/`` sits above ``watchers/``, so its shape, not its class (invariant 12)."""

    def lagged(self, watcher: Watcher) -> None:
        """The watcher went LAGGING (counted)."""

    def ended(self, watcher: Watcher, reason: str) -> None:
        """The watcher closed: it leaves the dispatcher (possibly from inside a fan-out)."""


class CloseReason(enum.StrEnum):
    CLIENT_GONE = "client_gone"
    TIMEOUT = "timeout"
    BUFFER_OVERFLOW = "buffer_overflow"
    SHUTDOWN = "shutdown"
    EXPIRED = "expired"
    # It fell behind its window and the history it needs could not be fetched now (the upstream
    # unreachable): a 429 ERROR event, after which a client watches again from its rv.
    RETRY_LATER = "retry_later"
    # Delivering to this watcher raised (a bug on its path); its client resumes or relists.
    INTERNAL_ERROR = "internal_error"
    # The cache of its kind stopped (idle, over the memory budget, or its CRD deleted): the stream
    # ends as kube ends its watches when a kind's storage goes; the client watches again.
    CACHE_STOPPED = "cache_stopped"


def select_frame(predicate: SelectionPredicate, event: WatchEvent) -> bytes | None:
    """The full-JSON frame ``event`` means for a watch with ``predicate`` (kube's ``convertToWatchEvent``), or None.

    ``select_type`` followed by ``event.frame``, inlined: this runs once per event and group on
    the fan-out path. A predicate that selects everything gets the event's own frame without
    evaluating anything.
    """
    if predicate.selects_all:
        return event.frame(event.type)
    matches = predicate.matches
    if event.type == DELETED:
        if not matches(event.prev if event.prev is not None else event.object):
            return None
        return event.frame(DELETED)
    cur = matches(event.object)
    old = event.prev is not None and matches(event.prev)
    if cur:
        return event.frame(MODIFIED if old else ADDED)
    if old:
        # Left the selection: kube sends DELETED with the previous state.
        return event.frame(DELETED)
    return None


def select_type(predicate: SelectionPredicate, event: WatchEvent) -> str | None:
    """The type ``event`` is delivered as to a watch with ``predicate`` (ADDED/MODIFIED/DELETED), or None."""
    if predicate.selects_all:
        return event.type
    matches = predicate.matches
    if event.type == DELETED:
        return DELETED if matches(event.prev if event.prev is not None else event.object) else None
    cur = matches(event.object)
    old = event.prev is not None and matches(event.prev)
    if cur:
        return MODIFIED if old else ADDED
    return DELETED if old else None


class Watcher:
    # pending[i] (one frame, or a batch of frames joined) ends at rv pending_rv[i] and holds
    # pending_n[i] events; the first ``protected`` items are initial events (never dropped).
    # pending_bytes counts the droppable (live) items only; ``reported`` of them are counted in
    # the budget, and ``_mark`` is where _enqueue leaves its fast path (the cap, or the next step).
    __slots__ = (
        "_lead",
        "_mark",
        "_next_bookmark",
        "allow_bookmarks",
        "bookmark_interval",
        "bookmark_rv",
        "budget",
        "can_lag",
        "close_reason",
        "closed",
        "deadline",
        "encoding",
        "flushed_rv",
        "lagging",
        "last_rv",
        "max_pending_bytes",
        "owner",
        "pending",
        "pending_bytes",
        "pending_n",
        "pending_rv",
        "predicate",
        "protected",
        "reported",
        "resource",
        "resume_rv",
        "sink",
        "start_rv",
    )

    def __init__(
        self,
        resource: ResourceType,
        predicate: SelectionPredicate,
        start_rv: int,
        sink: WatchSink,
        *,
        allow_bookmarks: bool = False,
        deadline: float | None = None,
        bookmark_interval: float = 10.0,
        max_pending_bytes: int = 16 << 20,
        can_lag: bool = True,
        encoding: Encoding = FULL_JSON,
        budget: WatchBudget | None = None,
        owner: WatchOwner | None = None,
    ) -> None:
        self.resource = resource
        # How frames are written for this client: full JSON, or PartialObjectMetadata (JSON/protobuf).
        self.encoding = encoding
        # Applied once, to the first frame written (a Table watch's column definitions).
        self._lead = encoding.lead
        self.predicate = predicate
        # Events at or before start_rv are never delivered (the client has them).
        self.start_rv = start_rv
        # The newest rv this watcher has been given (event or bookmark).
        self.last_rv = start_rv
        # The rv of the last live frame handed to the writer: where a lagging watcher resumes.
        self.flushed_rv = start_rv
        self.sink = sink
        self.owner = owner
        self.allow_bookmarks = allow_bookmarks
        self.deadline = deadline
        self.bookmark_interval = bookmark_interval
        # The rv of the last BOOKMARK queued (0: none): a promise that every event up to it was sent.
        self.bookmark_rv = 0
        self.max_pending_bytes = max_pending_bytes
        # False: over the cap the watcher is closed instead (no history to replay from).
        self.can_lag = can_lag
        self.pending: list[bytes] = []
        self.pending_rv: list[int] = []
        self.pending_n: list[int] = []
        self.protected = 0
        self.pending_bytes = 0
        self.lagging = False
        self.resume_rv = start_rv
        self.closed = False
        self.close_reason: str | None = None
        self._next_bookmark: float | None = None
        # The process-wide budget this watcher's live bytes count toward, until it closes (only a
        # watcher that can lag: the budget's remedy is lagging).
        self.budget: WatchBudget | None = None
        self.reported = 0
        self._mark = max_pending_bytes
        if budget is not None and can_lag:
            self.budget = budget
            budget.join(self)
            self._mark = min(max_pending_bytes, budget.step)

    def __repr__(self) -> str:
        return f"Watcher({self.resource.qualified}, from={self.start_rv}, last={self.last_rv})"

    # ----------------------------------------------------------------- delivery

    def frame_for(self, event: WatchEvent) -> bytes | None:
        """The frame ``event`` means for this watcher, or None (also for events it already has)."""
        # Only events after the start rv: the client has the rest (invariant 1).
        if event.rv <= self.start_rv:
            return None
        encoding = self.encoding
        if encoding is FULL_JSON:
            return select_frame(self.predicate, event)
        as_type = select_type(self.predicate, event)
        return None if as_type is None else encoding.event_frame(event, as_type)

    def deliver(self, event: WatchEvent) -> bool:
        """Queue the frame ``event`` means for this watcher, if any; True if one was queued."""
        if self.closed or self.lagging:
            return False
        frame = self.frame_for(event)
        if frame is None:
            return False
        self._enqueue(frame, event.rv)
        return True

    def deliver_batch(self, frames: bytes, count: int, events: Sequence[WatchEvent]) -> int:
        """Queue ``frames``: the ``count`` frames its group selected from ``events``, joined.

        Returns the number of events queued. A watcher that started inside the batch (only
        possible for one registered out of the usual order) takes its events one by one.
        """
        if self.closed or self.lagging:
            return 0
        if events[0].rv <= self.start_rv:  # invariant 1: none at or before start_rv
            return sum(self.deliver(event) for event in events)
        self._enqueue(frames, events[-1].rv, count)
        return count

    def deliver_initial(self, parts: Sequence[bytes], rv: int, events: int = 1) -> None:
        """Queue the initial state (``events`` frames in pre-built pieces) that brings the watcher to ``rv``."""
        if self.closed or not parts:
            return
        was_empty = not self.pending
        at = self.protected
        self.pending[at:at] = parts
        self.pending_rv[at:at] = [rv] * len(parts)
        # Each event is counted once, on its last part.
        self.pending_n[at:at] = [0] * (len(parts) - 1) + [events]
        self.protected += len(parts)
        if rv > self.last_rv:
            self.last_rv = rv
        if was_empty:
            self.sink.wake(self)

    def bookmark(
        self, rv: int, frame: bytes | None = None, *, initial_events_end: bool = False, final: bool = False
    ) -> bool:
        """Queue a BOOKMARK at ``rv`` (a promise: every event up to rv was sent).

        ``final``: the last one before shutdown, sent even if rv has not moved since the
        watch started, so that every client has an rv to resume from elsewhere.
        """
        if self.closed or not self.allow_bookmarks:
            return False
        if initial_events_end:
            self.deliver_initial([self.encoding.bookmark_frame(self.resource, rv, initial_events_end=True)], rv)
            self.bookmark_rv = rv
            return True
        if self.lagging or rv < self.last_rv or (rv <= self.start_rv and not final):
            return False
        self.bookmark_rv = rv
        self._enqueue(frame or self.encoding.bookmark_frame(self.resource, rv), rv)
        return True

    def announce(self, rv: int, frame: bytes) -> bool:
        """Queue a BOOKMARK ``frame`` at ``rv`` that announces something (a relist diff), not progress.

        Sent even at the watch's start rv, which an ordinary bookmark is not; never to a
        lagging watcher, whose unsent frames are gone (it catches up from history or ends).
        """
        if self.closed or not self.allow_bookmarks or self.lagging or rv < self.last_rv:
            return False
        self._enqueue(frame, rv)
        return True

    def expire(self, error: bytes, reason: CloseReason = CloseReason.EXPIRED) -> None:
        """End the watch with ``error`` (an ERROR frame) after what is pending: on 410 the client relists."""
        if self.closed:
            return
        self.pending.append(error)
        self.pending_rv.append(self.last_rv)
        self.pending_n.append(0)
        self.close(reason)

    def _enqueue(self, frame: bytes, rv: int, count: int = 1) -> None:
        was_empty = not self.pending
        self.pending.append(frame)
        self.pending_rv.append(rv)
        self.pending_n.append(count)
        self.pending_bytes += len(frame)
        self.last_rv = rv
        if self.pending_bytes > self._mark and self._past_mark():
            return
        if was_empty:
            self.sink.wake(self)

    def _past_mark(self) -> bool:
        """Over the cap: overflow (True). Else another step behind: tell the budget (False). Invariant 6."""
        if self.pending_bytes > self.max_pending_bytes:
            if not self.can_lag:
                self.close(CloseReason.BUFFER_OVERFLOW)
            else:
                self.lag()
            return True
        self._report()
        return False

    def _report(self) -> None:
        budget = self.budget
        if budget is None:
            return
        charged = self.pending_bytes - self.reported
        self.reported = self.pending_bytes
        self._mark = min(self.max_pending_bytes, self.pending_bytes + budget.step)
        budget.charge(charged)

    def _unreport(self) -> None:
        budget = self.budget
        if budget is not None:
            budget.refund(self.reported)
            self._mark = min(self.max_pending_bytes, budget.step)
        self.reported = 0

    def lag(self) -> None:
        """Go LAGGING: drop the unsent live frames, keep the initial events (see module doc; invariant 6)."""
        del self.pending[self.protected :]
        del self.pending_rv[self.protected :]
        del self.pending_n[self.protected :]
        self.pending_bytes = 0
        if self.reported:
            self._unreport()
        self.lagging = True
        self.resume_rv = self.flushed_rv
        self.last_rv = self.flushed_rv
        if self.owner is not None:
            self.owner.lagged(self)
        self.sink.lagging(self)

    def take(self, max_bytes: int = 0) -> tuple[list[bytes], int]:
        """Hand pending frames to the writer: all of them, or about ``max_bytes`` (at least one).

        Returns them and the number of events they hold.
        """
        pending = self.pending
        if not pending:
            return [], 0
        if self._lead is not None:
            led = self._lead(pending[0])
            if not self.protected:  # a live frame: counted in pending_bytes, which must stay exact
                self.pending_bytes += len(led) - len(pending[0])
            pending[0] = led
            self._lead = None
        if not self.protected and (not max_bytes or self.pending_bytes <= max_bytes):
            # The live path (once per watcher per flush): everything, no slicing.
            counts = self.pending_n
            self.flushed_rv = self.pending_rv[-1]
            self.pending, self.pending_rv, self.pending_n = [], [], []
            self.pending_bytes = 0
            if self.reported:
                self._unreport()
            return pending, counts[0] if len(counts) == 1 else sum(counts)
        if not max_bytes or len(pending) <= 1:
            count = len(pending)
        else:
            size = 0
            count = 0
            for frame in pending:
                size += len(frame)
                count += 1
                if size >= max_bytes:
                    break
        frames = pending[:count]
        events = sum(self.pending_n[:count])
        protected = min(count, self.protected)
        if count > protected:
            self.pending_bytes -= sum(map(len, frames[protected:]))
            self.flushed_rv = self.pending_rv[count - 1]
            if self.reported:
                self._unreport()
                if self.pending_bytes > self._mark:
                    self._report()
        self.protected -= protected
        del pending[:count]
        del self.pending_rv[:count]
        del self.pending_n[:count]
        return frames, events

    def replay(self, events: Sequence[WatchEvent]) -> bool:
        """Queue ``events`` (the history after ``resume_rv``) until about half the cap is queued.

        Stops only between two rv groups, never inside one (invariant 3). Returns True when
        every event was replayed: the watcher is live again.
        """
        done = self._replay(events, self.max_pending_bytes // 2)
        if self.pending_bytes > self._mark:
            self._report()
        return done

    def _replay(self, events: Sequence[WatchEvent], fill: int) -> bool:
        i = 0
        n = len(events)
        while i < n:
            group_rv = events[i].rv
            while i < n and events[i].rv == group_rv:
                frame = self.frame_for(events[i])
                if frame is not None:
                    self.pending.append(frame)
                    self.pending_rv.append(group_rv)
                    self.pending_n.append(1)
                    self.pending_bytes += len(frame)
                i += 1
            self.resume_rv = group_rv
            self.last_rv = group_rv
            # Stops between rv groups only: a client never holds half a group (invariant 3).
            if self.pending_bytes >= fill and i < n:
                return False
        self.lagging = False
        return True

    # ----------------------------------------------------------------- bookmarks & lifetime

    def next_bookmark(self, now: float) -> float | None:
        """When the next periodic bookmark is due, as kube's ``nextBookmarkTime``.

        Every ``bookmark_interval``, and 2 s before the watch's deadline so the client
        can resume from a fresh rv when the server ends the watch.
        """
        if not self.allow_bookmarks:
            return None
        due = now + self.bookmark_interval
        if self.deadline is not None:
            pre_timeout = self.deadline - 2.0
            if pre_timeout < due:
                due = pre_timeout
            if due < now:
                return None
        return due

    def close(self, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        self.close_reason = reason
        budget = self.budget
        if budget is not None:
            # What is still pending is written now (timeout, shutdown) or dropped: not counted on.
            budget.leave(self, self.reported)
            self.reported = 0
            self.budget = None
            self._mark = self.max_pending_bytes
        if reason in (CloseReason.BUFFER_OVERFLOW, CloseReason.CLIENT_GONE):
            self.pending = []
            self.pending_rv = []
            self.pending_n = []
            self.protected = 0
            self.pending_bytes = 0
        # Otherwise (timeout, shutdown) the stream writes what is pending before it ends.
        if self.owner is not None:
            self.owner.ended(self, reason)
        self.sink.closed(self, reason)
