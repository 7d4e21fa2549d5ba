"""The history window: the recent events of one resource, in resourceVersion order.

Invariants 1 and 3 (docs/architecture.md; tested in ``tests/cache/test_history.py``):

* events are ordered by ``rv`` (non-decreasing; several events may share one rv when
  they form one atomic change, e.g. a relist's diff) and a group of events with the
  same rv is evicted whole, never split;
* ``oldest_rv`` is the resourceVersion the window starts *after*: every event with
  ``rv > oldest_rv`` that the cache applied is still here. So the state at any
  ``rv >= oldest_rv`` can be rebuilt exactly by undoing the events after it, and a
  watch from any ``rv >= oldest_rv`` can be served without a gap;
* the window is bounded by count (``max_events``) and by age (``max_age``): an event
  older than ``max_age`` (by the injected clock) is evicted at the next ``expire``;
* ``at(rv)`` counts the events of the group at ``rv``, including those of the group at
  ``oldest_rv`` that were evicted (a group whose events arrived in several batches can
  straddle an eviction): a resume point shared by several events is ambiguous;
* ``prepend`` puts a span of older events in front (a backfill from the upstream,
  ``ResourceCache.backfill``): it must end at ``oldest_rv`` and fit in ``max_events``, and
  its events carry the head's arrival time, so ``expire`` still meets them in time order.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterator

from watchcache.cache.events import WatchEvent


class HistoryWindow:
    """A list used as a queue (``_start`` is the head) so that lookups by rv can bisect."""

    __slots__ = ("_bytes", "_events", "_start", "evicted_at_oldest", "max_age", "max_events", "oldest_rv")

    def __init__(self, max_events: int, max_age: float, oldest_rv: int = 0) -> None:
        if max_events < 1:
            raise ValueError("max_events must be at least 1")
        self.max_events = max_events
        self.max_age = max_age
        self.oldest_rv = oldest_rv
        # How many events of the group at oldest_rv were evicted (0 after a reset).
        self.evicted_at_oldest = 0
        self._events: list[WatchEvent] = []
        self._start = 0
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._events) - self._start

    def __iter__(self) -> Iterator[WatchEvent]:
        return iter(self._events[self._start :])

    @property
    def bytes(self) -> int:
        """JSON bytes of the objects the window references (its main memory cost)."""
        return self._bytes

    @property
    def oldest_event_time(self) -> float | None:
        return self._events[self._start].received if len(self) else None

    def reset(self, rv: int) -> None:
        """Forget everything: the cache was (re)initialised at ``rv``."""
        self._events = []
        self._start = 0
        self._bytes = 0
        self.oldest_rv = rv
        self.evicted_at_oldest = 0

    def append(self, event: WatchEvent) -> None:
        """Add the newest event; the caller guarantees rv order."""
        self._events.append(event)
        self._bytes += event.size
        if len(self) > self.max_events:
            self._evict_oldest_group()

    def room(self) -> int:
        """How many events a ``prepend`` may add now."""
        return self.max_events - len(self)

    def prepend(self, events: list[WatchEvent], oldest_rv: int) -> None:
        """Put ``events`` (every event in ``(oldest_rv, self.oldest_rv]``, in rv order) in front.

        The caller stamps them no later than the head's ``received`` (``expire`` evicts from
        the head while it is old: a younger head would shield older events behind it). Refused
        (ValueError, nothing changed) when they do not fit, are out of order or outside the
        span, or when the group at ``oldest_rv`` was partly evicted: the events before it
        could not be told apart from those already here.
        """
        if oldest_rv >= self.oldest_rv:
            raise ValueError(f"a span must start before the window's oldest rv {self.oldest_rv}, not at {oldest_rv}")
        if self.at(self.oldest_rv):
            # The rest of a group at oldest_rv came after the group was evicted (an upstream tier's
            # group split across reads): the span's events at that rv could not be told apart.
            raise ValueError(f"the group at the window's oldest rv {self.oldest_rv} was partly evicted")
        if len(events) > self.room():
            raise ValueError(f"{len(events)} events do not fit: room for {self.room()} of {self.max_events}")
        last = oldest_rv
        for event in events:
            if event.rv <= oldest_rv or event.rv < last or event.rv > self.oldest_rv:
                raise ValueError(f"event at rv {event.rv} out of order in a span ({oldest_rv}, {self.oldest_rv}]")
            last = event.rv
        head = self._events[self._start] if len(self) else None
        if head is not None and events and events[-1].received > head.received:
            raise ValueError("a span's events must not be younger than the window's head")
        self._events = events + self._events[self._start :]
        self._start = 0
        self._bytes += sum(e.size for e in events)
        self.oldest_rv = oldest_rv
        self.evicted_at_oldest = 0

    def expire(self, now: float) -> int:
        """Evict groups older than ``max_age``; returns the number of events evicted."""
        evicted = 0
        while len(self) and now - self._events[self._start].received > self.max_age:
            evicted += self._evict_oldest_group()
        return evicted

    @property
    def newest_rv(self) -> int | None:
        """The rv of the newest event still in the window (None if empty)."""
        return self._events[-1].rv if len(self) else None

    def at(self, rv: int) -> list[WatchEvent]:
        """The events at ``rv`` still in the window (O(log n))."""
        lo = bisect_left(self._events, rv, lo=self._start, key=_rv_of)
        hi = bisect_right(self._events, rv, lo=lo, key=_rv_of)
        return self._events[lo:hi]

    def since(self, rv: int) -> list[WatchEvent]:
        """Every event with ``rv`` greater than ``rv``; the caller checks ``rv >= oldest_rv``."""
        index = bisect_right(self._events, rv, lo=self._start, key=_rv_of)
        return self._events[index:]

    def _evict_oldest_group(self) -> int:
        # Whole groups only, so a resume point is never half in the window (invariant 3).
        events = self._events
        group_rv = events[self._start].rv
        count = 0
        end = len(events)
        while self._start < end and events[self._start].rv == group_rv:
            self._bytes -= events[self._start].size
            self._start += 1
            count += 1
        self.evicted_at_oldest = count + (self.evicted_at_oldest if group_rv == self.oldest_rv else 0)
        self.oldest_rv = group_rv
        # Compact once the dead head is half the list: amortised O(1) per event.
        if self._start * 2 > len(events):
            del events[: self._start]
            self._start = 0
        return count


def _rv_of(event: WatchEvent) -> int:
    return event.rv
