"""The plain histogram both the backfill durations and the frames per write are."""

from __future__ import annotations

from watchcache.dispatch.backfill import Durations
from watchcache.histogram import PlainHistogram
from watchcache.watchers.flush import FramesPerWrite


class Three(PlainHistogram):
    BOUNDS = (1.0, 2.0, 3.0)


def test_buckets_are_upper_bounds_inclusive_and_cumulative() -> None:
    h = Three()
    for value in (0.5, 1.0, 1.5, 3.0, 7.0):
        h.observe(value)
    assert h.cumulative() == [("1.0", 2), ("2.0", 3), ("3.0", 4), ("+Inf", 5)]
    assert (h.count, h.sum) == (5, 13.0)


def test_each_kind_keeps_its_own_buckets() -> None:
    durations, frames = Durations(), FramesPerWrite()
    durations.observe(0.2)
    frames.observe(3)
    assert [le for le, _ in durations.cumulative()][:2] == ["0.1", "0.25"]
    assert dict(durations.cumulative())["0.25"] == 1
    assert dict(frames.cumulative())["4.0"] == 1 and dict(frames.cumulative())["2.0"] == 0
