"""WatchDeadlines: every watch ends at its own deadline, on one loop timer; ended watches do not pile up."""

from __future__ import annotations

import asyncio

from harness.doubles import NullSink
from harness.waiting import until
from tests.support.handlers import arun
from watchcache.cache.predicate import SelectionPredicate
from watchcache.resources import PODS
from watchcache.watchers.deadlines import WatchDeadlines
from watchcache.watchers.watcher import CloseReason, Watcher

ALL = SelectionPredicate.parse(PODS, None, "", "")


class _Ends(NullSink):
    def __init__(self, loop: asyncio.AbstractEventLoop, log: list[tuple[str, str, float]], name: str) -> None:
        self.loop, self.log, self.name = loop, log, name

    def closed(self, watcher: object, reason: str) -> None:
        self.log.append((self.name, reason, self.loop.time()))


@arun
async def test_each_watch_ends_at_its_deadline_in_order_as_with_a_timer_each():
    loop = asyncio.get_running_loop()
    deadlines = WatchDeadlines()
    log: list[tuple[str, str, float]] = []
    start = loop.time()
    for name, timeout in (("c", 0.15), ("a", 0.05), ("d", 0.15), ("b", 0.1)):
        deadlines.add(Watcher(PODS, ALL, 0, _Ends(loop, log, name)), timeout)
    early = Watcher(PODS, ALL, 0, _Ends(loop, log, "gone"))
    deadlines.add(early, 0.08)
    early.close(CloseReason.CLIENT_GONE)  # ends another way first: never timed out
    deadlines.ended(early)
    await until(lambda: len(log) == 5)
    assert [(name, reason) for name, reason, _ in log] == [
        ("gone", "client_gone"),
        ("a", "timeout"),
        ("b", "timeout"),
        ("c", "timeout"),
        ("d", "timeout"),
    ]
    for (name, _, at), want in zip(log[1:], (0.05, 0.1, 0.15, 0.15), strict=True):
        assert at - start >= want, (name, at - start)  # never early (late only by the loop's load)
    assert len(deadlines) == 0


@arun
async def test_a_later_watch_with_an_earlier_deadline_moves_the_timer_forward():
    loop = asyncio.get_running_loop()
    deadlines = WatchDeadlines()
    log: list[tuple[str, str, float]] = []
    deadlines.add(Watcher(PODS, ALL, 0, _Ends(loop, log, "late")), 60.0)
    deadlines.add(Watcher(PODS, ALL, 0, _Ends(loop, log, "soon")), 0.02)
    await until(lambda: log)
    await asyncio.sleep(0.05)
    assert [name for name, _, _ in log] == ["soon"]


@arun
async def test_entries_of_watches_that_ended_early_are_dropped_past_half_the_heap():
    loop = asyncio.get_running_loop()
    deadlines = WatchDeadlines()
    log: list[tuple[str, str, float]] = []
    watchers = [Watcher(PODS, ALL, 0, _Ends(loop, log, str(i))) for i in range(1000)]
    for w in watchers:
        deadlines.add(w, 3600.0)
    for w in watchers[:900]:  # clients gone long before their deadlines
        w.close(CloseReason.CLIENT_GONE)
        deadlines.ended(w)
        assert len(deadlines) <= 2 * (1000 - watchers.index(w) - 1) + 65
    assert len(deadlines) < 300
    assert all(not w.closed for w in watchers[900:])
