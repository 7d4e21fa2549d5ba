"""What isolating each watcher's flush and delivery, and each replica's feed, costs on the happy path.

Each failure on one output path is caught where it happens (``FlushScheduler._flush_all``,
``WatcherGroup.deliver``, ``Cacher.apply``) so that it ends only the watcher or follower stream
concerned. In CPython 3.11 a ``try`` costs nothing until it catches; this measures the real
functions against the same loops without the ``try`` (their code before the change), with
trivial streams, watchers and replicas so that the loop itself is what is timed::

    .venv/bin/python -m loadtest.bench.isolation

Prints ns per stream / watcher / replica for both; the difference is the cost of isolation.
"""

from __future__ import annotations

import asyncio
import timeit
from collections.abc import Callable

from harness.doubles import NullSink
from watchcache.cache.events import MODIFIED, WatchEvent
from watchcache.cache.object import encode_object
from watchcache.cache.predicate import SelectionPredicate
from watchcache.dispatch.cacher import Cacher
from watchcache.dispatch.dispatcher import WatcherGroup, group_key
from watchcache.resources import PODS
from watchcache.watchers.flush import FlushScheduler
from watchcache.watchers.watcher import Watcher

N = 1000
REPEAT = 9


class Stream:
    __slots__ = ()

    def flush(self) -> int:
        return 0

    def flush_failed(self, error: Exception) -> None:
        pass


class Replica:
    __slots__ = ()

    def on_events(self, events: list[WatchEvent]) -> None:
        pass

    def on_progress(self, rv: int) -> None:
        pass

    def on_relist(self, events: list[WatchEvent], rv: int) -> None:
        pass

    def cut(self, why: str) -> None:
        pass


def best(fn: Callable[[], object], number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=REPEAT)) / number


def flush_pass() -> tuple[float, float]:
    loop = asyncio.new_event_loop()
    scheduler = FlushScheduler(loop)
    streams = [Stream() for _ in range(N)]

    def isolated() -> None:
        scheduler._dirty = list(streams)
        scheduler._flush_all()

    def bare() -> None:  # _flush_all before isolation
        dirty = list(streams)
        scheduler._dirty = []
        scheduler._scheduled = False
        for stream in dirty:
            stream.flush()
        scheduler.flushes += len(dirty)

    result = best(isolated, 200) / N, best(bare, 200) / N
    loop.close()
    return result


def group_deliver() -> tuple[float, float]:
    predicate = SelectionPredicate.parse(PODS, None, "", "")
    group = WatcherGroup(group_key(predicate), predicate)
    for _ in range(N):
        group.watchers[Watcher(PODS, predicate, 0, NullSink(), max_pending_bytes=1 << 40)] = None
    obj = encode_object(PODS, {"metadata": {"name": "p", "namespace": "ns", "resourceVersion": "5"}})
    event = WatchEvent(PODS, MODIFIED, obj, obj, 5, 0.0)
    frame = event.frame(MODIFIED)

    def reset() -> None:
        for watcher in group.watchers:
            watcher.pending, watcher.pending_rv, watcher.pending_n = [], [], []
            watcher.pending_bytes = 0

    def isolated() -> None:
        group.frames, group.events = [frame], [event]
        group.deliver(lambda w: None)
        reset()

    def bare() -> None:  # WatcherGroup.deliver before isolation
        frames, events = [frame], [event]
        group.frames, group.events = [], []
        count = len(frames)
        blob = frames[0] if count == 1 else b"".join(frames)
        delivered = 0
        for watcher in group.watchers:
            delivered += watcher.deliver_batch(blob, count, events)
        reset()

    return best(isolated, 100) / N, best(bare, 100) / N


def replica_feed() -> tuple[float, float]:
    async def make() -> Cacher:
        return Cacher(PODS)

    cacher = asyncio.run(make())
    cacher.replicas = [Replica() for _ in range(N)]
    cacher.cache.replace([], 1)
    cacher.dispatcher.dispatch = lambda events: None  # type: ignore[method-assign]
    events: list[WatchEvent] = []
    cacher.cache.apply = lambda changes: events  # type: ignore[method-assign]

    def isolated() -> None:  # Cacher.apply with nothing to apply: the replica loop is what is timed
        cacher.apply(())

    def bare() -> None:  # Cacher.apply before isolation
        events = cacher.cache.apply(())
        cacher.events_received += len(events)
        for replica in cacher.replicas:
            replica.on_events(events)
        cacher.dispatcher.dispatch(events)
        cacher._wake_waiters()

    return best(isolated, 200) / N, best(bare, 200) / N


def main() -> None:
    print(f"{'path':<28}{'isolated':>12}{'bare':>12}   (ns per item, best of {REPEAT}, {N} items)")
    for name, measure in (
        ("flush pass, per stream", flush_pass),
        ("group deliver, per watcher", group_deliver),
        ("replica feed, per replica", replica_feed),
    ):
        isolated, bare = measure()
        print(f"{name:<28}{isolated * 1e9:>12.1f}{bare * 1e9:>12.1f}")


if __name__ == "__main__":
    main()
