"""A scope's state as the upstream lists it, compared with the cache's: the proof of a consistent LIST.

Why this proof: a consistent LIST must return a state at least as new as the upstream's when the
read arrived. In a busy cluster the global rv moves all the time (Leases, Events) while the
resource being read is quiet, so the cache's rv is almost always behind the upstream's, and the
watch API proves progress only with a bookmark, which kube-apiserver sends at its next one-second
tick (docs/consistency.md). What can be learnt in one round trip is the scope's state itself: a
consistent LIST of the same scope as ``PartialObjectMetadataList`` gives each object's
resourceVersion at the upstream's rv ``R``. If the cache holds exactly those objects at exactly
those versions, no event of the scope lies between the cache's rv and ``R`` (a change gives an
object a new rv, a creation adds one, a deletion removes one), so the cache's state of the scope
*is* the state at ``R``. Nothing here does I/O: the caller fetches, this compares.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from watchcache.cache.listing import ListScope
from watchcache.cache.store import Snapshot


@dataclass(frozen=True)
class ScopeState:
    """The upstream's objects of one scope at ``rv``: each object's key and resourceVersion."""

    rv: int
    versions: Mapping[str, int]


def missing_rv(snapshot: Snapshot, scope: ListScope, state: ScopeState) -> int | None:
    """None when ``snapshot`` holds exactly ``state``'s objects of ``scope``, at their versions.

    Otherwise the highest rv of an object the cache has not caught up with (0 when the only
    difference is objects the cache still holds: a deletion it has not applied, whose rv the
    metadata cannot tell). The caller waits for that rv, then compares again.
    """
    needed = 0
    equal = snapshot.count_range(scope.lo, scope.hi) == len(state.versions)
    get = snapshot.get
    for key, rv in state.versions.items():
        obj = get(key)
        if obj is None or obj.rv < rv:
            equal = False
            if rv > needed:
                needed = rv
        elif obj.rv != rv:  # newer in the cache: it is past the state at ``state.rv`` for this object
            equal = False
    return None if equal else needed
