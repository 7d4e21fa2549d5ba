"""Watch delivery's metric families: the flush passes' writes and frames, and the process-wide watch budget.

Read at scrape time from ``FlushScheduler``'s and ``WatchBudget``'s plain counters (one
observation per flush pass, never per event).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from watchcache.watchers.budget import WatchBudget
from watchcache.watchers.flush import FlushScheduler

__all__ = ["DeliveryCollector"]


class DeliveryCollector(Collector):
    """Writes and frames per flush pass (coalescing), and the unsent bytes of all watchers against the budget."""

    def __init__(self, flusher: FlushScheduler, budget: WatchBudget | None = None) -> None:
        self.flusher = flusher
        # None without --max-watch-buffer-total-bytes: no budget families.
        self.budget = budget

    def collect(self) -> Iterator[Metric]:
        budget = self.budget
        if budget is not None:
            yield GaugeMetricFamily(
                "watchcache_watch_budget_bytes",
                "Unsent watch bytes counted against --max-watch-buffer-total-bytes",
                value=budget.pending,
            )
            yield CounterMetricFamily(
                "watchcache_watch_budget_lagged",
                "Watchers sent to catch up from history because all watchers' unsent bytes exceeded the budget",
                value=budget.shed,
            )
        flusher = self.flusher
        yield CounterMetricFamily(
            "watchcache_watch_writes",
            "Writes to watch connections (one per watcher with frames pending, per flush pass)",
            value=flusher.writes,
        )
        yield CounterMetricFamily(
            "watchcache_watch_frames_written",
            "Watch frames (events and bookmarks) carried by those writes",
            value=flusher.frames,
        )
        hist = flusher.frames_per_write
        yield HistogramMetricFamily(
            "watchcache_watch_frames_per_write",
            "Frames per write, one observation per flush pass (its frames over its writes): "
            "coalescing, see --watch-flush-interval",
            buckets=hist.cumulative(),
            sum_value=hist.sum,
        )
