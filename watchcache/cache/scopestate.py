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

from dataclasses import dataclass

from watchcache.cache.listing import ListScope
from watchcache.cache.store import Snapshot


@dataclass(frozen=True, slots=True)
class ScopeState:
    """The upstream's objects of one scope at ``rv``: how many, and the newest one's resourceVersion."""

    rv: int
    count: int
    newest: int


def missing_rv(snapshot: Snapshot, scope: ListScope, state: ScopeState) -> int | None:
    """None when ``snapshot`` holds exactly ``state``'s objects of ``scope``, at their versions.

    Otherwise the rv to wait for: the newest listed version, which the cache lacks (0 when the
    only difference is an object the cache still holds: a deletion it has not applied, whose rv
    the metadata cannot tell). The caller waits for that rv, then compares again.

    Why a count and the newest version are enough, for a snapshot at ``s`` of the same history
    as the upstream's listing at ``state.rv`` >= ``s`` (the caller's case; at ``state.rv`` < ``s``
    the cache is past the proof and needs none). An object listed with an rv <= ``s`` was last
    written at or before ``s``, so the cache holds it at that rv: every listed object is in the
    cache as listed unless it was written after ``s``. If none was (newest <= ``s``), the listing
    is a subset of the cache's scope, and equal to it iff the counts are equal: a deletion after
    ``s`` leaves the cache one more. If one was, the cache lacks it, and the newest is the last
    of what it lacks.
    """
    if state.newest <= snapshot.rv:
        return None if snapshot.count_range(scope.lo, scope.hi) == state.count else 0
    return state.newest
