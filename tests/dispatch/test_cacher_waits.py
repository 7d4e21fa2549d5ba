"""Cacher.wait_for_rv: a waiter is gone the moment its wait ends, whatever ends it."""

from __future__ import annotations

import asyncio

from tests.support.factories import pod
from watchcache.cache.events import ADDED
from watchcache.dispatch.cacher import Cacher
from watchcache.resources import PODS

FAR = 1_000_000_000_000_000


def cacher_at(rv: int) -> Cacher:
    c = Cacher(PODS)
    c.replace([], rv)
    return c


def test_timed_out_waits_leave_nothing_behind() -> None:
    async def go() -> tuple[list[bool], int]:
        c = cacher_at(10)
        results = await asyncio.gather(*(c.wait_for_rv(FAR, 0.01) for _ in range(1000)))
        return results, len(c._waiters)

    results, left = asyncio.run(go())
    assert not any(results)
    assert left == 0, f"{left} timed-out waiters left behind"


def test_cancelled_waits_leave_nothing_behind() -> None:
    async def go() -> int:
        c = cacher_at(10)
        tasks = [asyncio.ensure_future(c.wait_for_rv(FAR, 60)) for _ in range(100)]
        await asyncio.sleep(0)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return len(c._waiters)

    assert asyncio.run(go()) == 0


def test_waits_are_woken_when_their_rv_is_reached_and_not_before() -> None:
    async def go() -> int:
        c = cacher_at(10)
        tasks = {rv: asyncio.ensure_future(c.wait_for_rv(rv, 5)) for rv in (14, 12, 13, 11, FAR)}
        await asyncio.sleep(0)
        c.apply([(ADDED, pod("a", rv=12))])
        assert await asyncio.wait_for(asyncio.gather(tasks[11], tasks[12]), 1) == [True, True]
        assert not tasks[13].done() and not tasks[14].done()
        c.progress(14)
        assert await asyncio.wait_for(asyncio.gather(tasks[13], tasks[14]), 1) == [True, True]
        assert not tasks[FAR].done()
        tasks[FAR].cancel()
        await asyncio.gather(tasks[FAR], return_exceptions=True)
        return len(c._waiters)

    assert asyncio.run(go()) == 0


def test_stop_ends_every_wait_with_false() -> None:
    async def go() -> tuple[list[bool], int]:
        c = cacher_at(10)
        tasks = [asyncio.ensure_future(c.wait_for_rv(FAR, 60)) for _ in range(3)]
        await asyncio.sleep(0)
        c.stop()
        results = await asyncio.wait_for(asyncio.gather(*tasks), 1)
        return results, len(c._waiters)

    results, left = asyncio.run(go())
    assert results == [False, False, False]
    assert left == 0
