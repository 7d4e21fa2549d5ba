"""Delivery latency of watch events: from the moment a writer sent a change to the moment a
watcher read the event carrying it.

The writer stamps ``time.time()`` into an annotation just before it sends a create or update
(``WRITTEN_AT``), so the latency of ADDED and MODIFIED events is read off the object itself and
works across processes on one clock. A DELETED event carries the object as it was before the
delete, with the stamp of its previous write, so the writer notes the time it sent each DELETE in
a ``DeleteClock`` shared by the users of one locust process; a DELETED event whose delete was sent
by another process has no latency (reported as ``None``: counted, never averaged).

What the figure includes: the write's request to the upstream (through the proxy when writes pass
through it), the upstream's commit and its watch to the proxy, the proxy's dispatch and flush, the
client's read and JSON parse, and any wait of the watching greenlet for the CPU. It is the
end-to-end freshness a client sees, not the proxy's cost alone.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

WRITTEN_AT = "loadtest.watchcache.io/written-at"
WRITER_LABEL = "loadtest.watchcache.io/writer"


def stamp() -> str:
    """The value of ``WRITTEN_AT`` for a write about to be sent."""
    return repr(time.time())


def written_at(obj: Mapping[str, Any]) -> float | None:
    annotations = obj.get("metadata", {}).get("annotations") or {}
    value = annotations.get(WRITTEN_AT)
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return None


class DeleteClock:
    """When each DELETE was sent, by (namespace, name): bounded, oldest forgotten first."""

    def __init__(self, capacity: int = 50_000) -> None:
        self.capacity = capacity
        self._sent: OrderedDict[tuple[str, str], float] = OrderedDict()

    def sent(self, namespace: str, name: str, at: float) -> None:
        self._sent[(namespace, name)] = at
        self._sent.move_to_end((namespace, name))
        while len(self._sent) > self.capacity:
            self._sent.popitem(last=False)

    def when(self, namespace: str, name: str) -> float | None:
        # Not popped: every watcher of the object needs it.
        return self._sent.get((namespace, name))


class LatencySamples:
    """Exact delivery latencies in ms per event type (locust rounds below 100 ms to whole ms).

    Bounded: past ``capacity`` samples per type, every other sample is dropped and the keep rate
    halves, an even decimation that keeps the distribution's shape.
    """

    def __init__(self, capacity: int = 200_000) -> None:
        self.capacity = capacity
        self._samples: dict[str, list[float]] = {}
        self._stride: dict[str, int] = {}
        self._seen: dict[str, int] = {}

    def add(self, kind: str, ms: float) -> None:
        seen = self._seen.get(kind, 0)
        self._seen[kind] = seen + 1
        stride = self._stride.setdefault(kind, 1)
        if seen % stride:
            return
        samples = self._samples.setdefault(kind, [])
        samples.append(ms)
        if len(samples) >= self.capacity:
            del samples[1::2]
            self._stride[kind] = stride * 2

    def summary(self) -> dict[str, dict[str, float]]:
        """Per kind, plus ``all`` (live deliveries) and ``replayed`` (kinds ending "(replayed)")."""
        out = {kind: {**percentiles(values), "count": self._seen[kind]} for kind, values in self._samples.items()}
        for group, replayed in (("all", False), ("replayed", True)):
            kinds = [k for k in self._samples if k.endswith("(replayed)") == replayed]
            values = [v for k in kinds for v in self._samples[k]]
            if values:
                out[group] = {**percentiles(values), "count": sum(self._seen[k] for k in kinds)}
        return out


def percentiles(values: Iterable[float], points: tuple[float, ...] = (0.5, 0.95, 0.99)) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {}
    out = {f"p{round(p * 100)}": ordered[min(len(ordered) - 1, math.ceil(p * len(ordered)) - 1)] for p in points}
    out["max"] = ordered[-1]
    out["mean"] = sum(ordered) / len(ordered)
    return out
