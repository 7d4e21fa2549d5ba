"""Watch timeouts (``timeoutSeconds``, or the server's random one): one loop timer for all watches.

A watch ends at its deadline with ``CloseReason.TIMEOUT``, as with a ``loop.call_later`` per watch,
at the same instant. But a timer handle (uvloop's handle, its libuv timer, the context it copies)
is ~0.7 KB on every idle watch, where a heap entry here is ~0.1 KB (docs/lab/performance-notebook.md, "Memory
per idle watch"): the heap holds ``(deadline, seq, watcher)`` and the loop holds one timer, for
the earliest.

A watch that ends another way leaves its entry until it is popped (``ended``): those are counted,
and the heap is rebuilt without them when they are more than half of it, so it stays within
twice the open watches (and a closed watch, with its stream, is not held for minutes).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging

from watchcache.watchers.watcher import CloseReason, Watcher

__all__ = ["WatchDeadlines"]

log = logging.getLogger("watchcache.watchers.deadlines")

# Entries of ended watches tolerated before a rebuild is considered.
_SLACK = 64


class WatchDeadlines:
    """Owned by the event loop thread; one per process (``ApiContext.watch_deadlines``)."""

    __slots__ = ("_at", "_heap", "_loop", "_seq", "_stale", "_timer")

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._heap: list[tuple[float, int, Watcher]] = []
        self._seq = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._at = 0.0  # when ``_timer`` fires
        self._stale = 0  # entries of watches that ended before their deadline

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, watcher: Watcher, timeout: float) -> None:
        """End ``watcher`` ``timeout`` seconds from now (the loop's clock), unless it ends before."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        at = loop.time() + timeout
        heapq.heappush(self._heap, (at, next(self._seq), watcher))
        if self._timer is None or at < self._at:
            self._arm(at)

    def ended(self, watcher: Watcher) -> None:
        """``watcher`` (added) is closed: its entry is stale, unless its deadline is what closed it."""
        if watcher.close_reason == CloseReason.TIMEOUT:
            return  # popped by _fire
        self._stale += 1
        heap = self._heap
        if self._stale > _SLACK and 2 * self._stale > len(heap):
            heap[:] = [entry for entry in heap if not entry[2].closed]
            heapq.heapify(heap)
            self._stale = 0
            if not heap and self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        assert self._loop is not None
        self._at = at
        self._timer = self._loop.call_at(at, self._fire)

    def _fire(self) -> None:
        self._timer = None
        assert self._loop is not None
        now = self._loop.time()
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, _, watcher = heapq.heappop(heap)
            if watcher.closed:
                self._stale -= 1
                continue
            try:
                watcher.close(CloseReason.TIMEOUT)
            except Exception:
                log.exception("ending %r at its deadline failed", watcher)
        if self._stale < 0:
            self._stale = 0
        if heap:
            self._arm(heap[0][0])
