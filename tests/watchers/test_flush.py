"""FlushScheduler: one pass per loop iteration, or at most one per ``interval``."""

from __future__ import annotations

import asyncio

from tests.server.harness import arun
from watchcache.watchers.flush import FlushScheduler


class Stream:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.flushed_at: list[float] = []

    def flush(self) -> None:
        self.flushed_at.append(self.loop.time())


@arun
async def test_marks_in_one_loop_step_share_one_pass():
    loop = asyncio.get_running_loop()
    f = FlushScheduler(loop)
    s = Stream(loop)
    f.mark(s)
    f.mark(s)
    await asyncio.sleep(0)
    assert len(s.flushed_at) == 2 and f.flushes == 2  # both marks, in one pass
    f.mark(s)
    await asyncio.sleep(0)
    assert len(s.flushed_at) == 3  # no interval: the next pass at once


@arun
async def test_with_an_interval_the_first_mark_flushes_at_once_and_later_ones_wait():
    loop = asyncio.get_running_loop()
    f = FlushScheduler(loop, interval=0.3)
    s = Stream(loop)
    t0 = loop.time()
    f.mark(s)
    await asyncio.sleep(0)
    assert len(s.flushed_at) == 1 and s.flushed_at[0] - t0 < 0.2
    # Three marks soon after: held until the interval has passed, then one pass for all.
    for _ in range(3):
        f.mark(s)
        await asyncio.sleep(0)
    assert len(s.flushed_at) == 1
    await asyncio.sleep(0.4)
    assert len(s.flushed_at) == 4
    assert s.flushed_at[1] - s.flushed_at[0] >= 0.3 - 1e-3
    assert s.flushed_at[3] - s.flushed_at[1] < 0.01  # one pass
    # After a quiet spell longer than the interval: at once again.
    await asyncio.sleep(0.35)
    t1 = loop.time()
    f.mark(s)
    await asyncio.sleep(0)
    assert len(s.flushed_at) == 5 and s.flushed_at[4] - t1 < 0.2


@arun
async def test_paused_scheduler_holds_marks_until_resumed():
    loop = asyncio.get_running_loop()
    f = FlushScheduler(loop, interval=0.01)
    s = Stream(loop)
    f.pause()
    f.mark(s)
    await asyncio.sleep(0.03)
    assert s.flushed_at == []
    f.resume()
    await asyncio.sleep(0.02)
    assert len(s.flushed_at) == 1
