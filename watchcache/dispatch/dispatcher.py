"""Fan-out of one resource's events to its watchers, without scanning all of them.

Watchers with an equal predicate form one ``WatcherGroup``: per event, the frame is
chosen once for the group, and per batch (one feed read) each watcher of the group gets
the group's frames joined into one shared bytes object. So a batch of E events to K
informer-style watchers costs E frame choices and K appends, not E×K of both.

Groups are indexed as kube's cacher indexes watchers (``IndexerFuncs`` + ``watchersBuffer``):

* by the resource's *trigger* field when the predicate pins it (kubelets watch pods
  with ``spec.nodeName=<node>``; configmap/secret watches often pin ``metadata.name``):
  an event reaches them only through the values of that field in the new and the
  previous object;
* else by namespace for namespaced watches;
* else in ``cluster_wide``, which sees every event.

So an event costs O(matching groups), not O(all watchers): 10,000 kubelet-style
watchers cost two dict lookups per pod event.

Invariants: a watcher is in exactly one group from ``add`` until ``remove``; a group is
in exactly one index bucket while it has watchers; each watcher receives a batch's
frames in event order, once.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable, Iterable

from watchcache.cache.events import WatchEvent, bookmark_frame
from watchcache.cache.predicate import SelectionPredicate
from watchcache.resources import ResourceType
from watchcache.watchers.watcher import Watcher, select_frame


class WatcherGroup:
    """Watchers with an equal predicate, and the frames of the batch being dispatched."""

    __slots__ = ("events", "frames", "key", "predicate", "watchers")

    def __init__(self, key: Hashable, predicate: SelectionPredicate) -> None:
        self.key = key
        self.predicate = predicate
        # A dict, not a set: delivery in registration order makes runs reproducible.
        self.watchers: dict[Watcher, None] = {}
        # The batch in progress: the events this group selected, and their frames.
        self.events: list[WatchEvent] = []
        self.frames: list[bytes] = []

    def __repr__(self) -> str:
        return f"WatcherGroup({self.key!r}, watchers={len(self.watchers)})"

    def offer(self, event: WatchEvent, touched: list[WatcherGroup]) -> None:
        frame = select_frame(self.predicate, event)
        if frame is None:
            return
        if not self.frames:
            touched.append(self)
        self.frames.append(frame)
        self.events.append(event)

    def deliver(self) -> int:
        """Hand the batch to every watcher, as one shared bytes object; returns the deliveries."""
        frames, events = self.frames, self.events
        self.frames, self.events = [], []
        count = len(frames)
        blob = frames[0] if count == 1 else b"".join(frames)
        delivered = 0
        for watcher in self.watchers:
            delivered += watcher.deliver_batch(blob, count, events)
        return delivered


def predicate_key(predicate: SelectionPredicate) -> Hashable:
    return (predicate.namespace, predicate.labels, predicate.fields)


class Dispatcher:
    def __init__(self, resource: ResourceType) -> None:
        self.resource = resource
        self.trigger = resource.trigger_field
        self.by_trigger: dict[str, set[WatcherGroup]] = {}
        self.by_namespace: dict[str, set[WatcherGroup]] = {}
        self.cluster_wide: set[WatcherGroup] = set()
        self.groups: dict[Hashable, WatcherGroup] = {}
        self._group_of: dict[Watcher, WatcherGroup] = {}
        # (due, seq, watcher) for watchers that asked for bookmarks; stale entries are skipped.
        self._bookmarks: list[tuple[float, int, Watcher]] = []
        self._seq = itertools.count()
        self.events_dispatched = 0

    def __len__(self) -> int:
        return len(self._group_of)

    def _bucket(self, predicate: SelectionPredicate) -> tuple[dict[str, set[WatcherGroup]] | None, str]:
        trigger_value = predicate.exact_field(self.trigger)
        if trigger_value is not None:
            return self.by_trigger, trigger_value
        if predicate.namespace is not None:
            return self.by_namespace, predicate.namespace
        return None, ""

    def add(self, watcher: Watcher, now: float) -> None:
        key = predicate_key(watcher.predicate)
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = WatcherGroup(key, watcher.predicate)
            index, value = self._bucket(group.predicate)
            (self.cluster_wide if index is None else index.setdefault(value, set())).add(group)
        group.watchers[watcher] = None
        self._group_of[watcher] = group
        self._schedule_bookmark(watcher, now)

    def remove(self, watcher: Watcher) -> None:
        group = self._group_of.pop(watcher, None)
        if group is None:
            return
        del group.watchers[watcher]
        if group.watchers:
            return
        del self.groups[group.key]
        index, value = self._bucket(group.predicate)
        if index is None:
            self.cluster_wide.discard(group)
            return
        bucket = index[value]
        bucket.discard(group)
        if not bucket:
            # Dropped so the indexes do not grow with every name ever watched.
            del index[value]

    def watchers(self) -> Iterable[Watcher]:
        return self._group_of.keys()

    def dispatch(self, events: Iterable[WatchEvent]) -> None:
        """Fan ``events`` (one batch, in rv order) out: choose frames per group, then deliver per watcher."""
        trigger = self.trigger
        by_trigger = self.by_trigger
        by_namespace = self.by_namespace
        cluster_wide = self.cluster_wide
        touched: list[WatcherGroup] = []
        for event in events:
            for group in cluster_wide:
                group.offer(event, touched)
            obj = event.object
            if by_namespace and obj.namespace:
                bucket = by_namespace.get(obj.namespace)
                if bucket:
                    for group in bucket:
                        group.offer(event, touched)
            if trigger is not None and by_trigger:
                value = obj.fields.get(trigger, "")
                bucket = by_trigger.get(value)
                if bucket:
                    for group in bucket:
                        group.offer(event, touched)
                prev = event.prev
                if prev is not None:
                    prev_value = prev.fields.get(trigger, "")
                    if prev_value != value:
                        bucket = by_trigger.get(prev_value)
                        if bucket:
                            for group in bucket:
                                group.offer(event, touched)
        delivered = 0
        for group in touched:
            delivered += group.deliver()
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
            if watcher.closed or watcher not in self._group_of:
                continue
            if frame is None:
                frame = bookmark_frame(self.resource, rv)
            sent += watcher.bookmark(rv, frame)
            due.append(watcher)
        # Rescheduled after the pass: a zero interval must not loop within one tick.
        for watcher in due:
            self._schedule_bookmark(watcher, now)
        return sent
