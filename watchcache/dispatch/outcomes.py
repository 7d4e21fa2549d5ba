"""How a cached read ends when the cache does not answer it, in neutral terms, and the one place for their words.

A read (``dispatch/reads.py``) or a lagging watcher (``dispatch/cacher.py``) that the cache cannot
serve ends with a ``Refusal``: not synced yet (429), an rv the cache did not reach in time (504
"Too large resource version"), an rv before its history (410 Expired; 429 while the upstream that
has that history cannot be asked: ``RetryLater``), or a read the upstream answers instead
(``Delegated``). They are values, not HTTP: ``server/`` writes them as a Status, an ERROR event of
a watch, or a pass-through by reason. Their texts are kube-apiserver's, built here once, so that a
LIST and a watch at the same old resourceVersion say the same about why the proxy could not reach
back (``before_window``).

``BackfillFailed`` is here, below the cacher, because both the read path and a lagging watcher's
410 (or 429) word it (``dispatch/backfill.py`` raises it).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from watchcache import apierrors
from watchcache.cache.store import ResourceVersionTooOld
from watchcache.resources import ResourceType


class BackfillFailed(Exception):
    """The window cannot reach back to the rv asked for; ``outcome`` is a metric label, the message the 410's."""

    GONE = "gone"  # the upstream answered 410: compacted, or out of its own window
    BOUND = "bound"  # a limit: span events or bytes, memory budget, room in the window
    MISMATCH = "mismatch"  # the span did not replay to the cache's state (ResourceCache.backfill refused it)
    RELIST = "relist"  # the rv is before a relist of this cache
    # The upstream (or the owner) could not be asked now: a connection refused or cut, a 429 or 5xx
    # answer. Passing: the client is told to retry (429), not to relist (see ``before_window``).
    UNREACHABLE = "unreachable"
    FAILED = "failed"  # anything else: a malformed answer, no proof of completeness, the fetch's timeout
    DEADLINE = "deadline"  # the request's wait ran out
    OFF = "off"  # this cache has no source of older history

    # Outcomes that concern the rv asked for: an rv above it may still be served.
    PER_RV = frozenset({GONE, BOUND})
    # Outcomes after which the proxy says what kube-apiserver says, nothing added: the history is
    # gone upstream too, or this cache never reaches back (as kube's watch cache).
    AS_KUBE = frozenset({GONE, OFF})
    # Outcomes that may pass: the request is answered 429 with Retry-After instead of 410.
    RETRY = frozenset({UNREACHABLE})

    def __init__(self, outcome: str, message: str, *, retried: bool = False) -> None:
        super().__init__(message)
        self.outcome = outcome
        # The source already retried before failing (an owner worker's answer comes after its own
        # ``Backfills`` attempts): asking it again at once only repeats them, behind its backoff.
        self.retried = retried


class Refusal:
    """Why the cache does not answer a read (one ``isinstance`` tells an outcome from a refusal)."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class NotReady(Refusal):
    """The cache has not synced (yet, or again): 429 with Retry-After, as kube while initialising."""

    resource: ResourceType

    def status(self) -> apierrors.StatusError:
        message = f"storage is (re)initializing: the cache of {self.resource.qualified} is not synced yet"
        return apierrors.too_many_requests(message, 1)


@dataclass(frozen=True, slots=True)
class TooLarge(Refusal):
    """The cache did not reach the rv asked for within ``--fresh-wait``: kube's 504 (``IsTooLargeResourceVersion``)."""

    requested: int
    current: int

    def status(self) -> apierrors.StatusError:
        return apierrors.too_large_resource_version(self.requested, self.current)


@dataclass(frozen=True, slots=True)
class Expired(Refusal):
    """The rv asked for is before the history the cache has: 410 Expired (build it with ``expired``)."""

    message: str
    # A continue token's 410: kube's "inconsistent" token that goes on from the same key at the newest rv.
    list_continue: str | None = None

    def status(self) -> apierrors.StatusError:
        return apierrors.resource_expired(self.message, list_continue=self.list_continue)


@dataclass(frozen=True, slots=True)
class RetryLater(Refusal):
    """The history before the window is upstream, which cannot be asked now: kube's 429 with Retry-After.

    Not 410: a client-go reflector relists on 410, and backs off and watches again from the same
    rv on 429 (also as a watch's ERROR event), as it does when kube-apiserver refuses a connection.
    The retry is served once the upstream answers, or meets the upstream's own 410.
    """

    message: str

    def status(self) -> apierrors.StatusError:
        return apierrors.too_many_requests(self.message, 1)


class Delegation(enum.Enum):
    """Why the upstream answers a cached read instead (``server/`` counts it as a pass-through reason)."""

    CONSISTENT_READ = "consistent-read"  # a consistent LIST or watch whose scope was not proven fresh in time
    OLD_EXACT_READ = "old-exact-read"  # an Exact LIST older than the window, which the upstream may still have
    UNREACHED_RV = "unreached-rv"  # a GET or LIST at an rv the cache did not reach in time, which the upstream may have


@dataclass(frozen=True, slots=True)
class Delegated(Refusal):
    reason: Delegation


# kube's etcd store, for a LIST at a compacted resourceVersion (a watch says "too old resource version: N (M)").
LIST_TOO_OLD = "The resourceVersion for the provided list is too old."
# kube's etcd store, for a watch at a compacted resourceVersion (of what kube serves from etcd).
WATCH_TOO_OLD = "The resourceVersion for the provided watch is too old."
# kube's etcd store, for a continue token whose resourceVersion was compacted.
CONTINUE_TOO_OLD = (
    "The provided continue parameter is too old to display a consistent list result. You can start a new list "
    "without the continue parameter, or use the continue token in this response to retrieve the remainder of the "
    "results. Continuing with the provided token results in an inconsistent list - objects that were created, "
    "modified, or deleted between the time the first chunk was returned and now may show up in the list."
)


def watch_too_old(resource: ResourceType, error: ResourceVersionTooOld) -> str:
    """kube's words to a watch from before the window: its cacher's "too old resource version: N (M)",
    or etcd's for a resource kube serves from etcd (``ResourceType.uncached_by_kube``: events)."""
    if resource.uncached_by_kube and type(error) is ResourceVersionTooOld:  # (not the proxy's own ambiguity)
        return WATCH_TOO_OLD
    return str(error)


def before_window(
    kube_message: str, backfill: BackfillFailed | None, list_continue: str | None = None
) -> Expired | RetryLater:
    """The answer to a read or watch before the window: kube's 410, and why the proxy could not reach back.

    ``kube_message`` is what kube-apiserver says to that request (``LIST_TOO_OLD`` to a LIST, "too old
    resource version: N (M)" to a watch). Nothing is added when no backfill was tried, when the
    upstream itself has compacted the rv, or when this cache has no source of older history
    (``BackfillFailed.AS_KUBE``): the client is told what kube-apiserver tells it. An upstream that
    could not be asked now (``BackfillFailed.RETRY``) gets ``RetryLater``: the history may still be
    there, and a relist is what the proxy exists to spare. Any other outcome (a bound, a relist of
    this cache, the wait running out) is the proxy's own limit, said in the same words to a LIST and
    to a watch.
    """
    if backfill is None or backfill.outcome in BackfillFailed.AS_KUBE:
        return Expired(kube_message, list_continue)
    if backfill.outcome in BackfillFailed.RETRY:
        # Not kube's words for an old rv: a client that matched "too old" in the message would relist.
        return RetryLater(f"the proxy could not fetch the history older than its cache now, retry: {backfill}")
    return Expired(f"{kube_message} (the proxy could not fetch the older history: {backfill})", list_continue)
