"""Coalesced delivery: one write per watcher per event-loop pass, whatever the event count.

A ``transport.write`` costs ~5 µs, 90% of it in the kernel (docs/lab/performance-notebook.md, design
figures), so writing each event separately caps fan-out at ~0.2 M deliveries/s per core; joining what is
pending for a watcher into one write reaches 2–3 M/s. Dispatch only appends shared frame
bytes and marks the watcher dirty; the first mark in a loop pass schedules one
``flush`` with ``call_soon``, which runs after the current batch of events.

With ``interval`` > 0 a pass starts no sooner than ``interval`` seconds after the
previous one ended: the first event after a quiet spell is still written at once, but
events closer together share a write. Writes are the cost at moderate rates (~12 µs each with
1,000 connections, whatever their size), so this trades up to ``interval`` of latency
for fewer writes; 0 (the default) flushes on every loop pass.

Pacing (``pacing`` k > 0; ``serve`` sets k = 6, ``max_delay`` 100 ms): a pass also starts no
sooner than k times the CPU time the previous pass took after that pass ended, and never more than
``max_delay`` after it. The wait follows what writing costs, so only costly passes make the next
one wait: a pass that wrote one kubelet's watch took tens of microseconds and the next follows at
once (waits under a millisecond are not taken: a timer costs more than they save), while a
broadcast pass over 1,000 TLS watches takes milliseconds — one ``SSL_write`` and one ``send`` per
watch, most of a worker's fan-out CPU (docs/performance.md) — and the next waits for more events
to share those writes. Flush passes then take at most 1/(1+k) of the loop's time until the cap
binds, and an event waits at most ``max_delay`` plus two passes. The first event after a quiet
spell (longer than the wait) is written at once, and so is a backlog (a stream marked again during
a pass, its write cut at ``FLUSH_BYTES``): its writes are large already, and waiting would only
slow it. A pass's cost is the CPU its thread spent (``time.thread_time``), not its wall time: on a
busy machine a pass preempted for a scheduler slice would otherwise look milliseconds long and hold
the next event k times that (two CPU hogs on two cores, an event's added latency through the proxy,
three alternating runs: p50 13–21 ms, max 55–141 ms paced by wall time; 1.8–5.3, 36–50 by CPU
time; docs/performance.md). The CPU clock is a system call (~0.6 µs): read as a pass starts, and
as it ends only when its wall time could make a wait worth a timer; never without pacing. Times of
day come from ``time.perf_counter``: uvloop's clock (``loop.time``) counts whole milliseconds,
which would make a 20 µs pass look like 1 ms.

Coalescing is visible to operators: each pass counts the writes it made and the frames they
carried (plain integers; ``watchcache_watch_writes_total``, and ``watchcache_watch_frames_per_write``
observed once per pass with the pass's frames over its writes), which is what
``--watch-flush-interval`` trades latency for.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from watchcache.histogram import PlainHistogram

log = logging.getLogger("watchcache.watchers.flush")

# The shortest pacing wait worth a timer (uvloop's timers count whole milliseconds): shorter, the
# next pass runs on the next loop iteration, as without pacing.
MIN_WAIT = 0.001


class Flushable(Protocol):
    def flush(self) -> int:
        """Write everything pending for this stream now; the frames written (0: no write)."""

    def flush_failed(self, error: Exception) -> None:
        """``flush`` raised: end this stream (its client resumes); the pass goes on with the others (invariant 11)."""


class FramesPerWrite(PlainHistogram):
    """Frames per write, observed once per flush pass.

    Buckets are powers of two: 1 frame per write means no coalescing; the ceiling's
    10 ms ticks reach tens (docs/lab/performance-notebook.md).
    """

    BOUNDS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0)

    __slots__ = ()


class FlushScheduler:
    """Owned by the event loop thread; one per process is enough."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        interval: float = 0.0,
        pacing: float = 0.0,
        max_delay: float = 0.1,
        clock: Callable[[], float] = time.perf_counter,
        cpu_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self._loop = loop
        # Seconds, fine-grained (a test's simulated clock): the time of day, and this thread's CPU time.
        self._clock = clock
        self._cpu_clock = cpu_clock
        self.interval = interval
        self.pacing = pacing
        self.max_delay = max_delay
        # perf_counter() when the last pass ended, and the CPU it took (pacing's measure of its cost).
        self._last = float("-inf")
        self._took = 0.0
        self._dirty: list[Flushable] = []
        # Run once at the end of the next pass, after every dirty stream was written.
        self._after: list[Callable[[], object]] = []
        self._scheduled = False
        # The pending pass's timer while it waits (pacing or the interval): cancelled to hurry it.
        self._timer: asyncio.TimerHandle | None = None
        self.flushes = 0
        # Writes made (streams that had something to write) and the frames they carried.
        self.writes = 0
        self.frames = 0
        self.frames_per_write = FramesPerWrite()
        # Flushes that raised (each ended its own stream; see _flush_all).
        self.failures = 0
        # Fault injection only (the simulated cluster's "stall"): hold every write.
        self.paused = False

    @property
    def idle(self) -> bool:
        """Nothing marked and no pass scheduled: every frame dispatched so far has been written."""
        return not self._dirty and not self._scheduled

    def mark(self, stream: Flushable) -> None:
        self._dirty.append(stream)
        if not self._scheduled and not self.paused:
            self._schedule()

    def after_pass(self, job: Callable[[], object]) -> None:
        """Run ``job`` at the end of the next flush pass, without a pacing wait (the watch budget's
        enforcement: unsent bytes over the limit are not held for coalescing)."""
        self._after.append(job)
        if self.paused:
            return
        if not self._scheduled:
            self._schedule(paced=False)
        elif self._timer is not None:
            self._timer.cancel()
            self._timer = None
            self._schedule(paced=False)

    def _schedule(self, paced: bool = True) -> None:
        self._scheduled = True
        if self.interval > 0 or self.pacing > 0:
            wait = max(self.interval, min(self.pacing * self._took, self.max_delay) if paced else 0.0)
            delay = self._last + wait - self._clock()
            if delay >= MIN_WAIT or (delay > 0 and self.interval > 0):
                self._timer = self._loop.call_later(delay, self._flush_all)
                return
        self._loop.call_soon(self._flush_all)

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        if self.paused:
            self.paused = False
            if (self._dirty or self._after) and not self._scheduled:
                self._schedule()

    def _flush_all(self) -> None:
        self._timer = None
        clock = self._clock
        start = clock()
        cpu = self._cpu_clock() if self.pacing > 0 else 0.0
        # Still "scheduled" while the pass runs: streams marked meanwhile wait for the next pass.
        try:
            self._pass()
        finally:
            # From the end of the pass: with many watchers a pass itself can outlast the interval.
            self._last = end = clock()
            took = end - start
            # CPU time never exceeds wall time: a pass too short in wall time to pace needs no CPU reading.
            self._took = took if took * self.pacing < MIN_WAIT else min(took, self._cpu_clock() - cpu)
            self._scheduled = False
            if (self._dirty or self._after) and not self.paused:
                # Marked during the pass: a backlog (a write cut at FLUSH_BYTES, a lagging watcher's
                # next step, a job after the pass). Its writes are large already: no pacing wait, which
                # would only cut its throughput.
                self._schedule(paced=False)

    def _pass(self) -> None:
        dirty = self._dirty
        self._dirty = []
        writes = frames = 0
        for stream in dirty:
            # One stream's failure must not hold back the streams after it in the pass: they would keep
            # their frames until they overflow. A try costs nothing until it catches in CPython 3.11
            # (loadtest/bench/isolation.py: ~30 ns per stream with or without it).
            try:
                n = stream.flush()
            except Exception as e:
                self._failed(stream, e)
                continue
            if n:
                writes += 1
                frames += n
        self.flushes += len(dirty)
        if writes:
            self.writes += writes
            self.frames += frames
            self.frames_per_write.observe(frames / writes)
        if self._after:
            jobs, self._after = self._after, []
            for job in jobs:
                try:
                    job()
                except Exception:
                    log.exception("a job after the flush pass failed")

    def _failed(self, stream: Flushable, error: Exception) -> None:
        self.failures += 1
        log.error("a watch stream failed to flush; ending it", exc_info=error)
        try:
            stream.flush_failed(error)
        except Exception:
            log.exception("ending a watch stream that failed to flush failed too")
