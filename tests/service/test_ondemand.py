"""OnDemandCaches and CustomResources without processes: starters that record what they start, caches
synced by hand, a clock moved by hand. The e2e tier (tests/e2e/test_ondemand.py) runs the real ones."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from tests.support.handlers import FakeUpstream, arun
from watchcache.cache.continuetoken import ContinueCodec
from watchcache.cache.store import CacheConfig
from watchcache.dispatch.cacher import Cacher
from watchcache.dispatch.lifecycle import CachePolicy, Why
from watchcache.resources import CONFIGMAPS, PODS, ResourceRegistry, ResourceType
from watchcache.server.context import ApiContext
from watchcache.service.crds import CustomResources
from watchcache.service.ondemand import OnDemandCaches
from watchcache.upstream.discovery import resource_types_from_crd
from watchcache.watchers.flush import FlushScheduler


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Starts:
    """A starter that makes a cache and records each start and stop."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.started: list[str] = []
        self.stopped: list[str] = []

    def __call__(self, resource: ResourceType) -> tuple[Cacher, Callable[[], None]]:
        self.started.append(resource.qualified)
        return Cacher(resource, CacheConfig(), self.clock), lambda: self.stopped.append(resource.qualified)


def caches(policy: CachePolicy, types: tuple[ResourceType, ...] = (PODS, CONFIGMAPS)) -> tuple[OnDemandCaches, Starts]:
    clock = Clock()
    ctx = ApiContext(
        registry=ResourceRegistry(types),
        cachers={},
        upstream=FakeUpstream(),
        codec=ContinueCodec(b"t" * 32),
        flusher=FlushScheduler(asyncio.get_running_loop()),
    )
    starts = Starts(clock)
    return OnDemandCaches(ctx, policy, starts, clock=clock), starts


@arun
async def test_the_first_read_starts_one_cache_and_reads_pass_through_until_it_has_synced() -> None:
    ondemand, starts = caches(CachePolicy(from_start=frozenset({("", "v1", "pods")})))
    assert ondemand.cacher(CONFIGMAPS) is None and ondemand.cacher(CONFIGMAPS) is None
    assert starts.started == ["configmaps"] and ondemand.passed_syncing == 2
    started = ondemand.entries[CONFIGMAPS].cacher
    started.replace([], 7)
    assert ondemand.cacher(CONFIGMAPS) is started and ondemand.ctx.cachers[CONFIGMAPS] is started
    assert ondemand.status()["kinds"]["configmaps"]["state"] == "cached"
    assert ondemand.cacher(PODS) is None and starts.started == ["configmaps"], "a from-start kind is not started"


@arun
async def test_an_excluded_kind_or_without_on_demand_nothing_starts() -> None:
    for policy in (
        CachePolicy(excluded=frozenset({("", "v1", "configmaps")})),
        CachePolicy(on_demand=False),
    ):
        ondemand, starts = caches(policy)
        assert ondemand.cacher(CONFIGMAPS) is None and ondemand.owned(CONFIGMAPS) is None
        assert starts.started == []


@arun
async def test_an_unread_kind_stops_and_the_next_read_starts_it_again() -> None:
    ondemand, starts = caches(CachePolicy(idle=600.0))
    ondemand.cacher(CONFIGMAPS)
    cacher = ondemand.entries[CONFIGMAPS].cacher
    cacher.replace([], 7)
    clock = starts.clock
    ondemand.housekeeping()
    assert ondemand.ctx.cachers[CONFIGMAPS] is cacher
    clock.now += 599.0
    ondemand.housekeeping()
    assert starts.stopped == []
    cacher.replicas.append(object())  # type: ignore[arg-type]  # a follower in another worker
    clock.now += 10.0
    ondemand.housekeeping()
    assert starts.stopped == [], "a followed cache is read"
    cacher.replicas.clear()
    ondemand.housekeeping()
    assert starts.stopped == ["configmaps"] and CONFIGMAPS not in ondemand.ctx.cachers
    assert ondemand.status()["stopped"] == {"idle": 1}
    assert ondemand.cacher(CONFIGMAPS) is None and starts.started == ["configmaps", "configmaps"]


@arun
async def test_a_kind_another_worker_owns_is_followed_and_its_owner_starts_it_for_the_follower() -> None:
    ondemand, starts = caches(CachePolicy())
    ondemand.owns = lambda resource: resource is not CONFIGMAPS
    assert ondemand.cacher(CONFIGMAPS) is None and starts.started == [], "no follower without a group"
    follows = Starts(starts.clock)
    ondemand.follow = follows
    ondemand.cacher(CONFIGMAPS)
    assert follows.started == ["configmaps"] and starts.started == []
    assert ondemand.status()["kinds"]["configmaps"]["role"] == "follower"
    # The owner's side: a follow request for a kind it owns starts it there, synced or not.
    owner, owner_starts = caches(CachePolicy())
    assert owner.owned(CONFIGMAPS) is owner.entries[CONFIGMAPS].cacher and owner_starts.started == ["configmaps"]


def crd(plural: str, versions: tuple[str, ...] = ("v1",), scope: str = "Namespaced", **extra: Any) -> dict[str, Any]:
    kind = plural.removesuffix("s").capitalize()
    names = {"plural": plural, "singular": kind.lower(), "kind": kind, "listKind": f"{kind}List"}
    return {
        "metadata": {"name": f"{plural}.example.com"},
        "spec": {
            "group": "example.com",
            "names": names,
            "scope": scope,
            "versions": [{"name": v, "served": True, "storage": v == versions[0]} for v in versions],
        },
        "status": {"acceptedNames": names, "conditions": [{"type": "Established", "status": "True"}]},
        **extra,
    }


def test_a_crd_makes_one_kind_per_served_version_once_established() -> None:
    types = resource_types_from_crd(crd("widgets", ("v1", "v2")))
    assert [(t.group, t.version, t.resource, t.kind, t.namespaced) for t in types] == [
        ("example.com", "v1", "widgets", "Widget", True),
        ("example.com", "v2", "widgets", "Widget", True),
    ]
    assert all(t.custom and not t.known_fields for t in types)
    pending = crd("widgets")
    pending["status"]["conditions"] = [{"type": "Established", "status": "False"}]
    assert resource_types_from_crd(pending) == []
    not_served = crd("widgets")
    not_served["spec"]["versions"][0]["served"] = False
    assert resource_types_from_crd(not_served) == []


@arun
async def test_custom_resources_follow_their_crds_created_changed_and_deleted() -> None:
    aggregated = ResourceType("metrics.k8s.io", "v1beta1", "pods", "PodMetrics", True)
    ondemand, starts = caches(CachePolicy(), (PODS, aggregated))
    registry = ondemand.ctx.registry
    custom = CustomResources(ondemand)
    custom.sync(registry, [crd("widgets", ("v1", "v2"))])
    widgets = registry.get("example.com", "v1", "widgets")
    assert widgets is not None and registry.get("example.com", "v2", "widgets") is not None
    # A read caches it; a watcher is on it.
    ondemand.cacher(widgets)
    ondemand.entries[widgets].cacher.replace([], 3)
    assert ondemand.cacher(widgets) is not None
    # The same CRDs again: nothing moves.
    custom.sync(registry, [crd("widgets", ("v1", "v2"))])
    assert starts.stopped == [] and ondemand.ctx.cachers.get(widgets) is not None
    # v1 no longer served: its cache stops and the kind is gone; v2 stays.
    custom.sync(registry, [crd("widgets", ("v2",))])
    assert starts.stopped == ["widgets.example.com"] and registry.get("example.com", "v1", "widgets") is None
    assert registry.get("example.com", "v2", "widgets") is not None
    # A changed scope: a new type for v2, its cache (had it one) stopped.
    v2 = registry.get("example.com", "v2", "widgets")
    assert v2 is not None
    ondemand.cacher(v2)
    custom.sync(registry, [crd("widgets", ("v2",), scope="Cluster")])
    changed = registry.get("example.com", "v2", "widgets")
    assert changed is not None and not changed.namespaced and v2 not in ondemand.entries
    # Deleted: gone; the aggregated API's kind (no CRD) is untouched.
    custom.sync(registry, [])
    assert registry.get("example.com", "v2", "widgets") is None
    assert registry.get("metrics.k8s.io", "v1beta1", "pods") is aggregated
    assert (custom.added, custom.removed, custom.changed) == (2, 2, 1)
    assert ondemand.status()["stopped"] == {"crd": 2}


@arun
async def test_the_crds_cache_is_pinned_and_never_idle() -> None:
    crds = ResourceType("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False)
    ondemand, starts = caches(CachePolicy(idle=1.0), (PODS, crds))
    custom = CustomResources(ondemand)
    custom.housekeeping()
    assert starts.started == ["customresourcedefinitions.apiextensions.k8s.io"]
    assert ondemand.entries[crds].why is Why.CRDS
    ondemand.entries[crds].cacher.replace([], 1)
    custom.housekeeping()
    starts.clock.now += 100.0
    ondemand.housekeeping()
    assert starts.stopped == [] and ondemand.ctx.cachers[crds].ready


@arun
async def test_over_the_budget_the_least_recently_read_kinds_go_and_come_back_only_when_they_fit() -> None:
    from tests.support.factories import pod

    ondemand, starts = caches(CachePolicy(from_start=frozenset({("", "v1", "pods")}), memory_bytes=35_000))
    clock = starts.clock
    pinned = Cacher(PODS, CacheConfig(), clock)
    pinned.replace([pod(f"p{i}", rv=i + 1) for i in range(20)], 30)
    ondemand.ctx.cachers[PODS] = pinned
    secrets = ResourceType("", "v1", "secrets", "Secret", True)
    for kind in (CONFIGMAPS, secrets):
        ondemand.cacher(kind)
        ondemand.entries[kind].cacher.replace([pod(f"x{i}", rv=i + 1) for i in range(10)], 30)
        clock.now += 1.0
        ondemand.cacher(kind)  # published, and read now
        ondemand.entries[kind].cacher.last_used = clock.now
    ondemand.housekeeping()
    usage = ondemand.usage()
    # Each kind: its JSON plus 800 B per object (pods 20 objects, the others 10): pods and one more
    # fit, not all three; configmaps, read least recently, go.
    assert usage[PODS] > usage[secrets] > 8_000 and usage[PODS] + usage[secrets] <= 35_000
    assert starts.stopped == ["configmaps"] and ondemand.status()["stopped"] == {"memory": 1}
    assert PODS in ondemand.ctx.cachers, "a --resources kind is never dropped"
    assert sum(ondemand.accounted.values()) <= 35_000
    # Back only when it fits: not now.
    assert ondemand.cacher(CONFIGMAPS) is None and ondemand.refused_memory == 1
    ondemand.ctx.cachers.pop(PODS)
    ondemand.housekeeping()
    ondemand.cacher(CONFIGMAPS)
    assert starts.started.count("configmaps") == 2
