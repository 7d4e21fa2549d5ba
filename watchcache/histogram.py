"""A histogram in plain numbers: observed on a hot path for the price of a bisect and two additions,
exported at scrape time by a package's metrics module (see ``watchcache/metrics.py``: no component
touches prometheus-client).

A subclass names its buckets (``BOUNDS``, upper bounds, inclusive as Prometheus' ``le``) and says why
they are those; ``cumulative()`` gives them as a ``HistogramMetricFamily`` takes them.
"""

from __future__ import annotations

import bisect


class PlainHistogram:
    BOUNDS: tuple[float, ...] = ()

    __slots__ = ("count", "counts", "sum")

    def __init__(self) -> None:
        # counts[i]: observations <= BOUNDS[i] and > BOUNDS[i-1]; the last one: > BOUNDS[-1].
        self.counts = [0] * (len(self.BOUNDS) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.BOUNDS, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, cumulative count) pairs, ``+Inf`` last, as Prometheus histograms are written."""
        out, total = [], 0
        for bound, n in zip((*map(str, self.BOUNDS), "+Inf"), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out
