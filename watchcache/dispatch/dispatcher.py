"""Fan-out of one resource's events to its watchers, without scanning all of them.

Watchers are indexed as kube's cacher does (``IndexerFuncs`` + ``watchersBuffer``):

* by the resource's *trigger* field when the watcher's field selector pins it
  (kubelets watch pods with ``spec.nodeName=<node>``; configmap/secret watches often
  pin ``metadata.name``): an event reaches them only through the values of that field
  in the new and the previous object;
* else by namespace for namespaced watches;
* else in ``cluster_wide``, which sees every event.

So an event costs O(matching watchers), not O(all watchers): 10,000 kubelet-style
watchers cost two dict lookups per pod event.

Invariant: a watcher is in exactly one index bucket from ``add`` until ``remove``.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable

from watchcache.cache.events import WatchEvent, bookmark_frame
from watchcache.resources import ResourceType
from watchcache.watchers.watcher import Watcher


class Dispatcher:
    def __init__(self, resource: ResourceType) -> None:
        self.resource = resource
        self.trigger = resource.trigger_field
        self.by_trigger: dict[str, set[Watcher]] = {}
        self.by_namespace: dict[str, set[Watcher]] = {}
        self.cluster_wide: set[Watcher] = set()
        # watcher -> (index it is in, or None for cluster_wide; its key there)
        self._bucket: dict[Watcher, tuple[dict[str, set[Watcher]] | None, str]] = {}
        # (due, seq, watcher) for watchers that asked for bookmarks; stale entries are skipped.
        self._bookmarks: list[tuple[float, int, Watcher]] = []
        self._seq = itertools.count()
        self.events_dispatched = 0

    def __len__(self) -> int:
        return len(self._bucket)

    def add(self, watcher: Watcher, now: float) -> None:
        trigger_value = watcher.predicate.exact_field(self.trigger)
        index: dict[str, set[Watcher]] | None
        if trigger_value is not None:
            index, key = self.by_trigger, trigger_value
        elif watcher.predicate.namespace is not None:
            index, key = self.by_namespace, watcher.predicate.namespace
        else:
            index, key = None, ""
        bucket = self.cluster_wide if index is None else index.setdefault(key, set())
        bucket.add(watcher)
        self._bucket[watcher] = (index, key)
        self._schedule_bookmark(watcher, now)

    def remove(self, watcher: Watcher) -> None:
        entry = self._bucket.pop(watcher, None)
        if entry is None:
            return
        index, key = entry
        if index is None:
            self.cluster_wide.discard(watcher)
            return
        bucket = index[key]
        bucket.discard(watcher)
        if not bucket:
            # Dropped so the indexes do not grow with every name ever watched.
            del index[key]

    def watchers(self) -> Iterable[Watcher]:
        return self._bucket.keys()

    def dispatch(self, events: Iterable[WatchEvent]) -> None:
        trigger = self.trigger
        by_trigger = self.by_trigger
        by_namespace = self.by_namespace
        cluster_wide = self.cluster_wide
        delivered = 0
        for event in events:
            for watcher in cluster_wide:
                delivered += watcher.deliver(event)
            obj = event.object
            if by_namespace and obj.namespace:
                bucket = by_namespace.get(obj.namespace)
                if bucket:
                    for watcher in bucket:
                        delivered += watcher.deliver(event)
            if trigger is not None and by_trigger:
                value = obj.fields.get(trigger, "")
                bucket = by_trigger.get(value)
                if bucket:
                    for watcher in bucket:
                        delivered += watcher.deliver(event)
                prev = event.prev
                if prev is not None:
                    prev_value = prev.fields.get(trigger, "")
                    if prev_value != value:
                        bucket = by_trigger.get(prev_value)
                        if bucket:
                            for watcher in bucket:
                                delivered += watcher.deliver(event)
        self.events_dispatched += delivered

    # ------------------------------------------------------------------ bookmarks

    def _schedule_bookmark(self, watcher: Watcher, now: float) -> None:
        due = watcher.next_bookmark(now)
        if due is not None:
            heapq.heappush(self._bookmarks, (due, next(self._seq), watcher))

    def send_due_bookmarks(self, now: float, rv: int) -> int:
        """Bookmark every watcher whose bookmark is due; one frame shared by all of them."""
        heap = self._bookmarks
        frame: bytes | None = None
        sent = 0
        due: list[Watcher] = []
        while heap and heap[0][0] <= now:
            _, _, watcher = heapq.heappop(heap)
            if watcher.closed or watcher not in self._bucket:
                continue
            if frame is None:
                frame = bookmark_frame(self.resource, rv)
            sent += watcher.bookmark(rv, frame)
            due.append(watcher)
        # Rescheduled after the pass: a zero interval must not loop within one tick.
        for watcher in due:
            self._schedule_bookmark(watcher, now)
        return sent
