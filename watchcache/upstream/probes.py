"""Probe watches: proofs that a quiet resource's cache holds the upstream's state at some rv.

A probe is a watch of the resource from the cache's rv ``C`` with bookmarks and a short
``timeoutSeconds``. It returns every event after ``C`` in order, then a BOOKMARK at ``B``: a
promise that every event with rv ≤ ``B`` was sent on that stream. Once the cache has
applied the largest event rv ``E`` the probe saw (``C`` if none), there is provably no event
in ``(E, B]``, so the cache's state *is* the state at ``B``: ``cacher.progress(B)``, which wakes
every read waiting for an rv ≤ ``B``. The proof holds whenever the probe started.

When the bookmark comes (kube-apiserver, ``cacheWatcher.nextBookmarkTime`` and the cacher's
bookmark timer): 2 s before the watch's deadline, rounded down to a whole second of the
cacher's clock, at the next tick of a timer that fires every 1–1.25 s. With
``timeoutSeconds=3`` a probe's bookmark comes 0–2.25 s after it starts (about 1.1 s on
average); with 2 it never comes. A probe started right after a bookmark tick gets the next
tick's bookmark: probes in a chain give about one proof per tick.

A ``Prober`` runs a resource's probes while reads wait for it (and ``linger`` seconds more,
so that the next read finds a proof under way): at most ``max_concurrent`` at once, starts
at least ``stagger`` apart, with backoff after a probe that fails, and within a
process-wide token bucket (``ratelimit.TokenBucket``). So what the upstream sees is bounded whatever clients do.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

import aiohttp
import orjson

from watchcache.backoff import Backoff
from watchcache.cache.events import BOOKMARK, ERROR
from watchcache.cache.object import parse_resource_version
from watchcache.dispatch.cacher import Cacher
from watchcache.ratelimit import TokenBucket
from watchcache.resources import ResourceType
from watchcache.upstream.client import UpstreamClient, UpstreamError, WatchStalled

log = logging.getLogger("watchcache.upstream.probes")

# After a probe's watch is sent, when its nudge (a consistent read) goes: the watch is registered first.
NUDGE_DELAY = 0.1


@dataclass(frozen=True)
class ProbeLimits:
    # The watch's timeoutSeconds: its bookmark is due at timeout - 2 s (kube sends none with 2).
    timeout_seconds: int = 3
    # Probes of one resource in flight at once, and the least time between two starts. A start about
    # every second puts one probe in each of the upstream's one-second bookmark buckets, so every
    # bookmark tick brings a proof (bench_consistent.py against the sim, 8 clients: p99 of
    # consistent LISTs 1.48 s with 0.8 s / 3, 1.54 s with 0.5 s / 4 and twice the probes,
    # 2.2-3.1 s with 0.5 s / 2, which left ticks without a due probe).
    max_concurrent: int = 3
    stagger: float = 0.8
    # Keep probing this long after the last waiting read: the next read finds a proof under way.
    linger: float = 2.0
    # Process-wide probe starts per second (all resources), and the burst allowed above it.
    rate: float = 10.0
    burst: int = 10
    # After a probe that failed (error status, refused, no bookmark): wait, doubling per failure.
    backoff_initial: float = 0.5
    backoff_max: float = 30.0
    # After this many probes in a row ended without a bookmark, a GET or LIST of the resource at an rv
    # the cache has not reached waits for no proof, for ``unprovable_for`` s: it goes to the upstream.
    unprovable_after: int = 3
    unprovable_for: float = 300.0


class Outcome:
    """How a probe ended (the ``outcome`` label of ``watchcache_consistency_probes_total``)."""

    PROVED = "proved"  # a bookmark, and the cache had applied what the probe saw: progress(B)
    NOT_APPLIED = "not_applied"  # a bookmark, but the cache did not apply the probe's events in time
    NO_BOOKMARK = "no_bookmark"  # the watch ended without a bookmark
    REJECTED = "rejected"  # the upstream answered an error (410, 403, 5xx...), in the status or the stream
    FAILED = "failed"  # no answer: refused, reset, stalled
    CANCELLED = "cancelled"  # stopped by the proxy (shutdown)


class Prober:
    """The probes of one resource's cache (one per cacher; see the module doc)."""

    def __init__(
        self,
        client: UpstreamClient,
        cacher: Cacher,
        limits: ProbeLimits,
        budget: TokenBucket,
        outcomes: collections.Counter[tuple[ResourceType, str]],
        *,
        apply_wait: float = 3.0,
        unprovable: bool = False,
    ) -> None:
        """``unprovable``: start out as if ``limits.unprovable_after`` probes had ended without a
        bookmark (``ResourceType.uncached_by_kube``: kube's watches of it send no bookmark)."""
        self.client = client
        self.cacher = cacher
        self.limits = limits
        self.budget = budget
        self.outcomes = outcomes
        # How long a probe waits for the cache to apply the events it saw before its bookmark.
        self.apply_wait = apply_wait
        self.backoff = Backoff(limits.backoff_initial, limits.backoff_max)
        self.demand = 0
        self._last_demand = 0.0
        self._next_start = 0.0
        self._probes: set[asyncio.Task[str]] = set()
        self._pump: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self._nudging = False
        # Probes ended without a bookmark since the last proof; past ``limits.unprovable_after`` of them,
        # until when the resource counts as one the upstream cannot prove (a proof clears it at once).
        self._no_bookmarks = limits.unprovable_after if unprovable else 0
        self._unprovable_until = 0.0
        # Done when a probe ends without a bookmark and none ever ended with one: the upstream serves
        # this resource from its storage (kube-apiserver's events), so the reads waiting for a proof
        # of an rv ahead give up at once (``freshness.reach``) rather than at ``--fresh-wait``.
        self._proofless: asyncio.Future[None] | None = None
        self._ever_proved = False

    @property
    def running(self) -> int:
        """Probes in flight now."""
        return len(self._probes)

    @property
    def unprovable(self) -> bool:
        """``limits.unprovable_after`` probes in a row got no bookmark: the upstream watches this
        resource from its storage, with no bookmarks (kube-apiserver's events). A resource it caches
        may miss one bookmark now and then (kube's timer against a deadline): that takes more than
        one. Every ``limits.unprovable_for`` s one probe looks again, in the background (reads go on
        to the upstream meanwhile: a read that waited for it would wait its whole watch, 3 s, and
        end in a 504 at ``--fresh-wait``); its proof clears the mark, its lack renews it."""
        if self._no_bookmarks < self.limits.unprovable_after:
            return False
        now = time.monotonic()
        if now >= self._unprovable_until and not self._probes and self.budget.take(now) <= 0:
            self._unprovable_until = now + self.limits.unprovable_for
            self._start(now)
        return True

    @contextlib.contextmanager
    def wanted(self) -> Iterator[asyncio.Future[None]]:
        """While entered, probes run (bounded). Its value is done when a probe ends without a
        bookmark, for a resource no probe has ever proved: no proof is coming."""
        self.demand += 1
        if self._pump is None or self._pump.done():
            self._pump = asyncio.ensure_future(self._run())
        else:
            self._changed.set()
        if self._proofless is None:
            self._proofless = asyncio.get_running_loop().create_future()
        try:
            yield self._proofless
        finally:
            self.demand -= 1
            self._last_demand = time.monotonic()

    def stop(self) -> None:
        for task in (self._pump, *self._probes):
            if task is not None:
                task.cancel()

    async def _run(self) -> None:
        limits = self.limits
        while True:
            now = time.monotonic()
            if not self.demand and now - self._last_demand >= limits.linger:
                return
            wait: float | None = self._next_start - now
            if wait is not None and wait <= 0:
                if len(self._probes) >= limits.max_concurrent:
                    wait = None  # until one ends
                else:
                    wait = self.budget.take(now)
                    if wait <= 0:
                        self._start(now)
                        continue
            if not self.demand:
                linger_left = limits.linger - (now - self._last_demand)
                wait = linger_left if wait is None else min(wait, linger_left)
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._changed.wait()

    def _start(self, now: float) -> None:
        self._next_start = now + self.limits.stagger
        task = asyncio.ensure_future(self._probe())
        self._probes.add(task)
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[str]) -> None:
        self._probes.discard(task)
        if task.cancelled():
            outcome = Outcome.CANCELLED
        elif task.exception() is not None:
            log.warning("probe of %s: %r", self.cacher.resource.qualified, task.exception())
            outcome = Outcome.FAILED
        else:
            outcome = task.result()
        self.outcomes[(self.cacher.resource, outcome)] += 1
        if outcome == Outcome.NO_BOOKMARK:
            self._no_bookmarks += 1
            if self._no_bookmarks >= self.limits.unprovable_after:
                self._unprovable_until = max(self._unprovable_until, time.monotonic() + self.limits.unprovable_for)
            if not self._ever_proved and self._proofless is not None:
                self._proofless.set_result(None)
                self._proofless = None
        if outcome == Outcome.PROVED:
            self._ever_proved = True
            self.backoff.reset()
            self._no_bookmarks = 0
            self._unprovable_until = 0.0
        elif outcome != Outcome.CANCELLED:
            # A probe that fails fast must not be restarted at once: that was a loop of hundreds
            # of upstream watches per second for one waiting read.
            self._next_start = max(self._next_start, time.monotonic() + self.backoff.next())
        self._changed.set()

    async def _probe(self) -> str:
        """One probe watch from the cache's rv; ``progress(B)`` at its bookmark (see the module doc)."""
        cacher = self.cacher
        start = cacher.rv
        seen = start
        timeout = self.limits.timeout_seconds
        params = {"resourceVersion": str(start), "allowWatchBookmarks": "true", "timeoutSeconds": str(timeout)}
        nudge = asyncio.ensure_future(self._nudge())
        try:
            async for lines in self.client.watch(cacher.resource, params, stall_timeout=timeout + 2.0):
                for line in lines:
                    event = orjson.loads(line)
                    kind = event.get("type")
                    if kind == ERROR:
                        return Outcome.REJECTED
                    meta = (event.get("object") or {}).get("metadata") or {}
                    rv = parse_resource_version(meta.get("resourceVersion"))
                    if kind != BOOKMARK:
                        seen = max(seen, rv)
                        continue
                    # Everything up to rv was sent on this stream; the cache must hold up to `seen`.
                    # (Returning closes the watch: it has nothing more to give.)
                    if not await cacher.wait_for_rv(seen, self.apply_wait):
                        return Outcome.NOT_APPLIED
                    cacher.progress(rv)
                    return Outcome.PROVED
        except UpstreamError as e:
            log.debug("probe of %s: %s", cacher.resource.qualified, e)
            return Outcome.REJECTED
        except (aiohttp.ClientError, WatchStalled, TimeoutError, OSError, ValueError) as e:
            log.debug("probe of %s failed: %s", cacher.resource.qualified, e)
            return Outcome.FAILED
        finally:
            nudge.cancel()
        return Outcome.NO_BOOKMARK

    async def _nudge(self) -> None:
        """A consistent read of the resource once the probe's watch is open: kube-apiserver then asks
        etcd for progress, so its cache of a resource nobody writes moves to the current rv and sends
        bookmarks at all (its cacher sends none before it has processed an event or a progress
        notification). Without it a probe of such a resource ended without a bookmark, and a read at
        an rv ahead of the cache got 504 after --fresh-wait. One at a time per resource."""
        if self._nudging:
            return
        self._nudging = True
        try:
            await asyncio.sleep(NUDGE_DELAY)
            with contextlib.suppress(UpstreamError, aiohttp.ClientError, TimeoutError, OSError, ValueError, KeyError):
                await self.client.list_rv(self.cacher.resource)
        finally:
            self._nudging = False
