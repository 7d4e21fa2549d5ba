"""One client watch: what it selects, where it starts, and the frames waiting for it.

A ``Watcher`` never writes by itself. ``deliver`` turns an event into the frame this
watcher must see (ADDED/MODIFIED/DELETED, with kube's selector-transition rules) and
appends the event's *shared* frame bytes to ``pending``; the ``WatchSink`` (the HTTP
stream) is told once that there is something to flush, and flushes everything
pending in one write. The watcher is thus testable without sockets.

Lifecycle: ACTIVE → CLOSED (once). ``close(reason)`` is idempotent.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Protocol

from watchcache.cache.events import ADDED, DELETED, MODIFIED, WatchEvent, bookmark_frame
from watchcache.cache.predicate import SelectionPredicate
from watchcache.resources import ResourceType


class WatchSink(Protocol):
    def wake(self, watcher: Watcher) -> None:
        """There are frames pending (called once per empty → non-empty transition)."""

    def closed(self, watcher: Watcher, reason: str) -> None:
        """The watcher ended (timeout, overflow, shutdown, client gone)."""


class CloseReason(enum.StrEnum):
    CLIENT_GONE = "client_gone"
    TIMEOUT = "timeout"
    BUFFER_OVERFLOW = "buffer_overflow"
    SHUTDOWN = "shutdown"
    EXPIRED = "expired"


class Watcher:
    __slots__ = (
        "_next_bookmark",
        "allow_bookmarks",
        "bookmark_interval",
        "close_reason",
        "closed",
        "deadline",
        "last_rv",
        "max_pending_bytes",
        "pending",
        "pending_bytes",
        "predicate",
        "resource",
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
    ) -> None:
        self.resource = resource
        self.predicate = predicate
        # Events at or before start_rv are never delivered (the client has them).
        self.start_rv = start_rv
        # The newest rv this watcher has been given (event or bookmark).
        self.last_rv = start_rv
        self.sink = sink
        self.allow_bookmarks = allow_bookmarks
        self.deadline = deadline
        self.bookmark_interval = bookmark_interval
        self.max_pending_bytes = max_pending_bytes
        self.pending: list[bytes] = []
        self.pending_bytes = 0
        self.closed = False
        self.close_reason: str | None = None
        self._next_bookmark: float | None = None

    def __repr__(self) -> str:
        return f"Watcher({self.resource.qualified}, from={self.start_rv}, last={self.last_rv})"

    # ----------------------------------------------------------------- delivery

    def deliver(self, event: WatchEvent) -> bool:
        """Queue the frame ``event`` means for this watcher, if any; True if one was queued."""
        if self.closed or event.rv <= self.start_rv:
            return False
        matches = self.predicate.matches
        if event.type == DELETED:
            if not matches(event.prev if event.prev is not None else event.object):
                return False
            as_type = DELETED
        else:
            cur = matches(event.object)
            old = event.prev is not None and matches(event.prev)
            if cur:
                as_type = MODIFIED if old else ADDED
            elif old:
                # Left the selection: kube sends DELETED with the previous state.
                as_type = DELETED
            else:
                return False
        self._enqueue(event.frame(as_type), event.rv)
        return True

    def deliver_parts(self, parts: Sequence[bytes], rv: int) -> None:
        """Queue pre-built frame pieces (initial ADDED events) that bring the watcher to ``rv``."""
        if self.closed or not parts:
            return
        was_empty = not self.pending
        self.pending.extend(parts)
        self.pending_bytes += sum(len(p) for p in parts)
        if rv > self.last_rv:
            self.last_rv = rv
        if was_empty:
            self.sink.wake(self)

    def bookmark(self, rv: int, frame: bytes | None = None, *, initial_events_end: bool = False) -> bool:
        """Queue a BOOKMARK at ``rv`` (a promise: every event up to rv was sent)."""
        if (
            self.closed
            or not self.allow_bookmarks
            or rv < self.last_rv
            or (rv <= self.start_rv and not initial_events_end)
        ):
            return False
        if frame is None:
            frame = bookmark_frame(self.resource, rv, initial_events_end=initial_events_end)
        self._enqueue(frame, rv)
        return True

    def _enqueue(self, frame: bytes, rv: int) -> None:
        was_empty = not self.pending
        self.pending.append(frame)
        self.pending_bytes += len(frame)
        self.last_rv = rv
        if self.pending_bytes > self.max_pending_bytes:
            # Bounded memory: a watcher that cannot keep up is ended; the client resumes
            # from the last rv it read (the catch-up path comes with the hot-path work).
            self.close(CloseReason.BUFFER_OVERFLOW)
            return
        if was_empty:
            self.sink.wake(self)

    def take(self) -> list[bytes]:
        """Hand everything pending to the writer (one write per flush)."""
        frames = self.pending
        self.pending = []
        self.pending_bytes = 0
        return frames

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
        if reason in (CloseReason.BUFFER_OVERFLOW, CloseReason.CLIENT_GONE):
            self.pending = []
            self.pending_bytes = 0
        # Otherwise (timeout, shutdown) the stream writes what is pending before it ends.
        self.sink.closed(self, reason)
