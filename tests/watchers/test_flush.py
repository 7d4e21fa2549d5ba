"""FlushScheduler: one pass per loop iteration, or at most one per ``interval``."""

from __future__ import annotations

import asyncio

from harness.waiting import until
from tests.support.handlers import arun
from watchcache.watchers.flush import FlushScheduler, FramesPerWrite


class Stream:
    def __init__(self, loop: asyncio.AbstractEventLoop, frames: int = 1) -> None:
        self.loop = loop
        self.frames = frames
        self.flushed_at: list[float] = []

    def flush(self) -> int:
        self.flushed_at.append(self.loop.time())
        return self.frames


@arun
async def test_a_pass_counts_its_writes_and_observes_its_frames_per_write_once():
    loop = asyncio.get_running_loop()
    f = FlushScheduler(loop)
    for frames in (2, 4, 0):  # the last one had nothing to write (e.g. paused by its client)
        f.mark(Stream(loop, frames))
    await asyncio.sleep(0)
    assert (f.flushes, f.writes, f.frames) == (3, 2, 6)
    hist = f.frames_per_write
    assert hist.count == 1 and hist.sum == 3.0  # one observation per pass: 6 frames / 2 writes
    f.mark(Stream(loop, 40))
    await asyncio.sleep(0)
    assert (f.writes, f.frames) == (3, 46)
    assert dict(hist.cumulative()) == {
        "1.0": 0, "2.0": 0, "4.0": 1, "8.0": 1, "16.0": 1, "32.0": 1, "64.0": 2,
        "128.0": 2, "256.0": 2, "512.0": 2, "1024.0": 2, "+Inf": 2,
    }  # fmt: skip


def test_frames_per_write_buckets_are_upper_bounds_inclusive():
    hist = FramesPerWrite()
    for value in (1, 1.5, 2, 1025):
        hist.observe(value)
    cumulative = dict(hist.cumulative())
    assert cumulative["1.0"] == 1 and cumulative["2.0"] == 3 and cumulative["1024.0"] == 3 and cumulative["+Inf"] == 4
    assert hist.sum == 1029.5


@arun
async def test_a_pass_without_writes_observes_nothing():
    loop = asyncio.get_running_loop()
    f = FlushScheduler(loop)
    f.mark(Stream(loop, 0))
    await asyncio.sleep(0)
    assert f.flushes == 1 and f.writes == 0 and f.frames_per_write.count == 0


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
    await until(lambda: f.idle)
    assert len(s.flushed_at) == 1


class Failing(Stream):
    """A stream whose flush raises (a bug in one watcher's path); records how it was ended."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.failed: list[BaseException] = []

    def flush(self) -> None:
        super().flush()
        raise RuntimeError("boom")

    def flush_failed(self, error: BaseException) -> None:
        self.failed.append(error)


@arun
async def test_one_failing_flush_does_not_stop_the_pass_for_the_others():
    loop = asyncio.get_running_loop()
    f = FlushScheduler(loop)
    before, after = Stream(loop), Stream(loop)
    bad = Failing(loop)
    for s in (before, bad, after):
        f.mark(s)
    await asyncio.sleep(0)
    # Every stream of the pass was flushed, the failing one was told, and the failure counted.
    assert [len(s.flushed_at) for s in (before, bad, after)] == [1, 1, 1]
    assert [type(e) for e in bad.failed] == [RuntimeError]
    assert f.failures == 1 and f.flushes == 3
    # The scheduler goes on: a later mark gets its pass.
    f.mark(after)
    await asyncio.sleep(0)
    assert len(after.flushed_at) == 2


@arun
async def test_a_stream_that_fails_to_handle_its_failure_does_not_stop_the_pass_either():
    loop = asyncio.get_running_loop()
    f = FlushScheduler(loop)

    class Worse(Failing):
        def flush_failed(self, error: BaseException) -> None:
            raise RuntimeError("worse")

    bad, after = Worse(loop), Stream(loop)
    f.mark(bad)
    f.mark(after)
    await asyncio.sleep(0)
    assert len(after.flushed_at) == 1 and f.failures == 1
