"""Test doubles of the product's protocol seams, for the unit tests and the in-process benchmarks.

A ``Watcher`` calls its ``WatchSink`` (watchers/watcher.py) when it has frames (``wake``), when it
ends (``closed``) and when it drops its buffer (``lagging``); the HTTP layers are the real sinks.
Where a test or a benchmark drives the dispatcher without a socket, one of these stands in:

- ``NullSink``: does nothing; the frames are read with ``watcher.take()``, or not at all (a benchmark
  measuring dispatch, not delivery);
- ``RecordingSink``: counts wakes and lags and records every close reason, for the assertions;
- ``NoLagSink``: fails the test on a lag (a property test whose clients always keep up);
- ``WakeFailsSink``: raises from ``wake``, as a bug on one watcher's path would.

A double with behaviour of its own (a sink that flushes through a ``FlushScheduler``, a stream that
parses frames) stays with the one test that needs it.
"""

from __future__ import annotations

from typing import Any


class NullSink:
    """A watcher's sink that does nothing."""

    def wake(self, watcher: Any) -> None:
        pass

    def closed(self, watcher: Any, reason: str) -> None:
        pass

    def lagging(self, watcher: Any) -> None:
        pass


class RecordingSink(NullSink):
    """Counts ``wake`` and ``lagging`` calls; keeps every reason ``closed`` was given, in order."""

    def __init__(self) -> None:
        self.woken = 0
        self.lagged = 0
        self.closed_reasons: list[str] = []

    def wake(self, watcher: Any) -> None:
        self.woken += 1

    def closed(self, watcher: Any, reason: str) -> None:
        self.closed_reasons.append(reason)

    def lagging(self, watcher: Any) -> None:
        self.lagged += 1


class NoLagSink(NullSink):
    """Fails on a lag: for tests whose every client keeps up."""

    def lagging(self, watcher: Any) -> None:
        raise AssertionError("no watcher should lag here")


class WakeFailsSink(RecordingSink):
    """Raises from ``wake``: a bug on this watcher's path, which must not stop the others' fan-out."""

    def wake(self, watcher: Any) -> None:
        raise RuntimeError("a bug on this watcher's path")
