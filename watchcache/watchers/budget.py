"""One process-wide budget for the unsent bytes of all watchers.

Each watcher's buffer is capped (``max_pending_bytes``), but 10,000 watchers whose clients
read slowly could each hold up to that cap. Past this budget, the watchers with the most
unsent bytes go LAGGING first (the lag cycle of :mod:`watchcache.dispatch.cacher`):
they drop their live buffer and are replayed from history once their client drains, or get
410 if history has moved on. Their clients miss nothing; they wait.

Accounting costs nothing per event: a watcher reports its unsent bytes in steps of
``step`` bytes, when the comparison ``Watcher._enqueue`` already makes against its own cap
says it has crossed the next step, and takes them back when its frames leave (``take``, a
drop, ``close``). So the sum counts every watcher that is at least one step behind, in
whole: a watcher less than a step (64 KiB) behind is not counted -- its bytes leave with the
next write, like the transport's own buffer (up to its 256 KiB high-water mark), which is
not counted either.

The budget is enforced after a flush pass, never in the middle of a fan-out: a burst that
every reading client takes in the same loop pass never sets it off, only bytes still unsent
once every writable stream has been written.

The sum counts a frame shared by several watchers once per watcher, so it overstates memory
when many watchers hold the same frames (watchers with one predicate share one buffer per
batch); it is a bound, not a measurement. It is the process-wide half of invariant 6.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class AfterFlush(Protocol):
    def after_pass(self, job: Callable[[], object]) -> None:
        """Run ``job()`` once at the end of the next flush pass."""


class Budgeted(Protocol):
    """What the budget reads of a watcher (``watchers.watcher.Watcher``), and its one remedy."""

    @property
    def reported(self) -> int:
        """The bytes this watcher has charged to the budget (and not yet refunded)."""

    @property
    def pending_bytes(self) -> int: ...

    @property
    def lagging(self) -> bool: ...

    @property
    def closed(self) -> bool: ...

    def lag(self) -> None:
        """Drop the unsent live bytes (refunding them) and catch up from history later."""


class WatchBudget:
    """Unsent live bytes of the registered watchers, and what happens past ``limit``.

    Watchers change it only through ``join``/``charge``/``refund``/``leave``; ``pending``,
    ``watchers`` and ``shed`` are read by metrics and tests.
    """

    __slots__ = ("_requested", "flusher", "limit", "pending", "shed", "step", "watchers")

    def __init__(self, limit: int, flusher: AfterFlush | None = None) -> None:
        # 0: no limit (bytes are still counted).
        self.limit = limit if limit > 0 else 1 << 62
        self.flusher = flusher
        # Watchers report in steps this large (a small budget, in tests, gets small steps).
        self.step = max(1, min(64 << 10, self.limit // 64))
        # The sum of the registered watchers' ``reported`` bytes.
        self.pending = 0
        self.watchers: set[Budgeted] = set()
        # Watchers sent to catch up from history because of this budget (a metric).
        self.shed = 0
        self._requested = False

    def join(self, watcher: Budgeted) -> None:
        """Count ``watcher``'s unsent bytes from now on (until ``leave``)."""
        self.watchers.add(watcher)

    def leave(self, watcher: Budgeted, reported: int) -> None:
        """``watcher`` ended: its ``reported`` bytes are no longer owed (written or dropped)."""
        self.pending -= reported
        self.watchers.discard(watcher)

    def charge(self, nbytes: int) -> None:
        """A watcher is ``nbytes`` further behind (it crossed a step); past ``limit``, enforce."""
        self.pending += nbytes
        if self.pending > self.limit:
            self.over()

    def refund(self, nbytes: int) -> None:
        """A watcher's charged bytes left it (written, or dropped when it lagged)."""
        self.pending -= nbytes

    def over(self) -> None:
        """The sum went past ``limit``: enforce after the flush pass (at once without a flusher)."""
        if self._requested:
            return
        self._requested = True
        if self.flusher is None:
            self.enforce()
        else:
            self.flusher.after_pass(self.enforce)

    def enforce(self) -> int:
        """Lag the watchers with the most unsent bytes until the sum is at 3/4 of the limit.

        Returns how many were lagged. The margin keeps one slow client from setting this off
        on every batch.
        """
        self._requested = False
        if self.pending <= self.limit:
            return 0
        target = self.limit - self.limit // 4
        behind = sorted(
            (w for w in self.watchers if w.reported and not w.lagging and not w.closed),
            key=lambda w: w.pending_bytes,
            reverse=True,
        )
        lagged = 0
        for watcher in behind:
            if self.pending <= target:
                break
            watcher.lag()
            lagged += 1
        self.shed += lagged
        return lagged
