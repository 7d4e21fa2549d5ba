"""Fan-out of one resource's events to its watchers, without scanning all of them.

Watchers with an equal predicate and encoding form one ``WatcherGroup``: per event, the frame is
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

Bookmarks follow kube's schedule: due every ``bookmark_interval`` and 2 s before a watch's
deadline (``Watcher.next_bookmark``), in whole-second buckets of the cacher's clock, sent
by the cacher's tick (every 1–1.25 s). So a watch with ``timeoutSeconds=3`` (a consistent
read's probe, docs/consistency.md) gets its bookmark 0–2.25 s after it starts, here as
from kube-apiserver.

Invariants: a watcher is in exactly one group from ``add`` until ``remove``; a group is
in exactly one index bucket while it has watchers; each watcher receives a batch's
frames in event order, once (docs/architecture.md, invariant 1) — or, if delivering to it
raised, is ended (``INTERNAL_ERROR``: its client resumes from the last event it read), never
left silently short. A failure is contained to what it concerns: one watcher (its delivery
raised), one group (choosing or building a frame for it raised), else every watcher
(invariant 11). Frames are chosen once per group and shared (invariant 5).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
from collections.abc import Callable, Hashable, Iterable

from watchcache.cache.encoding import FULL_JSON, Encoding
from watchcache.cache.events import WatchEvent
from watchcache.cache.predicate import SelectionPredicate
from watchcache.resources import ResourceType
from watchcache.watchers.watcher import CloseReason, Watcher, select_frame, select_type

log = logging.getLogger("watchcache.dispatch")


class WatcherGroup:
    """Watchers with an equal predicate, and the frames of the batch being dispatched."""

    __slots__ = ("broken", "events", "frames", "key", "predicate", "watchers")

    def __init__(self, key: Hashable, predicate: SelectionPredicate) -> None:
        self.key = key
        self.predicate = predicate
        # A dict, not a set: delivery in registration order makes runs reproducible.
        self.watchers: dict[Watcher, None] = {}
        # The batch in progress: the events this group selected, and their frames.
        self.events: list[WatchEvent] = []
        self.frames: list[bytes] = []
        # Choosing a frame of the batch raised: its watchers cannot be served it (see deliver).
        self.broken = False

    def __repr__(self) -> str:
        return f"WatcherGroup({self.key!r}, watchers={len(self.watchers)})"

    def offer(self, event: WatchEvent, touched: list[WatcherGroup]) -> None:
        # A try costs nothing until it catches; one that does ends this group only (invariant 11).
        try:
            frame = select_frame(self.predicate, event)
        except Exception:
            log.exception("choosing the frame of %r for %r failed; ending its watchers", event, self)
            if not self.broken and not self.frames:
                touched.append(self)
            self.broken = True
            return
        if frame is None:
            return
        if not self.frames and not self.broken:
            touched.append(self)
        self.frames.append(frame)
        self.events.append(event)

    def deliver(self, failed: Callable[[Watcher], None]) -> int:
        """Hand the batch to every watcher, as one shared bytes object; returns the deliveries.

        A watcher whose delivery raises is handed to ``failed`` (ended); a broken group hands
        every watcher to it: it cannot tell which of them should have had the missing frame.
        """
        frames, events = self.frames, self.events
        self.frames, self.events = [], []
        if self.broken:
            # Never silently short (invariant 11): each of them may be missing a frame.
            self.broken = False
            for watcher in list(self.watchers):
                failed(watcher)
            return 0
        count = len(frames)
        blob = frames[0] if count == 1 else b"".join(frames)
        delivered = 0
        # A try costs nothing until it catches (CPython 3.11): see loadtest/bench/isolation.py.
        for watcher in self.watchers:
            try:
                delivered += watcher.deliver_batch(blob, count, events)
            except Exception:
                log.exception("delivering to %r failed; ending it", watcher)
                failed(watcher)
        return delivered


class EncodedWatcherGroup(WatcherGroup):
    """Watchers with an equal predicate and a non-default encoding (PartialObjectMetadata, protobuf).

    A separate class so the full-JSON group's ``offer`` stays exactly the fan-out path it was.
    """

    __slots__ = ("encoding",)

    def __init__(self, key: Hashable, predicate: SelectionPredicate, encoding: Encoding) -> None:
        super().__init__(key, predicate)
        self.encoding = encoding

    def offer(self, event: WatchEvent, touched: list[WatcherGroup]) -> None:
        # As WatcherGroup.offer: building a PartialObjectMetadata or protobuf frame that raises
        # ends this group's watchers only (invariant 11).
        try:
            as_type = select_type(self.predicate, event)
            frame = None if as_type is None else self.encoding.event_frame(event, as_type)
        except Exception:
            log.exception("building the %s frame of %r for %r failed; ending its watchers", self.encoding, event, self)
            if not self.broken and not self.frames:
                touched.append(self)
            self.broken = True
            return
        if frame is None:
            return
        if not self.frames and not self.broken:
            touched.append(self)
        self.frames.append(frame)
        self.events.append(event)


def group_key(predicate: SelectionPredicate, encoding: Encoding = FULL_JSON) -> Hashable:
    """Watchers share frames iff they select alike and are written alike."""
    return (predicate.namespace, predicate.labels, predicate.fields, predicate.shard, encoding)


class Dispatcher:
    def __init__(
        self, resource: ResourceType, on_failure: Callable[[str], None] | None = None, *, epoch: float = 0.0
    ) -> None:
        self.resource = resource
        # Told "dispatch" once per watcher ended because delivering to it raised.
        self.on_failure = on_failure
        # Bookmarks fall due in whole seconds since ``epoch`` (the cacher's start), as kube's
        # watcherBookmarkTimeBuckets: a bookmark due at X goes out at the first tick after
        # epoch + floor(X - epoch), up to a second early.
        self.epoch = epoch
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
        # A watcher removed during a fan-out (it closed there) leaves when the fan-out ends:
        # the fan-out iterates the groups and indexes that removal changes.
        self._dispatching = False
        self._departed: list[Watcher] = []

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
        encoding = watcher.encoding
        key = group_key(watcher.predicate, encoding)
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = (
                WatcherGroup(key, watcher.predicate)
                if encoding is FULL_JSON
                else EncodedWatcherGroup(key, watcher.predicate, encoding)
            )
            index, value = self._bucket(group.predicate)
            (self.cluster_wide if index is None else index.setdefault(value, set())).add(group)
        # One group per watcher, one bucket per group: no event reaches a watcher twice (invariant 1).
        group.watchers[watcher] = None
        self._group_of[watcher] = group
        self._schedule_bookmark(watcher, now)

    def remove(self, watcher: Watcher) -> None:
        """Unregister ``watcher``; safe at any time (inside a fan-out it takes effect when the fan-out ends)."""
        if self._dispatching:
            self._departed.append(watcher)
            return
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
        """Fan ``events`` (one batch, in rv order) out: choose frames per group, then deliver per watcher.

        Never raises: a watcher that cannot be given its frames is ended (see the module doc).
        """
        self._dispatching = True
        try:
            self._dispatch(events)
        except Exception:
            # Not contained to a group or a watcher: nobody can be trusted to have the batch (invariant 11).
            log.exception("dispatching a batch of %s failed; ending every watcher", self.resource.qualified)
            for group in self.groups.values():
                group.frames, group.events, group.broken = [], [], False
            for watcher in list(self._group_of):
                self.fail(watcher)
        finally:
            self._dispatching = False
            if self._departed:
                departed, self._departed = self._departed, []
                for watcher in departed:
                    self.remove(watcher)

    def fail(self, watcher: Watcher) -> None:
        """End ``watcher``: something on its path raised, so it may be missing an event."""
        if watcher.closed:
            return
        if self.on_failure is not None:
            self.on_failure("dispatch")
        try:
            watcher.close(CloseReason.INTERNAL_ERROR)
        except Exception:
            log.exception("ending %r failed", watcher)

    def _dispatch(self, events: Iterable[WatchEvent]) -> None:
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
        fail = self.fail
        for group in touched:
            delivered += group.deliver(fail)
        self.events_dispatched += delivered

    # ------------------------------------------------------------------ bookmarks

    def _schedule_bookmark(self, watcher: Watcher, now: float) -> None:
        due = watcher.next_bookmark(now)
        if due is not None:
            bucket = self.epoch + math.floor(due - self.epoch)
            heapq.heappush(self._bookmarks, (bucket, next(self._seq), watcher))

    def send_due_bookmarks(self, now: float, rv: int) -> int:
        """Bookmark every watcher whose bookmark is due; one frame shared by all of them."""
        heap = self._bookmarks
        # One frame per encoding, shared by every due watcher of that encoding.
        frames: dict[Encoding, bytes] = {}
        sent = 0
        due: list[Watcher] = []
        while heap and heap[0][0] <= now:
            _, _, watcher = heapq.heappop(heap)
            if watcher.closed or watcher not in self._group_of:
                continue
            encoding = watcher.encoding
            frame = frames.get(encoding)
            if frame is None:
                frame = frames[encoding] = encoding.bookmark_frame(self.resource, rv)
            try:
                sent += watcher.bookmark(rv, frame)
            except Exception:
                log.exception("bookmarking %r failed; ending it", watcher)
                self.fail(watcher)
                continue
            due.append(watcher)
        # Rescheduled after the pass: a zero interval must not loop within one tick.
        for watcher in due:
            self._schedule_bookmark(watcher, now)
        return sent
