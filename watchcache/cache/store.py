"""The revisioned cache of one resource type (kube's ``watchCache``), free of I/O.

It takes an ordered stream: ``replace`` (a full list at an rv), ``apply`` (a batch of
changes in rv order), ``relist`` (a fresh list after a 410, turned into a diff) and
``progress`` (the upstream has nothing before rv: a bookmark). From that it keeps the
current objects in key order and a ``HistoryWindow``, and answers reads *at an exact
resourceVersion* anywhere inside the window by undoing the events after it (MVCC
without copying the state).

Groups. kube-apiserver gives every event its own rv, but an upstream that is itself a
watch cache (another watchcache tier) sends *groups* of events sharing one rv — the
deletions of its relist diffs — and a group may arrive split across two network reads.
So ``apply`` accepts a batch that continues the group at the head, and a resume point
shared by several events is *ambiguous*: a client holding that rv may have seen only
part of the group, so a watch from it gets 410 (the client relists) unless at most one
event of the group concerns the watch and the group arrived whole (``events_since``).
kube's own upstream never makes groups, so none of this costs anything there.

Backfill. A read or watch at an rv ``R`` older than the window is served when the upstream
can still tell what happened after ``R``: a ``Span`` (the state at ``R`` of the keys its
events touch, and every event in ``(R, O]``) is replayed, checked against the cache's own
state at ``O`` (the window's oldest rv), and put in front of the window (``backfill``). A
span never reaches back across a relist: the relist's diff gave clients states that were no
state of the upstream, so an rv from before it cannot be resumed exactly.

Index. As kube's cacher ``Indexers`` (pods by ``spec.nodeName``), the keys of the current objects
are indexed by the resource's trigger field (when it is not ``metadata.name``, which is the key
itself): a kubelet's LIST of its node's pods reads those pods, not every pod of the cluster.

Concurrency contract: single-threaded. Readers take a ``Snapshot`` and use it before
the next mutation (every read in the server is built synchronously, so it never
straddles an ``apply``). No I/O, and the clock is injected (invariant 10).

The invariants of docs/architecture.md this module keeps: 1 (ordering: ``apply`` refuses
anything else), 3 (what the window guarantees: ``snapshot``, ``events_since``,
``ambiguous``) and 7 (``relist``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from sortedcontainers import SortedDict

from watchcache.cache.events import ADDED, DELETED, MODIFIED, WatchEvent
from watchcache.cache.history import HistoryWindow
from watchcache.cache.object import CachedObject
from watchcache.cache.predicate import SelectionPredicate
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


class ResourceVersionAmbiguous(ResourceVersionTooOld):
    """Several events share the requested rv: a client holding it may have seen only part of them."""

    def __init__(self, requested: int, oldest: int) -> None:
        super().__init__(requested, oldest)
        self.args = (f"{self.args[0]}: several events share resourceVersion {requested}, start over with a list",)


class ResourceVersionTooNew(Exception):
    def __init__(self, requested: int, current: int) -> None:
        super().__init__(f"Too large resource version: {requested}, current: {current}")
        self.requested = requested
        self.current = current


class ResourceVersionOrderError(ValueError):
    """The feed broke the stream contract (an rv going backwards or splitting a group)."""


class BackfillRefused(ValueError):
    """A span the cache will not take (nothing changed); ``reason`` is a metric label."""

    RELIST = "relist"  # it reaches back across a relist
    MISMATCH = "mismatch"  # replayed, it does not give the cache's state at the window's start
    SHORT = "short"  # its events do not reach the window's start
    ROOM = "room"  # it does not fit in --history-max-events
    SPLIT = "split"  # the group at the window's start was partly evicted (an upstream tier's group)

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Span:
    """What the upstream knows of the history before a window: every event in ``(rv, through]``.

    ``changes`` are the upstream's watch events after ``rv`` in rv order (they may go past
    ``through``: those are ignored). ``prior`` holds the state at ``rv`` of every key the
    changes touch (a key missing from it did not exist at ``rv``), so that each event gets its
    ``prev`` — a selector watch needs it to turn a MODIFIED into an ADDED or a DELETED.
    ``others``: the rvs of every other object at ``rv`` (from a full LIST), checked too;
    None when the span comes from a cache that checked them already (an owner's window).
    """

    rv: int
    through: int
    changes: Sequence[tuple[str, CachedObject]]
    prior: Mapping[str, CachedObject]
    others: Mapping[str, int] | None = None

    @classmethod
    def from_list(
        cls, rv: int, listed: Iterable[CachedObject], changes: Sequence[tuple[str, CachedObject]], through: int
    ) -> Span:
        """A span from a full list at ``rv`` and the watch events after it."""
        touched = {obj.key for _, obj in changes}
        prior: dict[str, CachedObject] = {}
        others: dict[str, int] = {}
        for obj in listed:
            if obj.key in touched:
                prior[obj.key] = obj
            else:
                others[obj.key] = obj.rv
        return cls(rv, through, changes, prior, others)


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
    # state agree, so undoing the events after r yields the state at r (invariant 3).
    def __init__(self, resource: ResourceType, config: CacheConfig, clock: Callable[[], float]) -> None:
        self.resource = resource
        self.config = config
        self._clock = clock
        self._objects: SortedDict = SortedDict()
        self._object_bytes = 0
        self.rv = 0
        self.initialized = False
        self.history = HistoryWindow(config.history_max_events, config.history_max_age)
        # The rv carried by several frames of the last relist's diff, if any (only in the cases
        # ``relist`` cannot order away), and those events (None: not known, e.g. on a follower
        # told only the rv: then every watch is refused there).
        self.unresumable_rv: int | None = None
        self._unresumable_events: list[WatchEvent] | None = None
        # rvs of groups in the window that arrived in more than one batch (see ``ambiguous``).
        self._continued: set[int] = set()
        # The rv of the last relist: no span reaches back across it (see "Backfill"; 0: none).
        self.relisted_at = 0
        # No group continues at or below this rv: a backfill ended there (see ``continues_group``).
        self._sealed_at = 0
        # Trigger value -> keys of the current objects with it (see "Index" above); None: not indexed.
        trigger = resource.trigger_field
        self.index_field = trigger if trigger and trigger != "metadata.name" else None
        self._index: dict[str, set[str]] = {}

    def __len__(self) -> int:
        return len(self._objects)

    # ------------------------------------------------------------------ input stream

    def replace(self, objects: Iterable[CachedObject], rv: int) -> None:
        """Start over from a full list at ``rv``; history restarts there too."""
        self._objects = SortedDict((o.key, o) for o in objects)
        self._object_bytes = sum(len(o.body) for o in self._objects.values())
        self._reindex()
        self.rv = rv
        self.history.reset(rv)
        self.set_unresumable(None)
        self._continued = set()
        self._sealed_at = 0
        self.initialized = True

    def set_unresumable(self, rv: int | None, events: list[WatchEvent] | None = None) -> None:
        """A resume exactly at ``rv`` is ambiguous (see ``relist``); ``events``: the frames at rv, if known."""
        self.unresumable_rv = rv
        self._unresumable_events = events if rv is not None else None

    def apply(self, changes: Sequence[tuple[str, CachedObject]]) -> list[WatchEvent]:
        """Apply one batch of (type, object) changes; returns the events recorded.

        The rvs must be non-decreasing, and the first greater than ``rv`` — or equal to it
        when the head of the history is a group of events at ``rv``: the rest of a group that
        arrived in two reads (``continues_group``): invariant 1. Nothing is changed if the batch
        is refused: the cache changes first, or not at all (invariant 11).
        """
        if not changes:
            return []
        last = self.rv
        if changes[0][1].rv == last:
            if not self.continues_group():
                raise ResourceVersionOrderError(f"{self.resource.qualified}: rv {last} again, after a list or bookmark")
            oldest = self.history.oldest_rv
            self._continued = {r for r in self._continued if r >= oldest}
            self._continued.add(last)
        # Checked whole before anything changes (invariants 1 and 11).
        for _, obj in changes:
            if obj.rv < last:
                raise ResourceVersionOrderError(f"{self.resource.qualified}: rv {obj.rv} after {last}")
            last = obj.rv
        now = self._clock()
        events: list[WatchEvent] = []
        objects = self._objects
        field = self.index_field
        index = self._index
        for kind, obj in changes:
            prev = objects.get(obj.key)
            if kind == DELETED:
                if prev is not None:
                    del objects[obj.key]
                    self._object_bytes -= len(prev.body)
                    if field is not None:
                        self._unindex(prev.fields.get(field, ""), prev.key)
                event_type = DELETED
            else:
                objects[obj.key] = obj
                self._object_bytes += len(obj.body) - (len(prev.body) if prev is not None else 0)
                if field is not None:
                    value = obj.fields.get(field, "")
                    if prev is not None:
                        old = prev.fields.get(field, "")
                        if old != value:
                            self._unindex(old, obj.key)
                            index.setdefault(value, set()).add(obj.key)
                    else:
                        index.setdefault(value, set()).add(obj.key)
                event_type = ADDED if prev is None else MODIFIED
            event = WatchEvent(self.resource, event_type, obj, prev, obj.rv, now)
            self.history.append(event)
            events.append(event)
        self.rv = last
        return events

    def continues_group(self) -> bool:
        """Whether a change at ``rv`` would continue a group: the newest event in the window is at ``rv``.

        Not after a list, a relist or a progress mark at ``rv``: a well-behaved upstream sends no
        event at an rv it has listed or bookmarked.
        """
        history = self.history
        newest = history.newest_rv
        if newest is None:  # the window is empty: the head group may have been evicted whole
            return history.oldest_rv == self.rv and history.evicted_at_oldest > 0
        # A backfill into an empty window may end with an event at rv: it was listed there.
        return newest == self.rv and newest > self._sealed_at

    def relist(self, objects: Iterable[CachedObject], rv: int) -> list[WatchEvent]:
        """Replace the state with a fresh list at ``rv`` and return the difference as events (invariant 7).

        Used after the upstream answered 410 to a resumed watch: instead of ending every
        client watch (kube-apiserver's behaviour), the change from the old state ``C`` (at
        the old rv, also ``C`` below) to the new one is delivered as ordinary events, one
        group at ``rv`` in the cache (``WatchEvent.rv``). What a client sees is each frame's
        object rv, and the diff is ordered so that **at most one frame carries** ``rv`` **and
        it is the last** (see ``_order_diff``). So a client that listed at ``rv``, got the
        relist BOOKMARK at ``rv`` or got the group's last frame has the whole group, and
        resumes at ``rv`` without a 410; a client that got only part of it holds an rv below
        ``rv``, before the new window, and gets 410, never a silent loss. History restarts
        at ``rv``: what happened between ``C`` and ``rv`` is unknown, so no read or watch
        start inside that gap can be served exactly.
        """
        if rv < self.rv:
            raise ResourceVersionOrderError(f"{self.resource.qualified}: relist at {rv} after {self.rv}")
        now = self._clock()
        fresh = SortedDict((o.key, o) for o in objects)
        old = self._objects
        changed: list[WatchEvent] = []
        for key, obj in fresh.items():
            prev = old.get(key)
            if prev is None:
                changed.append(WatchEvent(self.resource, ADDED, obj, None, rv, now))
            elif prev.rv != obj.rv or (prev.body != obj.body and prev.decode() != obj.decode()):
                # Same rv, other bytes: the same object encoded twice (a watch event's bytes are the
                # upstream's, a list item's orjson's) is no change; other contents at one rv are.
                changed.append(WatchEvent(self.resource, MODIFIED, obj, prev, rv, now))
        gone = [prev for key, prev in old.items() if key not in fresh]
        events = self._order_diff(changed, gone, rv, now)
        self._objects = fresh
        self._object_bytes = sum(len(o.body) for o in fresh.values())
        self._reindex()
        self.rv = rv
        self.history.reset(rv)
        self._continued = set()
        self.relisted_at = rv
        self._sealed_at = 0
        at_rv = [e for e in events if e.object.rv == rv]
        if len(at_rv) > 1:
            self.set_unresumable(rv, at_rv)
        else:
            self.set_unresumable(None)
        return events

    def _order_diff(self, changed: list[WatchEvent], gone: list[CachedObject], rv: int, now: float) -> list[WatchEvent]:
        """The relist diff in the order and with the frame rvs described in ``relist``.

        1. ADDED/MODIFIED below ``rv``, in the order of their own rvs (each is above ``C``: the
           cache was complete at ``C``, so a listed object last written at or before ``C`` is
           one it already holds) — the rvs a client sees never go backwards;
        2. the DELETED events, stamped ``rv - 1`` (a deletion's own rv is unknown: it lies in
           ``(C, rv]``), which is at least the rvs of step 1 and above ``C`` — they may share
           ``rv - 1`` with each other or with step 1, harmless since every rv below ``rv`` is
           before the new window (410 at this proxy whoever asks);
        3. the one object whose own rv is ``rv``, if there is one (kube writes one object per
           revision); if there is none, the last deletion is stamped ``rv`` instead, so the
           group still ends with a frame at ``rv`` for clients that do not take bookmarks.

        Cases left with several frames at ``rv`` (``relist`` then refuses resumes at ``rv``, as
        before): ``rv == C + 1`` with several changes (no room below ``rv``), or several
        listed objects with own rv ``rv`` (an upstream that writes several objects per
        revision). Stamping decodes and re-encodes each deleted object: a relist's cost,
        never the hot path's.
        """
        changed.sort(key=lambda e: (e.object.rv, e.object.key))
        split = len(changed)
        while split and changed[split - 1].object.rv >= rv:
            split -= 1
        below, top = changed[:split], changed[split:]
        gone.sort(key=lambda o: (o.rv, o.key))
        stamps = [rv] * len(gone)
        if rv - 1 > self.rv:
            stamps = [rv - 1] * len(gone)
            if gone and not top:
                stamps[-1] = rv
        deleted = [
            WatchEvent(self.resource, DELETED, prev.with_resource_version(stamp), prev, rv, now)
            for prev, stamp in zip(gone, stamps, strict=True)
        ]
        return below + deleted + top

    def _reindex(self) -> None:
        self._index = {}
        field = self.index_field
        if field is None:
            return
        index = self._index
        for key, obj in self._objects.items():
            index.setdefault(obj.fields.get(field, ""), set()).add(key)

    def _unindex(self, value: str, key: str) -> None:
        keys = self._index.get(value)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._index[value]  # so the index does not grow with every value ever seen

    def progress(self, rv: int) -> bool:
        """The upstream promises no event at or before ``rv`` is missing; True if rv moved.

        A "Most Recent" read relies on it: the cache at ``rv`` is as new as the upstream was (invariant 8).
        """
        if rv > self.rv:
            self.rv = rv
            return True
        return False

    def expire(self) -> int:
        return self.history.expire(self._clock())

    def backfill(self, span: Span) -> list[WatchEvent]:
        """Put ``span`` in front of the window, so that reads and watches from ``span.rv`` are served.

        The span's events up to the window's oldest rv ``O`` are replayed over its state at
        ``span.rv``; the result must be the cache's own state at ``O`` (same keys, same rvs),
        or the span is refused (``BackfillRefused``) and nothing changes (invariant 13). Returns the
        events put in front (none if the window already reaches ``span.rv``).
        """
        history = self.history
        oldest = history.oldest_rv
        start = span.rv
        if start >= oldest:
            return []
        name = self.resource.qualified
        if start < self.relisted_at:
            raise BackfillRefused(
                BackfillRefused.RELIST,
                f"{name} relisted at {self.relisted_at}: what clients were sent before it is no state of the upstream",
            )
        if span.through < oldest:
            raise BackfillRefused(BackfillRefused.SHORT, f"span ({start}, {span.through}] ends before {oldest}")
        if history.at(oldest):
            raise BackfillRefused(BackfillRefused.SPLIT, f"the group at {oldest} was partly evicted")
        state: dict[str, CachedObject | None] = dict(span.prior)
        stamp = history.oldest_event_time
        stamp = self._clock() if stamp is None else stamp
        events: list[WatchEvent] = []
        last = start
        for kind, obj in span.changes:
            if obj.rv > oldest:
                break
            if obj.rv <= start or obj.rv < last:
                raise BackfillRefused(BackfillRefused.MISMATCH, f"{name}: event at {obj.rv} out of order after {last}")
            last = obj.rv
            prev = state.get(obj.key)
            if kind == DELETED:
                if prev is None:
                    raise BackfillRefused(BackfillRefused.MISMATCH, f"{name}: {obj.key} deleted at {obj.rv} unknown")
                state[obj.key] = None
                event_type = DELETED
            else:
                state[obj.key] = obj
                event_type = ADDED if prev is None else MODIFIED
            events.append(WatchEvent(self.resource, event_type, obj, prev, obj.rv, stamp))
        self._check_span(span, state, oldest)
        if len(events) > history.room():
            raise BackfillRefused(
                BackfillRefused.ROOM,
                f"{name}: {len(events)} events do not fit in the window ({len(history)} of {history.max_events})",
            )
        history.prepend(events, start)
        self._sealed_at = max(self._sealed_at, oldest)
        return events

    def _check_span(self, span: Span, state: Mapping[str, CachedObject | None], oldest: int) -> None:
        """The span replayed to ``oldest`` (``state``) must be the cache's state at ``oldest``."""
        at = self.snapshot(oldest)
        name = self.resource.qualified

        def mismatch(key: str, theirs: int | None, mine: CachedObject | None) -> BackfillRefused:
            ours = "absent" if mine is None else f"at {mine.rv}"
            upstream = "absent" if theirs is None else f"at {theirs}"
            return BackfillRefused(
                BackfillRefused.MISMATCH, f"{name}: at rv {oldest} {key} is {upstream} upstream but {ours} here"
            )

        for key, obj in state.items():
            mine = at.get(key)
            theirs = None if obj is None else obj.rv
            if theirs != (None if mine is None else mine.rv):
                raise mismatch(key, theirs, mine)
        others = span.others
        if others is None:
            return
        for key, rv in others.items():
            mine = at.get(key)
            if key in state or mine is None or mine.rv != rv:
                raise mismatch(key, rv, mine)
        present = len(others) + sum(1 for obj in state.values() if obj is not None)
        if present != at.count_range("", None):
            raise BackfillRefused(
                BackfillRefused.MISMATCH,
                f"{name}: at rv {oldest} the upstream had {present} objects, this cache {at.count_range('', None)}",
            )

    def span(self, rv: int, through: int) -> Span:
        """The window's events in ``(rv, through]`` and the state at ``rv`` of the keys they touch.

        For a follower whose window starts later than this one (it backfills from it).
        TooOld if the window does not reach back to ``rv``.
        """
        if rv < self.history.oldest_rv:
            raise ResourceVersionTooOld(rv, self.history.oldest_rv)
        through = min(through, self.rv)
        changes: list[tuple[str, CachedObject]] = []
        prior: dict[str, CachedObject] = {}
        seen: set[str] = set()
        for event in self.history.since(rv):
            if event.rv > through:
                break
            key = event.object.key
            if key not in seen:
                seen.add(key)
                if event.prev is not None:
                    prior[key] = event.prev
            changes.append((event.type, event.object))
        return Span(rv, through, changes, prior)

    # ------------------------------------------------------------------ reads

    @property
    def oldest_rv(self) -> int:
        return self.history.oldest_rv

    def get(self, key: str) -> CachedObject | None:
        return self._objects.get(key)

    def snapshot(self, rv: int | None = None) -> Snapshot:
        """The state at ``rv`` (default: current). Raises TooOld/TooNew outside the window.

        Exact anywhere in the window (invariant 3), so every page of a chunked LIST reads the
        first page's state (invariant 4).
        """
        if rv is None or rv == self.rv:
            return Snapshot(self._objects, {}, self.rv, self._index, self.index_field)
        if rv > self.rv:
            raise ResourceVersionTooNew(rv, self.rv)
        if rv < self.history.oldest_rv:
            raise ResourceVersionTooOld(rv, self.history.oldest_rv)
        overlay: dict[str, CachedObject | None] = {}
        for event in self.history.since(rv):
            # The first event after rv for a key holds that key's state at rv in ``prev``.
            if event.object.key not in overlay:
                overlay[event.object.key] = event.prev
        return Snapshot(self._objects, overlay, rv, self._index, self.index_field)

    def events_since(self, rv: int, predicate: SelectionPredicate | None = None) -> list[WatchEvent]:
        """Events after ``rv`` for a watch (with ``predicate``) resuming there.

        TooOld if the window moved past ``rv``, or if ``rv`` is ambiguous for this watch: several
        events at ``rv`` concern it, so a client holding ``rv`` may have seen only part of them
        (a 410 makes it relist; resuming after ``rv`` would silently skip the rest). One event
        at ``rv``, or several of which at most one concerns the watch, is no ambiguity — unless
        the group arrived in more than one batch: then a client may have listed, started a
        watch or got a bookmark at ``rv`` before the rest came, so any event of the group that
        concerns the watch makes ``rv`` ambiguous for it. (Invariant 3; a watch start and a
        lagging watcher's catch-up in ``Cacher`` rely on it.)
        """
        history = self.history
        if rv < history.oldest_rv:
            raise ResourceVersionTooOld(rv, history.oldest_rv)
        if self.ambiguous(rv, predicate):
            raise ResourceVersionAmbiguous(rv, history.oldest_rv)
        if rv >= self.rv:
            return []
        return history.since(rv)

    def ambiguous(self, rv: int, predicate: SelectionPredicate | None = None) -> bool:
        """Several events at ``rv`` concern a watch with ``predicate`` (None: any watch); see ``events_since``."""
        if rv == self.unresumable_rv:
            known = self._unresumable_events
            return known is None or _concerning(known, predicate) > 1
        history = self.history
        # Evicted events of the group at oldest_rv cannot be looked at: count them as concerning.
        evicted = history.evicted_at_oldest if rv == history.oldest_rv else 0
        group = history.at(rv)
        if evicted + len(group) < 2:
            return False
        concerning = evicted + _concerning(group, predicate)
        return concerning > 1 or (concerning > 0 and rv in self._continued)

    def group_size(self, rv: int) -> int:
        """How many events the window holds (or evicted) at ``rv``: it grows only when a group is continued."""
        history = self.history
        return len(history.at(rv)) + (history.evicted_at_oldest if rv == history.oldest_rv else 0)

    def stats(self) -> CacheStats:
        return CacheStats(
            len(self._objects), self._object_bytes, len(self.history), self.history.bytes, self.oldest_rv, self.rv
        )


def _concerning(events: list[WatchEvent], predicate: SelectionPredicate | None) -> int:
    if predicate is None or predicate.selects_all:
        return len(events)
    return sum(1 for e in events if predicate.concerns(e))


class Snapshot:
    """A read view at ``rv``: the live state with an overlay of undone keys.

    Valid only until the cache next changes (use it synchronously).
    """

    __slots__ = ("_index", "_objects", "_overlay", "_overlay_keys", "index_field", "rv")

    def __init__(
        self,
        objects: SortedDict,
        overlay: dict[str, CachedObject | None],
        rv: int,
        index: dict[str, set[str]] | None = None,
        index_field: str | None = None,
    ) -> None:
        self._objects = objects
        self._overlay = overlay
        self._overlay_keys = sorted(overlay) if overlay else []
        self._index = index or {}
        self.index_field = index_field
        self.rv = rv

    def keys_with(self, value: str) -> list[str]:
        """The keys, in order, of the objects whose ``index_field`` may be ``value`` at this rv.

        A superset: an overlaid key is included whatever its value (callers filter with the
        predicate, which pins the field). O(matches + overlay), not O(objects).
        """
        keys = self._index.get(value, ())
        if self._overlay:
            return sorted(set(keys).union(self._overlay))
        return sorted(keys)

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
