"""Consistent reads against a real upstream: its current rv, and proofs of a cache's progress.

``ConsistentReads`` is the proxy's ``freshness.Progress`` (the one path a read takes to wait
for an rv is ``watchcache.dispatch.freshness.reach``; the procedure is in docs/consistency.md):

* ``current_rv``: the upstream's rv, from a consistent LIST with ``limit=1`` started *after*
  the read arrived. Concurrent reads share one such LIST (single flight per generation).
  After a failed LIST, reads fail at once (and pass through) until a backoff has passed,
  so an upstream that fails fast is not asked again on every read.
* ``proving``: the resource's ``Prober`` runs probe watches while reads wait (bounded, see
  ``upstream.probes``); each proof moves the cache's rv and wakes every read it satisfies.

Why the probe's proof reaches a read's target: kube-apiserver (≥ 1.31) serves the
consistent LIST from its watch cache after asking etcd for progress, so its cacher's rv,
which the next bookmark carries, is then at least the LIST's rv.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Generic, TypeVar

import aiohttp

from watchcache.backoff import Backoff
from watchcache.cache.listing import ListScope
from watchcache.cache.scopestate import missing_rv
from watchcache.dispatch.cacher import Cacher, CacherState
from watchcache.dispatch.freshness import NoTarget, Reached, reach
from watchcache.ratelimit import TokenBucket
from watchcache.resources import ResourceType
from watchcache.upstream.client import UpstreamClient, UpstreamError
from watchcache.upstream.probes import ProbeLimits, Prober

log = logging.getLogger("watchcache.upstream.consistency")

T = TypeVar("T")

# The least time a scope proof waits for changes the upstream listed and the reflector has not
# delivered yet (they come within milliseconds of the LIST) before its reads pass through.
SCOPE_PATIENCE = 0.025
# Under concurrency, the next proof of a scope starts this long after the last one ended, shared by
# every read arriving meanwhile: fewer upstream LISTs per read (loadtest/bench/consistent_reads.py).
SCOPE_COALESCE = 0.01
# Scope proofs kept per process (one per resource and namespace read consistently).
_MAX_SCOPES = 4096

_FETCH_ERRORS = (UpstreamError, aiohttp.ClientError, TimeoutError, OSError, KeyError, ValueError, TypeError)


class _SingleFlight(Generic[T]):
    """An upstream answer (an rv, a scope's proof), fetched by at most one request at a time per key.

    A caller joins the fetch that starts *after* it arrived: a fetch already in flight
    might have read the rv before the caller's request existed. After a failure, callers
    get ``NoTarget`` at once until the backoff has passed. ``coalesce``: callers that arrived
    during a fetch get the next one that much after it ends, joined by every caller arriving
    meanwhile (only under concurrency: a lone caller never waits for it).
    """

    def __init__(
        self,
        fetch: Callable[[], Awaitable[T]],
        backoff: Backoff | None = None,
        *,
        coalesce: float = 0.0,
        counted: Callable[[str], None] | None = None,
    ) -> None:
        self._fetch = fetch
        # Also told each fetch's outcome: totals that outlive this flight (a metric must not go back).
        self._counted = counted
        self._backoff = backoff or Backoff(0.2, 5.0)
        self._coalesce = coalesce
        self._current: asyncio.Future[T] | None = None
        # Callers waiting for the next fetch: it starts when the current one ends (+ ``coalesce``).
        self._next: asyncio.Future[T] | None = None
        self._scheduled = False
        self._retry_at = 0.0
        self._error = ""
        # Fetches by outcome ("ok", "failed"): watchcache_consistency_target_fetches_total.
        self.fetches: collections.Counter[str] = collections.Counter()

    @property
    def idle(self) -> bool:
        """No fetch under way or wanted."""
        return self._current is None and self._next is None

    async def get(self) -> T:
        if time.monotonic() < self._retry_at:
            raise NoTarget(f"backing off after: {self._error}")
        fut: asyncio.Future[T]
        if self._current is None and not self._scheduled:
            self._current = fut = asyncio.ensure_future(self._run())
            fut.add_done_callback(_retrieve)
        else:
            if self._next is None:
                self._next = asyncio.get_running_loop().create_future()
                self._next.add_done_callback(_retrieve)
            fut = self._next
        return await asyncio.shield(fut)

    async def _run(self) -> T:
        failed = False
        try:
            rv = await self._fetch()
        except _FETCH_ERRORS as e:
            failed = True
            self.fetches["failed"] += 1
            if self._counted is not None:
                self._counted("failed")
            self._error = f"{type(e).__name__}: {e}"
            self._retry_at = time.monotonic() + self._backoff.next()
            raise NoTarget(self._error) from None
        else:
            self.fetches["ok"] += 1
            if self._counted is not None:
                self._counted("ok")
            self._backoff.reset()
            return rv
        finally:
            self._current = None
            waiting = self._next
            if waiting is not None and not waiting.done():
                if failed:  # they arrived during a failing fetch: no new one until the backoff passed
                    self._next = None
                    waiting.set_exception(NoTarget(f"backing off after: {self._error}"))
                elif self._coalesce > 0:
                    self._scheduled = True  # newcomers join ``waiting`` until it starts
                    asyncio.get_running_loop().call_later(self._coalesce, self._start_next)
                else:
                    self._start_next()
            else:
                self._next = None

    def _start_next(self) -> None:
        self._scheduled = False
        waiting, self._next = self._next, None
        if waiting is None or waiting.done():
            return
        self._current = asyncio.ensure_future(self._run())
        self._current.add_done_callback(_retrieve)
        self._current.add_done_callback(functools.partial(_copy_result, dst=waiting))


def _retrieve(fut: asyncio.Future[Any]) -> None:
    """Mark an outcome seen: every caller of a flight may have given up waiting for it."""
    if not fut.cancelled():
        fut.exception()


def _copy_result(src: asyncio.Future[T], *, dst: asyncio.Future[T]) -> None:
    if dst.done():
        return
    if src.cancelled():
        dst.cancel()
    elif src.exception() is not None:
        dst.set_exception(src.exception())  # type: ignore[arg-type]
    else:
        dst.set_result(src.result())


class ConsistentReads:
    """The proxy's ``freshness.Progress``: per resource, a target single flight and a prober."""

    def __init__(self, client: UpstreamClient, *, fresh_wait: float = 3.0, probes: ProbeLimits | None = None) -> None:
        self.client = client
        self.fresh_wait = fresh_wait
        self.limits = probes or ProbeLimits()
        self.budget = TokenBucket(self.limits.rate, self.limits.burst, time.monotonic())
        self._targets: dict[ResourceType, _SingleFlight[int]] = {}
        # Per (cacher, namespace or None): the scope proofs of consistent LISTs and watches.
        self._scopes: dict[tuple[Cacher, str | None], _SingleFlight[Reached]] = {}
        # Scope proofs' LISTs by (resource, outcome): watchcache_consistency_scope_lists_total.
        self.scope_outcomes: collections.Counter[tuple[ResourceType, str]] = collections.Counter()
        self._probers: dict[Cacher, Prober] = {}
        self._advancing: dict[Cacher, asyncio.Task[object]] = {}
        # Probes ended, by (resource, outcome): watchcache_consistency_probes_total.
        self.probe_outcomes: collections.Counter[tuple[ResourceType, str]] = collections.Counter()

    # ------------------------------------------------------------------ freshness.Progress

    async def current_rv(self, cacher: Cacher, timeout: float) -> int:
        try:
            return await asyncio.wait_for(self._target(cacher.resource).get(), timeout)
        except TimeoutError:
            raise NoTarget(f"no upstream rv within {timeout:.1f}s") from None
        except NoTarget as e:
            log.debug("consistent read of %s: no upstream rv (%s)", cacher.resource.qualified, e)
            raise

    async def prove_scope(self, cacher: Cacher, namespace: str | None, timeout: float) -> Reached:
        try:
            return await asyncio.wait_for(self._scope(cacher, namespace).get(), timeout)
        except TimeoutError:
            raise NoTarget(f"no proof of the scope within {timeout:.1f}s") from None
        except NoTarget as e:
            log.debug("consistent read of %s: no proof of the scope (%s)", cacher.resource.qualified, e)
            raise

    @contextlib.contextmanager
    def proving(self, cacher: Cacher) -> Iterator[asyncio.Future[None]]:
        with self.prober(cacher).wanted() as proofless:
            yield proofless

    def unprovable(self, cacher: Cacher) -> bool:
        prober = self._probers.get(cacher)
        if prober is None and cacher.resource.uncached_by_kube:
            prober = self.prober(cacher)  # unprovable from the start, not from a read's 504
        return prober is not None and prober.unprovable

    # ------------------------------------------------------------------ the rest

    def prober(self, cacher: Cacher) -> Prober:
        prober = self._probers.get(cacher)
        if prober is None:
            # Keyed by cacher: a follower (or protobuf cache) dropped and made again for a resource
            # gets a new one; a resource's JSON and protobuf caches have one each.
            for old in [c for c in self._probers if c.resource is cacher.resource and c.state is CacherState.STOPPED]:
                self._probers.pop(old).stop()
            prober = self._probers[cacher] = Prober(
                self.client,
                cacher,
                self.limits,
                self.budget,
                self.probe_outcomes,
                apply_wait=self.fresh_wait,
                unprovable=cacher.resource.uncached_by_kube,
            )
        return prober

    def target_fetches(self) -> Iterator[tuple[ResourceType, str, int]]:
        for resource, flight in list(self._targets.items()):
            for outcome, count in flight.fetches.items():
                yield resource, outcome, count

    def scope_fetches(self) -> Iterator[tuple[ResourceType, str, int]]:
        for (resource, outcome), count in list(self.scope_outcomes.items()):
            yield resource, outcome, count

    def _scope(self, cacher: Cacher, namespace: str | None) -> _SingleFlight[Reached]:
        key = (cacher, namespace)
        flight = self._scopes.get(key)
        if flight is None:
            if len(self._scopes) >= _MAX_SCOPES:
                # Bounded whatever namespaces clients name: idle flights go (their counts are kept apart).
                for idle in [k for k, f in self._scopes.items() if f.idle]:
                    del self._scopes[idle]
            flight = self._scopes[key] = _SingleFlight(
                functools.partial(self._prove_scope, cacher, namespace),
                coalesce=SCOPE_COALESCE,
                counted=functools.partial(self._count_scope, cacher.resource),
            )
        return flight

    def _count_scope(self, resource: ResourceType, outcome: str) -> None:
        self.scope_outcomes[(resource, outcome)] += 1

    async def _prove_scope(self, cacher: Cacher, namespace: str | None) -> Reached:
        """One proof of a scope (``cache/scopestate.py``), shared by every read that joined it.

        The upstream's metadata LIST of the scope started after those reads arrived; if the
        cache holds exactly its objects at their versions, the cache's state of the scope is the
        upstream's at the LIST's rv, and stays at least that new: the cache only moves forward.
        A difference is a change the reflector has not delivered yet (a write a moment ago): it
        is waited for about as long as the LIST took, then the reads pass through, which costs
        about that again. Covering every namespace, the proof also moves the cache's rv.
        """
        started = time.monotonic()
        state = await self.client.list_versions(cacher.resource, namespace)
        fetched = time.monotonic()
        scope = ListScope.of(namespace)
        until = fetched + max(SCOPE_PATIENCE, fetched - started)
        how = Reached.PROGRESS
        while True:
            if cacher.rv >= state.rv:
                return Reached.EVENTS
            needed = missing_rv(cacher.cache.snapshot(), scope, state)
            if needed is None:
                if namespace is None:
                    cacher.progress(state.rv)
                return how
            left = until - time.monotonic()
            if left <= 0:
                return Reached.IMPATIENT
            await cacher.wait_for_rv(max(needed, cacher.rv + 1), left)
            how = Reached.EVENTS

    def _target(self, resource: ResourceType) -> _SingleFlight[int]:
        flight = self._targets.get(resource)
        if flight is None:
            flight = self._targets[resource] = _SingleFlight(lambda: self.client.list_rv(resource))
        return flight

    def advance(self, cacher: Cacher) -> None:
        """In the background, bring the cache to the upstream's current rv (at most one at a time per cache).

        Not a client read, so not counted in the consistent-read metrics: used after a relist,
        whose group rv must not stay the cache's head (see ``ResourceCache.relist``).
        """
        task = self._advancing.get(cacher)
        if task is None or task.done():
            for done in [c for c, t in self._advancing.items() if t.done()]:
                del self._advancing[done]
            self._advancing[cacher] = asyncio.ensure_future(reach(cacher, None, self, self.fresh_wait))

    def stop(self) -> None:
        for prober in self._probers.values():
            prober.stop()
        for task in self._advancing.values():
            task.cancel()
