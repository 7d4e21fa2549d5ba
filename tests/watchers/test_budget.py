"""WatchBudget: the unsent bytes of all watchers, and who lags first when they exceed it."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.handlers import arun
from watchcache.cache.encoding import FULL_JSON, Encoding
from watchcache.cache.predicate import SelectionPredicate
from watchcache.resources import PODS
from watchcache.watchers.budget import WatchBudget
from watchcache.watchers.flush import FlushScheduler
from watchcache.watchers.watcher import CloseReason, Watcher


class Sink:
    """A stream whose client reads (``reading``: flushes take everything) or does not."""

    def __init__(self, flusher: FlushScheduler | None = None, reading: bool = False) -> None:
        self.flusher = flusher
        self.reading = reading
        self.watcher: Watcher | None = None
        self.lagged = 0

    def wake(self, watcher: Watcher) -> None:
        if self.flusher is not None:
            self.flusher.mark(self)

    def closed(self, watcher: Watcher, reason: str) -> None:
        pass

    def lagging(self, watcher: Watcher) -> None:
        self.lagged += 1

    def flush(self) -> None:
        if self.reading and self.watcher is not None:
            self.watcher.take()


def watcher(budget: WatchBudget, sink: Sink | None = None, cap: int = 1 << 20) -> Watcher:
    sink = sink or Sink()
    w = Watcher(PODS, ALL, 0, sink, max_pending_bytes=cap, budget=budget)
    sink.watcher = w
    return w


ALL = SelectionPredicate.parse(PODS, None, "", "")
RV = iter(range(1, 1 << 30))


def feed(w: Watcher, size: int) -> None:
    """One batch of ``size`` bytes (the dispatcher hands each watcher one joined blob)."""
    w._enqueue(b"x" * size, next(RV))


def consistent(budget: WatchBudget) -> None:
    assert budget.pending == sum(w.reported for w in budget.watchers)
    for w in budget.watchers:
        assert 0 <= w.reported <= w.pending_bytes
        # Not reported: less than one step (plus the batch that crossed it, when under the cap).
        assert w.pending_bytes - w.reported <= budget.step or (w.reported == 0 and w.pending_bytes <= budget.step)


OPS = st.lists(
    st.tuples(
        st.sampled_from(["feed", "take", "take_part", "lag", "replay", "close", "bookmark"]),
        st.integers(0, 5),
        st.integers(1, 3000),
    ),
    max_size=80,
)


@settings(max_examples=200, deadline=None)
@given(OPS)
def test_the_sum_is_the_watchers_reported_bytes_whatever_they_do(ops: list[tuple[str, int, int]]) -> None:
    budget = WatchBudget(64 * 1000)  # step: 1,000 bytes
    assert budget.step == 1000
    ws = [watcher(budget, cap=20_000) for _ in range(6)]
    for op, i, size in ops:
        w = ws[i]
        if op == "feed":
            feed(w, size)
        elif op == "take":
            w.take()
        elif op == "take_part":
            w.take(size)
        elif op == "lag" and not w.closed:
            w.lag()
        elif op == "replay" and w.lagging and not w.closed:
            w.replay([])  # nothing to replay: live again
        elif op == "close":
            w.close(CloseReason.TIMEOUT if size % 2 else CloseReason.CLIENT_GONE)
        elif op == "bookmark":
            w.allow_bookmarks = True
            w.bookmark(10**9 + size, FULL_JSON.bookmark_frame(PODS, 10**9 + size))
        consistent(budget)
    for w in ws:
        w.close(CloseReason.SHUTDOWN)
    assert budget.pending == 0 and not budget.watchers


def test_past_the_limit_the_watchers_furthest_behind_lag_first() -> None:
    budget = WatchBudget(100_000)  # step 1,562
    ws = [watcher(budget) for _ in range(5)]
    for w, size in zip(ws, (10_000, 40_000, 20_000, 30_000, 1_000), strict=True):
        feed(w, size)
    assert budget.pending == 100_000  # not the last one: it is less than a step behind
    feed(ws[2], 25_000)  # 125,000: over; without a flusher it is enforced at once
    # Down to 3/4 of the limit (75,000): the 45,000 and the 40,000 go, largest first.
    assert [w.lagging for w in ws] == [False, True, True, False, False]
    assert budget.pending == 40_000 and budget.shed == 2
    assert all(w.pending_bytes == 0 for w in ws if w.lagging)
    assert [w.sink.lagged for w in ws] == [0, 1, 1, 0, 0]  # type: ignore[attr-defined]


@arun
async def test_enforced_after_the_flush_pass_so_a_burst_readers_take_does_not_count() -> None:
    loop = asyncio.get_running_loop()
    flusher = FlushScheduler(loop)
    budget = WatchBudget(100_000, flusher)
    readers = [watcher(budget, Sink(flusher, reading=True)) for _ in range(15)]
    stalled = [watcher(budget, Sink(flusher, reading=False)) for _ in range(5)]
    for w in readers + stalled:
        feed(w, 10_000)  # one 200,000-byte burst in one loop step: over the limit
    assert budget.pending == 200_000
    await asyncio.sleep(0)  # the flush pass: readers take theirs, then the budget is checked
    assert budget.pending == 50_000 and budget.shed == 0
    assert not any(w.lagging for w in readers + stalled)
    # The stalled ones keep falling behind: past the limit, they lag, the furthest first.
    for i, w in enumerate(stalled):
        feed(w, 10_000 + 1_000 * i)
    await asyncio.sleep(0)
    assert budget.pending <= 75_000 and budget.shed == 2
    assert [w.lagging for w in stalled] == [False, False, False, True, True]
    assert not any(w.lagging for w in readers)


class _Leading(Encoding):
    """An encoding whose first frame per watcher grows (as a Table watch's gets its column definitions)."""

    @staticmethod
    def lead(frame: bytes) -> bytes:
        return b"COLUMNS" + frame


def test_a_led_first_frame_keeps_the_pending_bytes_exact() -> None:
    budget = WatchBudget(64 * 1000)
    w = Watcher(PODS, ALL, 0, Sink(), max_pending_bytes=1 << 20, budget=budget, encoding=_Leading())
    feed(w, 100)
    feed(w, 200)
    frames, _ = w.take(max_bytes=1)
    assert frames == [b"COLUMNS" + b"x" * 100]
    assert w.pending_bytes == 200
    w.take()
    assert w.pending_bytes == 0
    consistent(budget)
