"""watchers/metrics.py: flush writes, frames per write and the watch budget, from a real scheduler and budget."""

from __future__ import annotations

import asyncio

from tests.support.collectors import k, scrape
from watchcache.watchers.budget import WatchBudget
from watchcache.watchers.flush import FlushScheduler
from watchcache.watchers.metrics import DeliveryCollector


def test_delivery_writes_frames_per_write_and_the_budget() -> None:
    loop = asyncio.new_event_loop()
    try:
        flusher = FlushScheduler(loop)
        flusher.writes, flusher.frames = 4, 25  # as a flush pass counts them
        for frames_per_write in (1, 3, 3, 18):
            flusher.frames_per_write.observe(frames_per_write)
        budget = WatchBudget(1 << 20, flusher)
        budget.pending, budget.shed = 3000, 2  # as watchers report their unsent bytes, and enforce() sheds

        samples, types = scrape(DeliveryCollector(flusher, budget))
    finally:
        loop.close()

    assert samples[k("watchcache_watch_writes_total")] == 4
    assert samples[k("watchcache_watch_frames_written_total")] == 25
    assert samples[k("watchcache_watch_budget_bytes")] == 3000
    assert samples[k("watchcache_watch_budget_lagged_total")] == 2
    hist = "watchcache_watch_frames_per_write"
    assert types[hist] == "histogram"
    assert samples[k(f"{hist}_bucket", le="1.0")] == 1
    assert samples[k(f"{hist}_bucket", le="2.0")] == 1
    assert samples[k(f"{hist}_bucket", le="4.0")] == 3
    assert samples[k(f"{hist}_bucket", le="16.0")] == 3
    assert samples[k(f"{hist}_bucket", le="32.0")] == 4
    assert samples[k(f"{hist}_bucket", le="+Inf")] == 4
    assert samples[(f"{hist}_count", ())] == 4
    assert samples[(f"{hist}_sum", ())] == 25


def test_without_a_budget_there_is_no_budget_family() -> None:
    loop = asyncio.new_event_loop()
    try:
        samples, types = scrape(DeliveryCollector(FlushScheduler(loop)))
    finally:
        loop.close()
    assert "watchcache_watch_budget_bytes" not in types and "watchcache_watch_budget_lagged" not in types
    assert samples[k("watchcache_watch_writes_total")] == 0
