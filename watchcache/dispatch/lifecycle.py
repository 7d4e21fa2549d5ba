"""Which kinds are cached, why, and when a cache stops: the decisions of on-demand caching, free of I/O.

kube-apiserver keeps a watch cache for every resource it serves. The proxy caches a few kinds
from the start (``--resources``, by default the kinds every cluster reads: pods, nodes, ...),
and every other list-watchable kind the upstream serves on its first LIST or WATCH
(``--cache-on-demand``, the default). A kind started by a read stops when nobody has read it for
``--cache-idle`` seconds (no watcher, no follower replica, no read): its memory is freed, and the
next read starts it again. The glue that starts and stops reflectors is ``service/ondemand.py``;
this module only decides.

Kinds are named as ``--resources`` names them (``pods``, ``apps/v1/deployments``), parsed to
(group, version, resource) by the caller: this module compares triples.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass

from watchcache.cache.store import CacheStats
from watchcache.resources import ResourceType

GVR = tuple[str, str, str]
SECRETS: GVR = ("", "v1", "secrets")


class Why(enum.Enum):
    """Why a kind is cached (``/debug/cache`` and ``/readyz?verbose`` say it)."""

    RESOURCES = "--resources"  # named: cached from the start, readiness waits for it
    DEFAULT = "default"  # in the default set: the same
    ALL = "--resources all"  # every list-watchable kind from the start; readiness does not wait
    ON_DEMAND = "on demand"  # started by its first LIST or WATCH
    CRDS = "custom resources follow it"  # the CRDs: cached while the proxy runs (service/crds.py)


@dataclass(frozen=True)
class CachePolicy:
    """What the flags say about every kind. ``from_start``: the kinds readiness waits for."""

    from_start: frozenset[GVR] = frozenset()
    # The from-start kinds come from the default set (not named by the operator).
    defaults: bool = True
    # --resources all: every list-watchable kind is started at once.
    all_kinds: bool = False
    # --cache-exclude: never cached (passed through), whatever else says.
    excluded: frozenset[GVR] = frozenset()
    # --cache-on-demand: a read starts the cache of a kind not cached yet.
    on_demand: bool = True
    # --cache-idle: seconds unread after which an on-demand cache stops (0: never).
    idle: float = 600.0
    # False with --authentication none: anyone who reaches the port could read every cached Secret,
    # so Secrets are cached only if --resources names them.
    secrets_on_demand: bool = True
    # --cache-memory-bytes: what this worker's caches may hold (0: no budget).
    memory_bytes: int = 0

    @staticmethod
    def gvr(resource: ResourceType) -> GVR:
        return (resource.group, resource.version, resource.resource)

    def at_start(self, resource: ResourceType) -> Why | None:
        """Why ``resource`` is cached from the start (None: it is not)."""
        gvr = self.gvr(resource)
        if gvr in self.excluded:
            return None
        if gvr in self.from_start:
            return Why.DEFAULT if self.defaults else Why.RESOURCES
        if self.all_kinds and self.refusal(resource) is None:
            return Why.ALL
        return None

    def refusal(self, resource: ResourceType) -> str | None:
        """Why a read of ``resource`` may not start its cache (None: it may)."""
        gvr = self.gvr(resource)
        if gvr in self.excluded:
            return "excluded (--cache-exclude)"
        if gvr == SECRETS and not self.secrets_on_demand and gvr not in self.from_start:
            return "secrets with --authentication none: cached only if --resources names them"
        if gvr in self.from_start:
            return None
        if not (self.on_demand or self.all_kinds):
            return "not in --resources (--no-cache-on-demand)"
        return None

    def started_by_read(self, resource: ResourceType) -> bool:
        """A read of ``resource`` starts its cache (it is not one of the kinds started at start)."""
        return self.at_start(resource) is None and self.refusal(resource) is None


def idle(now: float, last_used: float, watchers: int, replicas: int, idle_after: float) -> bool:
    """An on-demand cache nobody reads: no watcher here, no follower replica elsewhere, and no read
    for ``idle_after`` seconds (0 or less: never idle)."""
    if idle_after <= 0 or watchers or replicas:
        return False
    return now - last_used >= idle_after


# What a cached object costs beyond its JSON bytes: its CachedObject, key, labels and fields, and its
# entries in the store's indexes; and what an event of the history window costs beyond its object's
# JSON. Measured with tracemalloc on 20,000 ConfigMaps with 2 labels (~190 B of JSON each): 800 B
# per object, 1,130 B per event including its object's JSON. An estimate, on the safe side for
# larger objects (the overhead hardly grows with the JSON).
OBJECT_OVERHEAD = 800
EVENT_OVERHEAD = 950


def accounted_bytes(stats: CacheStats, derived_per_object: float = 0.0) -> int:
    """A cache's memory: its objects' JSON and overhead, its history window's, and the encodings
    derived from its objects (metadata, protobuf ObjectMeta, Table rows: ``derived_per_object``, an
    average sampled by the caller)."""
    objects = stats.object_bytes + stats.objects * (OBJECT_OVERHEAD + derived_per_object)
    history = stats.history_bytes + stats.history_events * EVENT_OVERHEAD
    return int(objects + history)


@dataclass(frozen=True)
class Usage:
    """One cache's weight, for the memory budget: its bytes and when it was last read."""

    name: str
    bytes: int
    last_read: float
    # A kind readiness waits for (--resources): dropped last, and only if nothing else is left.
    pinned: bool = False


def over_budget(caches: Iterable[Usage], budget: int) -> list[str]:
    """The caches to drop so that the rest fit in ``budget`` bytes: least recently read first, the
    pinned ones only after every other (0 or less: no budget)."""
    if budget <= 0:
        return []
    ordered = sorted(caches, key=lambda u: (u.pinned, u.last_read, -u.bytes))
    total = sum(u.bytes for u in ordered)
    drop: list[str] = []
    for usage in ordered:
        if total <= budget:
            break
        if usage.pinned:
            break  # never the kinds readiness waits for: the budget is for what reads start
        drop.append(usage.name)
        total -= usage.bytes
    return drop


def seconds(value: float) -> str:
    """``600s`` or ``never``: how the logs and ``/debug/cache`` say a duration flag."""
    return "never" if value <= 0 or math.isinf(value) else f"{value:g}s"
