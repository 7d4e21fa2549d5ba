"""Smoke run of loadtest/bench/coldpath.py: every event reaches its node's watcher, warm and cold."""

from __future__ import annotations

import asyncio

from loadtest.bench.coldpath import measure


def test_coldpath_delivers_every_event_to_its_node_and_measures_each_point() -> None:
    result = asyncio.run(measure(watchers=20, pods=200, events=50, flush_mb=[0, 1]))
    assert set(result) == {"flush 0 MB", "flush 1 MB"}
    assert all(v > 0 for v in result.values())
