"""Consistent reads: prove the cache is as new as the upstream was when the request arrived.

A "Most Recent" GET/LIST (resourceVersion unset) must never return data older than the
upstream's state at the time of the request. Procedure, per request:

1. **Target.** ``R0`` = the upstream's current resourceVersion, from a consistent LIST
   with ``limit=1`` started *after* the request arrived. Concurrent requests share one
   such LIST, but only one that started after they arrived (single flight per generation).
2. **Easy case.** If the cache's rv reaches ``R0`` (now or within a short wait, as events
   arrive), serve from the cache.
3. **Quiet resource.** A resource with no recent writes has a cache rv far behind ``R0``
   (etcd revisions are global; the upstream sends bookmarks about once a minute). A
   *probe watch* from the cache's rv ``C`` (``allowWatchBookmarks``, short ``timeoutSeconds``)
   returns every event after ``C`` in order and then, before its timeout, a BOOKMARK at
   ``B``: a promise that every event with rv ≤ ``B`` was sent on that stream. Let ``E`` be
   the largest event rv the probe saw (``C`` if none). Once the cache has applied ``E``
   (its own stream delivers the same ordered history), there is provably no event in
   ``(E, B]``, so the cache's state *is* the state at ``B`` and ``progress(B)`` is sound.
   If ``B ≥ R0`` the read is served from the cache.
4. **Otherwise** (no proof within ``fresh_wait``): the request passes through to the
   upstream. A stale read is a correctness bug; a pass-through is only a cost.

Why the probe's bookmark arrives quickly: kube-apiserver sends a watcher a bookmark 2 s
before its deadline, and before every bookmark has sent all events up to the bookmark's
rv; a probe with ``timeoutSeconds=3`` gets it after about 1 s. Its rv is the upstream
cache's rv, which step 1's consistent LIST has just made fresh (kube ≥ 1.31 serves it
from the watch cache after requesting etcd progress).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable

import aiohttp
import orjson

from watchcache.cache.events import BOOKMARK, ERROR
from watchcache.cache.object import parse_resource_version
from watchcache.dispatch.cacher import Cacher
from watchcache.resources import ResourceType
from watchcache.upstream.client import UpstreamClient, UpstreamError, WatchStalled

log = logging.getLogger("watchcache.upstream.consistency")


class _SingleFlight:
    """The upstream rv, fetched by at most one request at a time per resource.

    A caller joins the fetch that starts *after* it arrived: a fetch already in flight
    might have read the rv before the caller's request existed.
    """

    def __init__(self, fetch: Callable[[], Awaitable[int]]) -> None:
        self._fetch = fetch
        self._current: asyncio.Future[int] | None = None
        self._next: asyncio.Future[int] | None = None

    async def get(self) -> int:
        if self._current is None:
            self._current = asyncio.ensure_future(self._run())
            return await asyncio.shield(self._current)
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
        return await asyncio.shield(self._next)

    async def _run(self) -> int:
        try:
            return await self._fetch()
        finally:
            waiting, self._next = self._next, None
            self._current = None
            if waiting is not None:
                self._current = asyncio.ensure_future(self._run())
                self._current.add_done_callback(functools.partial(_copy_result, dst=waiting))


def _copy_result(src: asyncio.Future[int], *, dst: asyncio.Future[int]) -> None:
    if dst.done():
        return
    if src.cancelled():
        dst.cancel()
    elif src.exception() is not None:
        dst.set_exception(src.exception())  # type: ignore[arg-type]
    else:
        dst.set_result(src.result())


class ConsistentReads:
    def __init__(self, client: UpstreamClient, *, fresh_wait: float = 3.0, probe_timeout: int = 3) -> None:
        self.client = client
        self.fresh_wait = fresh_wait
        self.probe_timeout = probe_timeout
        self._targets: dict[ResourceType, _SingleFlight] = {}
        self._probes: dict[ResourceType, asyncio.Task[None]] = {}
        self._advancing: dict[ResourceType, asyncio.Task[bool]] = {}
        # Per resource: consistent reads proven fresh (served from cache) / not (passed through).
        self.served_from_cache: dict[ResourceType, int] = {}
        self.passed_through: dict[ResourceType, int] = {}

    def _target(self, resource: ResourceType) -> _SingleFlight:
        flight = self._targets.get(resource)
        if flight is None:
            flight = self._targets[resource] = _SingleFlight(lambda: self.client.list_rv(resource))
        return flight

    async def ensure_fresh(self, cacher: Cacher, target: int | None = None) -> bool:
        """True once the cache provably holds the upstream's state as of this call.

        With ``target`` (a NotOlderThan/Exact read at an rv the cache has not reached): True
        once the cache provably reached ``target``, by events or by a probe's proof.
        """
        deadline = time.monotonic() + self.fresh_wait
        consistent = target is None
        if target is None:
            try:
                target = await asyncio.wait_for(self._target(cacher.resource).get(), self.fresh_wait)
            except (UpstreamError, aiohttp.ClientError, TimeoutError, OSError, KeyError, ValueError) as e:
                log.debug("consistent read of %s: no upstream rv (%s)", cacher.resource.qualified, e)
                self._count(self.passed_through, cacher.resource)
                return False
        reached = await self._reach(cacher, target, deadline)
        if consistent:
            self._count(self.served_from_cache if reached else self.passed_through, cacher.resource)
        return reached

    def advance(self, cacher: Cacher) -> None:
        """In the background, bring the cache to the upstream's current rv (at most one at a time per resource).

        Not a client read, so not counted in the consistent-read metrics: used after a relist,
        whose group rv must not stay the cache's head (see ``ResourceCache.relist``).
        """
        task = self._advancing.get(cacher.resource)
        if task is None or task.done():
            self._advancing[cacher.resource] = asyncio.ensure_future(self._advance(cacher))

    async def _advance(self, cacher: Cacher) -> bool:
        try:
            target = await asyncio.wait_for(self._target(cacher.resource).get(), self.fresh_wait)
        except (UpstreamError, aiohttp.ClientError, TimeoutError, OSError, KeyError, ValueError):
            return False
        return await self._reach(cacher, target, time.monotonic() + self.fresh_wait)

    async def _reach(self, cacher: Cacher, target: int, deadline: float) -> bool:
        """Wait for events to bring the cache to ``target``; probe (again) while they do not."""
        if cacher.rv >= target or await cacher.wait_for_rv(target, min(0.05, self.fresh_wait)):
            return True
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return cacher.rv >= target
            probe = self._start_probe(cacher)
            reached = asyncio.ensure_future(cacher.wait_for_rv(target, remaining))
            await asyncio.wait({probe, reached}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            if reached.done() and reached.result():
                return True
            if not reached.done():
                reached.cancel()
            if cacher.rv >= target:
                return True

    @staticmethod
    def _count(counts: dict[ResourceType, int], resource: ResourceType) -> None:
        counts[resource] = counts.get(resource, 0) + 1

    def _start_probe(self, cacher: Cacher) -> asyncio.Task[None]:
        task = self._probes.get(cacher.resource)
        if task is None or task.done():
            task = self._probes[cacher.resource] = asyncio.ensure_future(self._probe(cacher))
        return task

    async def _probe(self, cacher: Cacher) -> None:
        """One probe watch from the cache's rv; advances the cache at its bookmark (see module doc)."""
        start = cacher.rv
        seen = start
        params = {
            "resourceVersion": str(start),
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(self.probe_timeout),
        }
        try:
            async for lines in self.client.watch(cacher.resource, params, stall_timeout=self.probe_timeout + 2.0):
                for line in lines:
                    event = orjson.loads(line)
                    kind = event.get("type")
                    meta = (event.get("object") or {}).get("metadata") or {}
                    if kind == ERROR:
                        return
                    rv = parse_resource_version(meta.get("resourceVersion"))
                    if kind != BOOKMARK:
                        seen = max(seen, rv)
                        continue
                    # Everything up to rv was sent on this stream; the cache must hold up to `seen`.
                    if await cacher.wait_for_rv(seen, self.fresh_wait):
                        cacher.progress(rv)
                    return
        except (UpstreamError, aiohttp.ClientError, WatchStalled, TimeoutError, OSError, ValueError) as e:
            log.debug("probe of %s failed: %s", cacher.resource.qualified, e)
