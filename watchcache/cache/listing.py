"""Paging a LIST over a snapshot: scope, start key, limit, filter and what remains.

Every page reads the snapshot at the first page's rv (invariants 3 and 4); items are the cached
bytes, never re-encoded (invariant 5).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from watchcache.cache.object import CachedObject, object_key
from watchcache.cache.predicate import SelectionPredicate
from watchcache.cache.store import Snapshot

Predicate = Callable[[CachedObject], bool]


@dataclass(frozen=True)
class ListScope:
    """The key range of a collection: all keys, or those of one namespace (``ns/`` to ``ns0``)."""

    lo: str
    hi: str | None

    @classmethod
    def of(cls, namespace: str | None) -> ListScope:
        if not namespace:
            return cls("", None)
        # '0' is the character after '/', so [ns/, ns0) is exactly the keys under ns/.
        return cls(namespace + "/", namespace + "0")


@dataclass
class ListPage:
    items: list[CachedObject]
    rv: int
    # Start key of the next page relative to the scope (None: the list is complete).
    next_start: str | None
    # Items after this page, when known (no selector and more to come), else None.
    remaining: int | None
    # Objects examined to build the page (for apiserver_cache_list_fetched_objects_total).
    scanned: int = 0


def list_page(
    snapshot: Snapshot,
    scope: ListScope,
    predicate: Predicate | None,
    *,
    limit: int = 0,
    start: str | None = None,
    indexed: str | None = None,
    count_rest: bool = False,
) -> ListPage:
    """Up to ``limit`` matching objects from ``start`` (relative to the scope) in key order.

    As kube's cacher: the page is complete after ``limit`` matches, and it has more
    iff any key (matching or not) follows the last returned one. ``indexed``: the value the
    predicate pins the snapshot's index field to (``SelectionPredicate.exact_field``): only
    the objects the index holds for it are examined. ``count_rest``: report ``remaining`` despite
    the predicate, as kube's cacher does for a list only a shardSelector filters: the objects in
    scope from ``start`` minus ``limit`` (not the matches after the page, which kube does not count).
    """
    lo = scope.lo + start if start else scope.lo
    items: list[CachedObject] = []
    it = snapshot.iter_range(lo, scope.hi) if indexed is None else _indexed(snapshot, indexed, lo, scope.hi)
    if predicate is None and not limit:
        items = list(it)
        return ListPage(items, snapshot.rv, None, None, len(items))
    scanned = 0
    for obj in it:
        scanned += 1
        if predicate is None or predicate(obj):
            items.append(obj)
            if limit and len(items) >= limit:
                break
    else:
        return ListPage(items, snapshot.rv, None, None, scanned)
    last_key = items[-1].key
    next_lo = last_key + "\x00"
    if next(snapshot.iter_range(next_lo, scope.hi), None) is None:
        return ListPage(items, snapshot.rv, None, None, scanned)
    if predicate is None:
        remaining: int | None = snapshot.count_range(next_lo, scope.hi)
    elif count_rest and indexed is None:
        remaining = snapshot.count_range(lo, scope.hi) - limit
    else:
        remaining = None
    return ListPage(items, snapshot.rv, next_lo[len(scope.lo) :], remaining, scanned)


def _indexed(snapshot: Snapshot, value: str, lo: str, hi: str | None) -> Iterator[CachedObject]:
    keys = snapshot.keys_with(value)
    end = len(keys) if hi is None else bisect_left(keys, hi)
    for i in range(bisect_left(keys, lo), end):
        obj = snapshot.get(keys[i])
        if obj is not None:
            yield obj


def candidates(snapshot: Snapshot, predicate: SelectionPredicate, *, namespaced: bool) -> Iterator[CachedObject]:
    """The objects ``predicate`` may select, in key order, without reading those it cannot (filter them with it).

    A watch's initial state (``sendInitialEvents``): a kubelet's watch of its Node or of one
    ConfigMap (``metadata.name``, in a namespace) reads one key; of its pods (the index field,
    ``spec.nodeName``) the index's keys; anything else its scope.
    """
    name = predicate.exact_name()
    if name is not None and (predicate.namespace is not None or not namespaced):
        obj = snapshot.get(object_key(predicate.namespace or "", name))
        if obj is not None:
            yield obj
        return
    scope = ListScope.of(predicate.namespace)
    value = predicate.exact_field(snapshot.index_field)
    if value is None:
        yield from snapshot.iter_range(scope.lo, scope.hi)
    else:
        yield from _indexed(snapshot, value, scope.lo, scope.hi)
