"""A cached read's life below HTTP, in one place: ready, fresh enough, reaching back, then a snapshot or a watch.

kube-apiserver decides in its cacher (``delegator.go``) whether the cache or etcd answers a read.
Here this module decides it for GET, LIST and WATCH alike, and ``server/`` only parses the request
and writes the outcome::

    read_object / list_snapshot / admit_watch (+ start_watch)
      |  not synced within --ready-wait ----------------------> NotReady (429)
      v
    freshness, per read mode (invariant 8)
      |  Most Recent: the scope's proof (reach_scope) --------> Delegated(CONSISTENT_READ) if not proven
      |  NotOlderThan / Exact / continue: reach the rv -------> TooLarge (504) if not reached (a watch
      |                                                         waits on); a GET or LIST of a resource the
      |                                                         upstream cannot prove: Delegated(UNREACHED_RV)
      v
    reaching back (an Exact read or continue, a watch from an rv, before the window)
      |  the backfill of the older history (dispatch/backfill.py; --backfill-wait)
      v
    the state read, with no await from here on (invariants 2, 3, 4)
      |  GET: the object (or None)      LIST: the Snapshot      WATCH: a registered Watcher
      +--before the window: Expired (410; kube's words, and why the proxy could not reach back)
      +--before the window, the upstream that has its history unreachable now: RetryLater (429)
      +--Exact before the window, an upstream that may still have it: Delegated(OLD_EXACT_READ)

A GET without resourceVersion never gets here when the upstream reads it from etcd: that is known
from the request alone, so ``server/decision.py`` passes it through before any review or wait.

Every refusal is a value (``dispatch/outcomes.py``); ``server/`` maps it to a Status, an ERROR
event or a pass-through. A request gives its in-flight seat up while it waits here
(``ReadContext.waiting``, ``server/seats.py``) and takes it back for the work after.
"""

from __future__ import annotations

import asyncio
from contextlib import AbstractContextManager
from typing import Protocol

from watchcache.cache.continuetoken import ContinueCodec
from watchcache.cache.object import CachedObject, object_key
from watchcache.cache.semantics import Mode, ReadPlan, WatchPlan
from watchcache.cache.store import ResourceVersionTooNew, ResourceVersionTooOld, Snapshot
from watchcache.dispatch import freshness
from watchcache.dispatch.backfill import reach_back
from watchcache.dispatch.cacher import Cacher, WatchRequest
from watchcache.dispatch.freshness import Progress, Reached, Wait
from watchcache.dispatch.outcomes import (
    CONTINUE_TOO_OLD,
    LIST_TOO_OLD,
    BackfillFailed,
    Delegated,
    Delegation,
    Expired,
    NotReady,
    Refusal,
    RetryLater,
    TooLarge,
    before_window,
    watch_too_old,
)
from watchcache.resources import ResourceType
from watchcache.watchers.watcher import Watcher, WatchSink

# The modes that read at a requested rv: the cache must reach it first. (Tuples, not sets: an
# Enum's hash is a Python call, a tuple's ``in`` compares identities first.)
_AT_RV = (Mode.NOT_OLDER_THAN, Mode.EXACT, Mode.CONTINUE)
# The modes that read one rv exactly: before the window, the history is fetched first.
_EXACT = (Mode.EXACT, Mode.CONTINUE)
_CONSISTENT_READ = Delegated(Delegation.CONSISTENT_READ)
_OLD_EXACT_READ = Delegated(Delegation.OLD_EXACT_READ)
_UNREACHED_RV = Delegated(Delegation.UNREACHED_RV)


class ReadUpstream(Progress, Protocol):
    """What the read path asks of the upstream: proofs of progress (``freshness.Progress``) and two facts."""

    # True when the upstream may still answer an exact read older than this cache's history
    # (kube-apiserver reads it from etcd until etcd compacts it): such a LIST passes through
    # instead of getting our 410. False when the upstream's history is this cache's own (the sim).
    answers_old_reads: bool
    # True when a GET or LIST at an rv this cache did not reach in time may be answered by the
    # upstream (kube-apiserver: from etcd, for a resource it does not cache, or from its cache ahead
    # of this one); False when the upstream's rv is this cache's (the sim): 504 stays the answer.
    answers_reads_ahead: bool


class WaitObserver(Protocol):
    """Where the waits are measured (``server/metrics.py``)."""

    def waited(self, resource: ResourceType, wait: Wait, *, consistent: bool) -> None: ...


class ReadConfig(Protocol):
    @property
    def fresh_wait(self) -> float:
        """How long a read waits for its rv or its proof (``--fresh-wait``; kube: 3 s)."""

    @property
    def ready_wait(self) -> float:
        """How long a read waits for a cache that has not synced (``--ready-wait``) before 429."""


class ReadContext(Protocol):
    """What a read needs from the server that serves it (``server/context.py`` ``ApiContext``)."""

    @property
    def upstream(self) -> ReadUpstream: ...

    @property
    def codec(self) -> ContinueCodec: ...

    @property
    def config(self) -> ReadConfig: ...

    @property
    def metrics(self) -> WaitObserver | None: ...

    def waiting(self) -> AbstractContextManager[object]:
        """While entered, the request being served waits without its in-flight seat."""


async def ready(ctx: ReadContext, cacher: Cacher) -> NotReady | None:
    """Until a cache has synced, its reads are refused with 429 and Retry-After (as kube while initialising)."""
    if cacher.resume is not None:
        cacher.resume()  # a suspended feed (upstream/encodings.py): this read restarts it, and waits
    if cacher.ready:
        return None
    wait = ctx.config.ready_wait if cacher.ready_wait is None else cacher.ready_wait
    if await cacher.wait_ready(wait):
        return None
    return NotReady(cacher.resource)


async def _fresh(
    ctx: ReadContext, cacher: Cacher, mode: Mode, rv: int, namespace: str | None, *, upstream_may_answer: bool = False
) -> Refusal | None:
    """Wait (at most ``--fresh-wait``) until the cache can serve a read in ``mode`` (``freshness``; invariant 8).

    "Most Recent": the read waits for its scope's proof and passes through without one (a GET does
    too, from an upstream that does not read etcd: the simulated cluster). A requested rv the
    cache does not reach in time is 504 "Too large resource version"; ``upstream_may_answer`` (a GET
    or LIST, see ``_ahead``): as soon as no proof is coming, the upstream answers it instead.
    """
    if mode is Mode.MOST_RECENT:
        with ctx.waiting():
            wait = await freshness.reach_scope(cacher, namespace or None, ctx.upstream, ctx.config.fresh_wait)
        metrics = ctx.metrics
        if metrics is not None:
            metrics.waited(cacher.resource, wait, consistent=True)
        return None if wait.reached else _CONSISTENT_READ
    if mode in _AT_RV and cacher.rv < rv:
        give_up = upstream_may_answer and mode is not Mode.CONTINUE and ctx.upstream.answers_reads_ahead
        with ctx.waiting():
            wait = await freshness.reach(cacher, rv, ctx.upstream, ctx.config.fresh_wait, give_up_unproven=give_up)
        metrics = ctx.metrics
        if metrics is not None:
            metrics.waited(cacher.resource, wait, consistent=False)
        if wait.how is Reached.UNPROVEN:
            return _UNREACHED_RV
        if not wait.reached:
            return TooLarge(rv, cacher.rv)
    return None


def _upstream_answers(ctx: ReadContext, cacher: Cacher, plan: ReadPlan | WatchPlan) -> bool:
    """The upstream answers this GET or LIST at an rv its proofs cannot bring the cache to (see ``_ahead``)."""
    return plan.mode is not Mode.CONTINUE and ctx.upstream.answers_reads_ahead and ctx.upstream.unprovable(cacher)


def _goes_upstream(ctx: ReadContext, cacher: Cacher, plan: ReadPlan, *, single: bool = False) -> bool:
    """A GET or LIST at an rv ahead of a cache the upstream cannot prove: no wait is worth making.

    ``single``: a LIST of one object by name (``metadata.name=``, in a namespace or of a cluster-scoped
    kind): kube reads it from etcd at an exact rv (its store's non-recursive GetList, which its cacher
    delegates: ``ShouldDelegateExactRV``), so one ahead of this cache is answered there at once (a
    far-future rv: etcd's 504, no wait)."""
    if plan.mode not in _AT_RV or cacher.rv >= plan.rv:
        return False
    if single and plan.mode is Mode.EXACT and ctx.upstream.answers_reads_ahead:
        return True
    return _upstream_answers(ctx, cacher, plan)


def _ahead(ctx: ReadContext, cacher: Cacher, plan: ReadPlan | WatchPlan, refused: Refusal | None) -> Refusal | None:
    """A GET or LIST at an rv the cache has not reached, of a resource whose progress the upstream
    cannot prove (its watches send no bookmark: kube-apiserver serves it from etcd, as events by
    default), goes to the upstream: it answers such reads at once, 200 or its own 504.

    Not a continue token's page: its token is this proxy's, signed for a snapshot of its own. Not a
    resource the upstream proves: there a 504 after ``--fresh-wait`` is kube's own answer, and a
    flood of reads at a far-future rv stays here rather than going upstream.
    """
    if isinstance(refused, TooLarge) and _upstream_answers(ctx, cacher, plan):
        return _UNREACHED_RV
    return refused


async def _reach_back(ctx: ReadContext, cacher: Cacher, rv: int) -> BackfillFailed | None:
    """The one trigger of a backfill for a read's start: an exact rv older than the window waits for its history.

    (A lagging watcher's history is fetched by its cacher: ``Cacher.history_gone``.) Called after
    the freshness wait, which cannot lower the window's start, and right before the state is read.
    """
    if rv >= cacher.cache.oldest_rv:
        return None
    with ctx.waiting():
        return await reach_back(cacher, rv)


async def read_object(
    ctx: ReadContext, cacher: Cacher, plan: ReadPlan, namespace: str, name: str
) -> CachedObject | Refusal | None:
    """A GET: the object at a state at least as new as ``plan`` asks, None if there is none, or a refusal."""
    refused: Refusal | None = await ready(ctx, cacher)
    if refused is None:
        refused = _UNREACHED_RV if _goes_upstream(ctx, cacher, plan) else None
    if refused is None:
        fresh = await _fresh(ctx, cacher, plan.mode, plan.rv, namespace, upstream_may_answer=True)
        refused = _ahead(ctx, cacher, plan, fresh)
    if refused is not None:
        return refused
    return cacher.cache.get(object_key(namespace if cacher.resource.namespaced else "", name))


async def list_snapshot(
    ctx: ReadContext, cacher: Cacher, plan: ReadPlan, namespace: str | None, *, single: bool = False
) -> Snapshot | Refusal:
    """A LIST: the snapshot it reads (``namespace``: its scope, None for all), or a refusal.
    ``single``: it names one object (``_goes_upstream``).

    Returns with no ``await`` after the snapshot is taken: the caller builds its answer in the
    same step, so the snapshot cannot change under it.
    """
    refused: Refusal | None = await ready(ctx, cacher)
    if refused is None:
        refused = _UNREACHED_RV if _goes_upstream(ctx, cacher, plan, single=single) else None
    if refused is None:
        fresh = await _fresh(ctx, cacher, plan.mode, plan.rv, namespace, upstream_may_answer=True)
        refused = _ahead(ctx, cacher, plan, fresh)
    if refused is not None:
        return refused
    if plan.mode not in _EXACT:
        return cacher.cache.snapshot()
    backfill = await _reach_back(ctx, cacher, plan.rv)
    return snapshot_at(ctx, cacher, plan, backfill)


def snapshot_at(
    ctx: ReadContext, cacher: Cacher, plan: ReadPlan, backfill: BackfillFailed | None
) -> Snapshot | Refusal:
    """The snapshot of an exact read (Exact, a continue token's page), read synchronously.

    A continue token's pages read its rv exactly (invariant 4), inside the window or 410 (invariant 3).
    ``backfill``: why the history before the window could not be had, if it was tried.
    """
    cache = cacher.cache
    try:
        if plan.mode is Mode.CONTINUE and cache.group_size(plan.rv) > plan.group:
            # The rest of a group at rv arrived after the first page: rv no longer names the
            # state that page read (see ResourceCache, "Groups").
            raise ResourceVersionTooOld(plan.rv, cache.oldest_rv)
        return cache.snapshot(plan.rv)
    except ResourceVersionTooOld:
        if plan.mode is Mode.CONTINUE:
            # As kube: the 410 carries an "inconsistent" token that goes on from the same
            # key at the newest rv, for clients that accept a list that is not one snapshot.
            token = ctx.codec.encode(cache.rv, plan.start, cache.group_size(cache.rv)) if plan.start else None
            return Expired(CONTINUE_TOO_OLD, token)
        if ctx.upstream.answers_old_reads:
            return _OLD_EXACT_READ
        return before_window(LIST_TOO_OLD, backfill)
    except ResourceVersionTooNew as e:  # the cache moved backwards: a relist restarted it
        return TooLarge(e.requested, e.current)


async def admit_watch(ctx: ReadContext, cacher: Cacher, plan: WatchPlan, namespace: str | None) -> Refusal | None:
    """A watch's waits before it starts: readiness, then freshness per mode (the same as a LIST's).

    A ``TooLarge`` comes after the watch is accepted. From an rv this cache has not reached (e.g.
    listed on another worker or replica that is ahead), a plain watch is accepted at once, as kube's
    cacher accepts it (``getAllEventsSinceLocked``): its headers go out and it waits for the cache
    to reach the rv (``await_watch_start``) within its own timeout; it must not start before (a
    resync in between would hand it changes it already has). A watch-list needs the state at the
    rv: it waits for it up to ``--fresh-wait`` (504 after, as kube), and is the upstream's to answer
    when the upstream cannot prove this cache's progress (``_ahead``: as a LIST there).
    """
    refused: Refusal | None = await ready(ctx, cacher)
    if refused is not None:
        return refused
    if plan.mode in _AT_RV and cacher.rv < plan.rv:
        if not plan.initial_events:
            return TooLarge(plan.rv, cacher.rv)
        if _upstream_answers(ctx, cacher, plan):
            return _UNREACHED_RV
    fresh = await _fresh(ctx, cacher, plan.mode, plan.rv, namespace, upstream_may_answer=plan.initial_events)
    return _ahead(ctx, cacher, plan, fresh) if plan.initial_events else fresh


async def await_watch_start(
    ctx: ReadContext, cacher: Cacher, rv: int, timeout: float, ended: asyncio.Future[bool]
) -> bool:
    """A watch from an rv the cache has not reached (no initial events), accepted: wait for it.

    kube-apiserver's cacher (v1.36) accepts such a watch at once and sends the events after the rv
    when they come; only a watch-list (``sendInitialEvents=true``) waits for freshness and fails with
    504. So the watch, its headers sent, waits without its seat for the cache to reach ``rv``: first
    as a read does (events, then a probe's proof, up to ``--fresh-wait``: a quiet resource's cache is
    proven current, and the watch gets its bookmarks), then for the cache's own events (or a later
    proof made for another read), until its timeout or ``ended`` (its client went, or the server is
    shutting down).
    True: it may start now (from ``rv``, so no change it already has comes again); False: it ends
    with no event, as kube's does when nothing comes.
    """
    with ctx.waiting():
        reached = asyncio.ensure_future(_reach_watch_start(ctx, cacher, rv, timeout))
        try:
            await asyncio.wait((reached, ended), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not reached.done():
                reached.cancel()
    return reached.done() and not reached.cancelled() and reached.result() and not ended.done()


async def _reach_watch_start(ctx: ReadContext, cacher: Cacher, rv: int, timeout: float) -> bool:
    began = asyncio.get_running_loop().time()
    wait = await freshness.reach(cacher, rv, ctx.upstream, min(ctx.config.fresh_wait, timeout))
    if ctx.metrics is not None:
        ctx.metrics.waited(cacher.resource, wait, consistent=False)
    if wait.reached:
        return True
    left = timeout - (asyncio.get_running_loop().time() - began)
    return await cacher.wait_for_rv(rv, left)


async def start_watch(
    ctx: ReadContext, cacher: Cacher, request: WatchRequest, sink: WatchSink
) -> Watcher | Expired | RetryLater:
    """Start an admitted watch: a registered watcher whose first frames are its initial events or backlog.

    A start rv before the window waits for the history before it first; then ``Cacher.start_watch``
    runs without an ``await`` (invariant 2). Before the window still: ``Expired`` (or ``RetryLater``),
    nothing registered.
    """
    plan = request.plan
    backfill = None
    if plan.mode is Mode.EXACT and not plan.initial_events:
        backfill = await _reach_back(ctx, cacher, plan.rv)
    try:
        return cacher.start_watch(request, sink)
    except ResourceVersionTooOld as e:
        return before_window(watch_too_old(cacher.resource, e), backfill)
