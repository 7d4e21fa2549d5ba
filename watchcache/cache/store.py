"""The revisioned cache of one resource type (kube's ``watchCache``), free of I/O.

It takes an ordered stream: ``replace`` (a full list at an rv), ``apply`` (a batch of
changes, one atomic group per rv) and ``progress`` (the upstream has nothing before
rv: a bookmark). From that it keeps the current objects in key order and a
``HistoryWindow``, and answers reads *at an exact resourceVersion* anywhere inside the
window by undoing the events after it (MVCC without copying the state).

Concurrency contract: single-threaded. Readers take a ``Snapshot`` and use it before
the next mutation (every read in the server is built synchronously, so it never
straddles an ``apply``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from sortedcontainers import SortedDict

from watchcache.cache.events import ADDED, DELETED, MODIFIED, WatchEvent
from watchcache.cache.history import HistoryWindow
from watchcache.cache.object import CachedObject
from watchcache.resources import ResourceType


@dataclass(frozen=True)
class CacheConfig:
    """History bounds. Both apply: whichever is hit first evicts.

    ``history_max_age`` is etcd's default compaction interval (5 min), so a client that
    could resume against the upstream can resume against us. ``history_max_events``
    caps memory under heavy churn: each retained event pins an old object version
    (~3 KB for a pod), so 50,000 events is ~150 MB at worst.
    """

    history_max_events: int = 50_000
    history_max_age: float = 300.0


class ResourceVersionTooOld(Exception):
    def __init__(self, requested: int, oldest: int) -> None:
        super().__init__(f"too old resource version: {requested} ({oldest})")
        self.requested = requested
        self.oldest = oldest


class ResourceVersionTooNew(Exception):
    def __init__(self, requested: int, current: int) -> None:
        super().__init__(f"Too large resource version: {requested}, current: {current}")
        self.requested = requested
        self.current = current


class ResourceVersionOrderError(ValueError):
    """The feed broke the stream contract (an rv going backwards or splitting a group)."""


@dataclass(frozen=True)
class CacheStats:
    objects: int
    object_bytes: int
    history_events: int
    history_bytes: int
    oldest_rv: int
    rv: int


class ResourceCache:
    # _objects: key -> CachedObject, the state at ``rv``. Invariant: for every event e in
    # history, the state at e.rv contains e.object (unless DELETED) — i.e. history and
    # state agree, so undoing the events after r yields the state at r.
    def __init__(self, resource: ResourceType, config: CacheConfig, clock: Callable[[], float]) -> None:
        self.resource = resource
        self.config = config
        self._clock = clock
        self._objects: SortedDict = SortedDict()
        self._object_bytes = 0
        self.rv = 0
        self.initialized = False
        self.history = HistoryWindow(config.history_max_events, config.history_max_age)
        # The rv of a relist's multi-event group (see ``relist``); None otherwise.
        self.unresumable_rv: int | None = None

    def __len__(self) -> int:
        return len(self._objects)

    # ------------------------------------------------------------------ input stream

    def replace(self, objects: Iterable[CachedObject], rv: int) -> None:
        """Start over from a full list at ``rv``; history restarts there too."""
        self._objects = SortedDict((o.key, o) for o in objects)
        self._object_bytes = sum(len(o.body) for o in self._objects.values())
        self.rv = rv
        self.history.reset(rv)
        self.unresumable_rv = None
        self.initialized = True

    def apply(self, changes: Sequence[tuple[str, CachedObject]]) -> list[WatchEvent]:
        """Apply one batch of (type, object) changes; returns the events recorded.

        The first change's rv must be greater than ``rv`` and the rest non-decreasing,
        so that a group of events sharing an rv is always applied (and seen) whole.
        """
        if not changes:
            return []
        last = self.rv
        for i, (_, obj) in enumerate(changes):
            if obj.rv < last or (i == 0 and obj.rv == last):
                raise ResourceVersionOrderError(f"{self.resource.qualified}: rv {obj.rv} after {last}")
            last = obj.rv
        now = self._clock()
        events: list[WatchEvent] = []
        objects = self._objects
        for kind, obj in changes:
            prev = objects.get(obj.key)
            if kind == DELETED:
                if prev is not None:
                    del objects[obj.key]
                    self._object_bytes -= len(prev.body)
                event_type = DELETED
            else:
                objects[obj.key] = obj
                self._object_bytes += len(obj.body) - (len(prev.body) if prev is not None else 0)
                event_type = ADDED if prev is None else MODIFIED
            event = WatchEvent(self.resource, event_type, obj, prev, obj.rv, now)
            self.history.append(event)
            events.append(event)
        self.rv = last
        return events

    def relist(self, objects: Iterable[CachedObject], rv: int) -> list[WatchEvent]:
        """Replace the state with a fresh list at ``rv`` and return the difference as events.

        Used after the upstream answered 410 to a resumed watch: instead of ending every
        client watch (kube-apiserver's behaviour), the change from the old state to the
        new one is delivered as ordinary events, all at ``rv`` (one atomic group): ADDED
        and MODIFIED carry the listed objects in the order of their own resourceVersions,
        then DELETED the last known state stamped with ``rv``. History restarts at ``rv``:
        what happened between the old rv and ``rv`` is unknown, so no read or watch start
        inside that gap can be served exactly.
        """
        if rv < self.rv:
            raise ResourceVersionOrderError(f"{self.resource.qualified}: relist at {rv} after {self.rv}")
        now = self._clock()
        fresh = SortedDict((o.key, o) for o in objects)
        old = self._objects
        events: list[WatchEvent] = []
        for key, obj in fresh.items():
            prev = old.get(key)
            if prev is None:
                events.append(WatchEvent(self.resource, ADDED, obj, None, rv, now))
            elif prev.rv != obj.rv or prev.body != obj.body:
                events.append(WatchEvent(self.resource, MODIFIED, obj, prev, rv, now))
        # In the order of the objects' own resourceVersions, so a client tracking the last rv
        # it saw never goes backwards; deletions (stamped with rv) come last.
        events.sort(key=lambda e: (e.object.rv, e.object.key))
        for key, prev in old.items():
            if key not in fresh:
                gone = prev.with_resource_version(rv)
                events.append(WatchEvent(self.resource, DELETED, gone, prev, rv, now))
        self._objects = fresh
        self._object_bytes = sum(len(o.body) for o in fresh.values())
        self.rv = rv
        self.history.reset(rv)
        # Several events share rv: a client that got only part of them and resumes from rv
        # would miss the rest, so a resume from exactly rv is refused (410) instead.
        self.unresumable_rv = rv if len(events) > 1 else None
        return events

    def progress(self, rv: int) -> bool:
        """The upstream promises no event at or before ``rv`` is missing; True if rv moved."""
        if rv > self.rv:
            self.rv = rv
            return True
        return False

    def expire(self) -> int:
        return self.history.expire(self._clock())

    # ------------------------------------------------------------------ reads

    @property
    def oldest_rv(self) -> int:
        return self.history.oldest_rv

    def get(self, key: str) -> CachedObject | None:
        return self._objects.get(key)

    def snapshot(self, rv: int | None = None) -> Snapshot:
        """The state at ``rv`` (default: current). Raises TooOld/TooNew outside the window."""
        if rv is None or rv == self.rv:
            return Snapshot(self._objects, {}, self.rv)
        if rv > self.rv:
            raise ResourceVersionTooNew(rv, self.rv)
        if rv < self.history.oldest_rv:
            raise ResourceVersionTooOld(rv, self.history.oldest_rv)
        overlay: dict[str, CachedObject | None] = {}
        for event in self.history.since(rv):
            # The first event after rv for a key holds that key's state at rv in ``prev``.
            if event.object.key not in overlay:
                overlay[event.object.key] = event.prev
        return Snapshot(self._objects, overlay, rv)

    def events_since(self, rv: int) -> list[WatchEvent]:
        """Events after ``rv`` for a watch resuming there; TooOld if the window moved past it."""
        if rv < self.history.oldest_rv or rv == self.unresumable_rv:
            raise ResourceVersionTooOld(rv, self.history.oldest_rv)
        if rv >= self.rv:
            return []
        return self.history.since(rv)

    def stats(self) -> CacheStats:
        return CacheStats(
            len(self._objects), self._object_bytes, len(self.history), self.history.bytes, self.oldest_rv, self.rv
        )


class Snapshot:
    """A read view at ``rv``: the live state with an overlay of undone keys.

    Valid only until the cache next changes (use it synchronously).
    """

    __slots__ = ("_objects", "_overlay", "_overlay_keys", "rv")

    def __init__(self, objects: SortedDict, overlay: dict[str, CachedObject | None], rv: int) -> None:
        self._objects = objects
        self._overlay = overlay
        self._overlay_keys = sorted(overlay) if overlay else []
        self.rv = rv

    def get(self, key: str) -> CachedObject | None:
        if key in self._overlay:
            return self._overlay[key]
        return self._objects.get(key)

    def iter_range(self, lo: str, hi: str | None) -> Iterator[CachedObject]:
        """Objects with ``lo <= key < hi`` (``hi=None``: to the end), in key order."""
        live = self._objects.irange(lo, hi, inclusive=(True, False))
        if not self._overlay_keys:
            objects = self._objects
            for key in live:
                yield objects[key]
            return
        yield from self._merged(live, lo, hi)

    def _merged(self, live: Iterator[str], lo: str, hi: str | None) -> Iterator[CachedObject]:
        from bisect import bisect_left

        keys = self._overlay_keys
        i = bisect_left(keys, lo)
        end = len(keys) if hi is None else bisect_left(keys, hi)
        overlay = self._overlay
        objects = self._objects
        next_live = next(live, None)
        while next_live is not None or i < end:
            if i < end and (next_live is None or keys[i] <= next_live):
                key = keys[i]
                i += 1
                if key == next_live:
                    next_live = next(live, None)
                obj = overlay[key]
                if obj is not None:
                    yield obj
            else:
                assert next_live is not None
                key = next_live
                next_live = next(live, None)
                if key not in overlay:
                    yield objects[key]

    def count_range(self, lo: str, hi: str | None) -> int:
        """How many objects have ``lo <= key < hi``: O(log n + overlay), for remainingItemCount."""
        objects = self._objects
        count = (
            objects.bisect_left(hi) - objects.bisect_left(lo)
            if hi is not None
            else len(objects) - objects.bisect_left(lo)
        )
        for key, obj in self._overlay.items():
            if key >= lo and (hi is None or key < hi):
                count += (obj is not None) - (key in objects)
        return int(count)
