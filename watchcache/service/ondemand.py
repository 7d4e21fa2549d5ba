"""Caches started by reads: the glue of on-demand caching (``dispatch/lifecycle.py`` decides).

The life of a kind that is not cached from the start::

    (not cached) --its first authorized LIST/WATCH--> SYNCING --listed--> CACHED --idle--> (not cached)

While SYNCING its reads are answered as without the cache: passed through (``uncached-resource``),
so no client sees an error kube would not give (kube's own answer while its cache initialises,
KEP-4568, is a 429 for watches; a pass-through is what a client got here before, and costs the
upstream only during the first seconds). Once synced the cache is served exactly as a kind cached
from the start. A kind whose list the upstream refuses (403: the proxy's account may not list it,
500: a failing conversion webhook) stays SYNCING, its reflector backing off, its reads passed
through; its failure is logged, counted (``watchcache_upstream_errors_total``) and shown in
``/readyz?verbose`` and ``/debug/cache``, and it never blocks another kind or readiness.

In a worker group only the worker that owns the kind (``shard/ownership.py``) runs its reflector:
a read on another worker makes a follower there, whose follow request makes the owner start the
cache (``owned``). The owner's cache is not idle while a follower follows it; a follower is idle
as the owner's caches are, and dropping it frees the owner's in turn.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import itertools
import logging
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from watchcache.dispatch.cacher import Cacher
from watchcache.dispatch.lifecycle import CachePolicy, Usage, Why, accounted_bytes, idle, over_budget, seconds
from watchcache.resources import ResourceType
from watchcache.server.context import ApiContext
from watchcache.watchers.watcher import CloseReason

log = logging.getLogger("watchcache.ondemand")

#: Starts a cache of a kind (a reflector, or a follower of the owner's): the cache, and how to stop it.
Starter = Callable[[ResourceType], tuple[Cacher, Callable[[], None]]]


@dataclass
class _Entry:
    cacher: Cacher
    stop: Callable[[], None]
    why: Why
    role: str
    started: float
    synced: float | None = None


class OnDemandCaches:
    """The caches of one worker that reads start (and ``--resources all``'s): see the module doc."""

    def __init__(
        self,
        ctx: ApiContext,
        policy: CachePolicy,
        start_owned: Starter,
        owns: Callable[[ResourceType], bool] = lambda resource: True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ctx = ctx
        self.policy = policy
        self.start_owned = start_owned
        self.owns = owns
        self.clock = clock
        # A follower of the owner's cache (set by the worker's wiring; None: no other worker).
        self.follow: Starter | None = None
        # A follower of a kind cached from the start that another worker owns (the shard's Followers).
        self.follow_from_start: Callable[[ResourceType], Cacher] | None = None
        self.entries: dict[ResourceType, _Entry] = {}
        self.started = 0
        self.stopped: dict[str, int] = {}
        # Reads passed through because their kind's cache was still syncing.
        self.passed_syncing = 0
        # Seconds from the first read to the cache's sync, the last one per kind (/debug/cache).
        self.sync_seconds: dict[str, float] = {}
        # --cache-memory-bytes: each kind's bytes here at the last tick, and the kinds dropped for
        # the budget with their size then (a read starts one again only once it fits).
        self.accounted: dict[ResourceType, int] = {}
        self.too_big: dict[ResourceType, int] = {}
        self.refused_memory = 0
        # Called with a kind whose cache stopped (its protobuf cache goes with it: service/proxy.py).
        self.on_drop: list[Callable[[ResourceType], None]] = []
        # A cache stopped at the last tick: its memory is handed back to the system at this one.
        self._freed = False

    # ------------------------------------------------------------------ reads

    def cacher(self, resource: ResourceType) -> Cacher | None:
        """``ctx.on_demand``: the synced cache of ``resource`` for an authorized read, or None (pass
        it through); starts the cache if the policy lets a read start it."""
        cached = self.ctx.cachers.get(resource)
        if cached is not None:
            return cached
        entry = self.entries.get(resource)
        if entry is None:
            why = self.policy.at_start(resource)
            if why in (Why.DEFAULT, Why.RESOURCES):  # another worker's from-start kind: follow it
                follow = self.follow_from_start
                return follow(resource) if follow is not None and not self.owns(resource) else None
            if self.policy.refusal(resource) is not None or self._does_not_fit(resource):
                return None
            entry = self._start(resource, Why.ON_DEMAND)
            if entry is None:
                return None
        if entry.synced is None and entry.cacher.ready:
            self._synced(resource, entry)
        if entry.synced is None:
            self.passed_syncing += 1
            return None
        return entry.cacher

    def owned(self, resource: ResourceType) -> Cacher | None:
        """This worker's cache of a kind it owns, started if need be, synced or not: what another
        worker's follower follows (the follow server waits for its sync)."""
        cached = self.ctx.cachers.get(resource)
        if cached is not None or not self.owns(resource):
            return cached
        entry = self.entries.get(resource)
        if entry is None:
            if self.policy.refusal(resource) is not None or self._does_not_fit(resource):
                return None
            entry = self._start(resource, self.policy.at_start(resource) or Why.ON_DEMAND)
        return entry.cacher if entry is not None else None

    def pin(self, resource: ResourceType, why: Why) -> Cacher | None:
        """The cache of ``resource`` here, started if need be and never dropped as idle (the CRDs'
        cache, which custom resources follow: ``service/crds.py``); synced or not."""
        cached = self.ctx.cachers.get(resource)
        entry = self.entries.get(resource)
        if entry is None:
            if cached is not None:
                return cached  # cached from the start
            entry = self._start(resource, why)
            if entry is None:
                return None
        entry.why = why
        if entry.synced is None and entry.cacher.ready:
            self._synced(resource, entry)
        return entry.cacher

    def start_all(self, resources: Iterable[ResourceType]) -> None:
        """``--resources all``: every kind this worker owns that is not cached yet, started now."""
        for resource in resources:
            if self.policy.at_start(resource) is Why.ALL and self.owns(resource) and resource not in self.entries:
                self._start(resource, Why.ALL)

    def _start(self, resource: ResourceType, why: Why) -> _Entry | None:
        if self.owns(resource):
            cacher, stop = self.start_owned(resource)
            role = "owner"
        elif self.follow is not None:
            cacher, stop = self.follow(resource)
            role = "follower"
        else:
            return None
        entry = self.entries[resource] = _Entry(cacher, stop, why, role, self.clock())
        self.started += 1
        if why is Why.ON_DEMAND:
            what = "a reflector" if role == "owner" else "a follower of its owner"
            log.info("caching %s on demand: its first read started %s", resource.path_id(), what)
        return entry

    def _synced(self, resource: ResourceType, entry: _Entry) -> None:
        entry.synced = self.clock()
        self.ctx.cachers[resource] = entry.cacher
        took = entry.synced - entry.started
        self.sync_seconds[resource.path_id()] = took
        log.info(
            "caching %s (%s): synced %.2fs after it started, %d objects",
            resource.path_id(),
            entry.why.value,
            took,
            len(entry.cacher.cache),
        )

    # ------------------------------------------------------------------ the memory budget

    def usage(self) -> dict[ResourceType, int]:
        """Each kind's accounted bytes in this worker: its cache (owned or followed) and its protobuf cache."""
        out: dict[ResourceType, int] = {}
        for cacher in [*self.ctx.cachers.values(), *self.ctx.more_cachers()]:
            size = accounted_bytes(cacher.cache.stats(), _derived_per_object(cacher))
            out[cacher.resource] = out.get(cacher.resource, 0) + size
        return out

    def _does_not_fit(self, resource: ResourceType) -> bool:
        """A kind dropped for the budget starts again only once its size then fits in it now."""
        size = self.too_big.get(resource)
        if size is None:
            return False
        if sum(self.accounted.values()) + size <= self.policy.memory_bytes:
            del self.too_big[resource]
            return False
        self.refused_memory += 1
        return True

    def _enforce_budget(self) -> None:
        budget = self.policy.memory_bytes
        self.accounted = usage = self.usage()
        if budget <= 0:
            return
        droppable = {r for r, e in self.entries.items() if e.why in (Why.ON_DEMAND, Why.ALL)}
        weights = [
            Usage(r.path_id(), size, self.entries[r].cacher.last_used if r in droppable else 0.0, r not in droppable)
            for r, size in usage.items()
        ]
        by_name = {r.path_id(): r for r in usage}
        total = sum(usage.values())
        dropping = over_budget(weights, budget)
        for name in dropping:
            resource = by_name[name]
            size = usage[resource]
            log.warning(
                "caching %s stopped: over --cache-memory-bytes (this worker's caches hold %d of %d bytes; "
                "%s holds %d, the least recently read); its reads pass through until it fits again",
                resource.path_id(),
                total,
                budget,
                name,
                size,
            )
            self.too_big[resource] = size
            self.drop(resource, "memory")
            total -= size
        if dropping:
            self.accounted = self.usage()

    # ------------------------------------------------------------------ housekeeping

    def housekeeping(self) -> None:
        """Each tick: publish the caches that synced, stop the on-demand ones nobody reads, keep to the budget."""
        if self._freed:
            self._freed = False
            _give_back()
        now = self.clock()
        for resource, entry in list(self.entries.items()):
            cacher = entry.cacher
            if entry.synced is None and cacher.ready:
                self._synced(resource, entry)
            if entry.why is not Why.ON_DEMAND:
                continue
            if idle(now, cacher.last_used, len(cacher.dispatcher), len(cacher.replicas), self.policy.idle):
                self.drop(resource, "idle", f"no read for {seconds(self.policy.idle)}")
        self._enforce_budget()

    def drop(self, resource: ResourceType, reason: str, detail: str = "") -> bool:
        """Stop the cache of ``resource`` and free it; its watches end (the client watches again,
        as when kube's cache of a kind stops). The next read starts it again."""
        entry = self.entries.pop(resource, None)
        if entry is None:
            return False
        cacher = entry.cacher
        if self.ctx.cachers.get(resource) is cacher:
            del self.ctx.cachers[resource]
        for watcher in list(cacher.dispatcher.watchers()):
            watcher.close(CloseReason.CACHE_STOPPED)
        entry.stop()
        cacher.stop()
        for dropped in self.on_drop:
            dropped(resource)
        self._freed = True
        self.stopped[reason] = self.stopped.get(reason, 0) + 1
        log.info("caching %s stopped (%s)%s", resource.path_id(), reason, f": {detail}" if detail else "")
        return True

    def stop(self) -> None:
        for entry in self.entries.values():
            entry.stop()

    def cachers(self) -> list[Cacher]:
        """The caches syncing (the synced ones are in ``ctx.cachers``): ticked and counted as the others."""
        return [e.cacher for e in self.entries.values() if e.synced is None]

    # ------------------------------------------------------------------ status

    def status(self) -> dict[str, Any]:
        """Per kind: why it is cached, its state, how long its sync took; and the policy (JSON-able)."""
        now, wall = self.clock(), time.time()
        failures = self.ctx.upstream_failures
        kinds = {}
        for resource, entry in self.entries.items():
            failure = failures.for_resource(resource) if failures is not None else None
            failing = failures is not None and resource in failures.failing
            kinds[resource.path_id()] = {
                "why": entry.why.value,
                "role": entry.role,
                "state": "cached" if entry.synced is not None else "syncing",
                "seconds": round(now - entry.started, 3),
                "sync_seconds": round(entry.synced - entry.started, 3) if entry.synced is not None else None,
                "last_upstream_error": failure.as_json(wall) if failure is not None and failing else None,
            }
        for resource, size in self.accounted.items():
            if resource.path_id() in kinds:
                kinds[resource.path_id()]["accounted_bytes"] = size
        return {
            "on_demand": self.policy.on_demand,
            "idle": seconds(self.policy.idle),
            "memory_budget_bytes": self.policy.memory_bytes,
            "accounted_bytes": sum(self.accounted.values()),
            "over_budget": sorted(r.path_id() for r in self.too_big),
            "refused_over_budget": self.refused_memory,
            "kinds": kinds,
            "started": self.started,
            "stopped": dict(self.stopped),
            "passed_through_syncing": self.passed_syncing,
        }


def _give_back() -> None:
    """Return a stopped cache's memory to the system: Python keeps freed memory in its heap (RSS stayed
    at its peak after a 25 MB cache was dropped), glibc's ``malloc_trim`` hands the free pages back."""
    gc.collect()
    name = ctypes.util.find_library("c")
    if name is None:
        return
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None)
    if trim is not None:
        trim(0)


def _derived_per_object(cacher: Cacher, sample: int = 32) -> float:
    """The average bytes of the encodings derived from a cached object (its metadata in JSON and in
    protobuf, its Table row), from the first ``sample`` objects: an estimate, O(sample) per tick."""
    objects = list(itertools.islice(cacher.cache.snapshot().iter_range("", None), sample))
    if not objects:
        return 0.0
    total = 0
    for obj in objects:
        for derived in (obj.meta_json, obj.meta_pb, obj.table_row):
            if isinstance(derived, (bytes, bytearray)):
                total += len(derived)
            elif derived is not None:
                total += sys.getsizeof(derived)
    return total / len(objects)


class OnDemandCollector(Collector):
    """The caches reads start: started, stopped by reason, reads passed through while syncing, and
    each kind's accounted bytes against --cache-memory-bytes."""

    def __init__(self, ondemand: OnDemandCaches) -> None:
        self.ondemand = ondemand

    def collect(self) -> Iterator[Metric]:
        od = self.ondemand
        started = CounterMetricFamily("watchcache_caches_started", "Caches started by a read (or --resources all)")
        started.add_metric([], od.started)
        yield started
        stopped = CounterMetricFamily(
            "watchcache_caches_stopped", "Caches stopped: idle, memory (--cache-memory-bytes), crd", labels=["reason"]
        )
        for reason, count in sorted(od.stopped.items()):
            stopped.add_metric([reason], count)
        yield stopped
        syncing = CounterMetricFamily(
            "watchcache_reads_passed_while_syncing", "Reads passed through while their kind's cache was syncing"
        )
        syncing.add_metric([], od.passed_syncing)
        yield syncing
        refused = CounterMetricFamily(
            "watchcache_reads_passed_over_budget", "Reads of a kind dropped for the memory budget, passed through"
        )
        refused.add_metric([], od.refused_memory)
        yield refused
        budget = GaugeMetricFamily("watchcache_cache_memory_budget_bytes", "--cache-memory-bytes (0: none)")
        budget.add_metric([], od.policy.memory_bytes)
        yield budget
        accounted = GaugeMetricFamily(
            "watchcache_cache_memory_bytes",
            "A kind's accounted bytes in this worker: objects, history, indexes, derived encodings (an estimate)",
            labels=["group", "resource"],
        )
        for resource, size in sorted(od.accounted.items(), key=lambda item: item[0].qualified):
            accounted.add_metric([resource.group, resource.resource], size)
        yield accounted
