"""dispatch/metrics.py: the caches' families from real cachers (owner or follower replica), and the backfills'."""

from __future__ import annotations

import asyncio

from harness.doubles import NullSink
from tests.support.collectors import CM, POD, k, scrape
from tests.support.factories import pod
from watchcache.cache.events import ADDED, DELETED, MODIFIED
from watchcache.cache.predicate import SelectionPredicate
from watchcache.cache.store import Span
from watchcache.dispatch.backfill import BackfillFailed, Backfills, Fetched, reach_back
from watchcache.dispatch.cacher import Cacher
from watchcache.dispatch.metrics import BackfillCollector, CacherCollector
from watchcache.resources import CONFIGMAPS, PODS
from watchcache.watchers.watcher import Watcher

POD_OWNER = {**POD, "replica": "owner"}


CM_FOLLOWER = {**CM, "replica": "follower"}


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_the_caches_families_per_resource() -> None:
    clock = Clock(1000.0)
    pods = Cacher(PODS, clock=clock)
    pods.replace([pod("a", rv=10), pod("b", rv=10), pod("c", rv=10)], 10)
    watcher = Watcher(PODS, SelectionPredicate.parse(PODS, None, "", ""), 10, NullSink())
    pods.add_watcher(watcher)
    clock.now = 1001.0
    pods.apply([(MODIFIED, pod("a", rv=11)), (ADDED, pod("d", rv=12))])
    pods.apply([(DELETED, pod("b", rv=13))])
    clock.now = 1004.5
    # What LISTs, watches and the fan-out count (through the Cacher.count_* methods).
    pods.lists, pods.list_fetched, pods.list_returned = 2, 7, 5
    pods.watch_frames_sent, pods.watch_bytes_sent = 3, 4096
    pods.watchers_lagged, pods.watchers_caught_up, pods.watchers_expired, pods.watchers_terminated = 4, 3, 1, 1
    pods.count_failure("flush")
    configmaps = Cacher(CONFIGMAPS, clock=clock)  # never synced
    stats = pods.cache.stats()

    # This worker owns pods; configmaps is a follower replica.
    collector = CacherCollector({PODS: pods, CONFIGMAPS: configmaps}, owns=lambda resource: resource == PODS)
    samples, types = scrape(collector)

    expected = {
        k("apiserver_watch_cache_resource_version", **POD_OWNER): 13,
        k("watchcache_cached_objects", **POD_OWNER): 3,  # a, c, d
        k("watchcache_history_events", **POD_OWNER): 3,
        k("watchcache_history_seconds", **POD_OWNER): 3.5,  # the oldest event entered at 1001
        k("watchcache_history_oldest_resource_version", **POD_OWNER): 10,
        k("apiserver_registered_watchers", **POD_OWNER): 1,
        k("apiserver_longrunning_requests", **POD_OWNER, verb="WATCH"): 1,
        k("watchcache_cache_ready", **POD_OWNER): 1,
        k("apiserver_watch_cache_events_received_total", **POD_OWNER): 3,
        k("apiserver_watch_cache_events_dispatched_total", **POD_OWNER): 3,  # 3 events to the one watcher
        k("apiserver_watch_cache_initializations_total", **POD_OWNER): 1,
        k("apiserver_terminated_watchers_total", **POD_OWNER): 1,
        k("apiserver_cache_list_total", **POD_OWNER): 2,
        k("apiserver_cache_list_fetched_objects_total", **POD_OWNER): 7,
        k("apiserver_cache_list_returned_objects_total", **POD_OWNER): 5,
        k("apiserver_watch_events_total", **POD_OWNER): 3,
        k("watchcache_watch_bytes_total", **POD_OWNER): 4096,
        k("watchcache_split_groups_total", **POD_OWNER): 0,
        k("watchcache_slow_watchers_total", **POD_OWNER, outcome="lagged"): 4,
        k("watchcache_slow_watchers_total", **POD_OWNER, outcome="caught_up"): 3,
        k("watchcache_slow_watchers_total", **POD_OWNER, outcome="expired"): 1,
        k("watchcache_delivery_failures_total", **POD_OWNER, path="flush"): 1,
        k("watchcache_delivery_failures_total", **POD_OWNER, path="dispatch"): 0,
        k("watchcache_delivery_failures_total", **POD_OWNER, path="replica"): 0,
        k("watchcache_cache_ready", **CM_FOLLOWER): 0,
        k("apiserver_registered_watchers", **CM_FOLLOWER): 0,
        k("watchcache_history_seconds", **CM_FOLLOWER): 0,
    }
    for key, value in expected.items():
        assert samples[key] == value, key
    # Byte sizes are the store's own accounting, exported as they are.
    assert samples[k("watchcache_cached_bytes", **POD_OWNER)] == stats.object_bytes > 0
    assert samples[k("watchcache_history_bytes", **POD_OWNER)] == stats.history_bytes > 0
    assert types["apiserver_watch_cache_events_received"] == "counter"
    assert types["watchcache_cached_objects"] == "gauge"


def test_a_single_process_owns_every_cache() -> None:
    samples, _ = scrape(CacherCollector({CONFIGMAPS: Cacher(CONFIGMAPS)}))
    assert samples[k("watchcache_cache_ready", **CM, replica="owner")] == 0


def test_backfills_fetches_requests_and_what_they_brought() -> None:
    head = 20

    async def fetch(cacher: Cacher, rv: int) -> Fetched:
        if rv < 5:
            raise BackfillFailed(BackfillFailed.GONE, f"the upstream compacted {rv}")
        changes = [(MODIFIED, pod("a", rv=r)) for r in range(rv + 1, head + 1)]
        return Fetched(len(cacher.backfill(Span.from_list(rv, [pod("a", rv=rv)], changes, head))), 2048)

    async def go() -> Cacher:
        cacher = Cacher(PODS)
        cacher.replace([pod("a", rv=head)], head)
        cacher.backfills = Backfills(cacher, fetch, coalesce=0.0, attempts=1)
        assert await reach_back(cacher, 15, 5.0) is None  # served by one fetch of 5 events
        assert await reach_back(cacher, 12, 5.0) is None  # and one of 3 more
        failed = await reach_back(cacher, 2, 5.0)  # the upstream's 410
        assert failed is not None and failed.outcome == "gone"
        return cacher

    pods = asyncio.run(go())
    never = Cacher(CONFIGMAPS)  # no source of older history: no backfill series
    samples, types = scrape(BackfillCollector({PODS: pods, CONFIGMAPS: never}))

    fetches = {
        dict(key[1])["outcome"]: v for key, v in samples.items() if key[0] == "watchcache_backfill_fetches_total"
    }
    assert fetches == {"ok": 2, "gone": 1, "bound": 0, "mismatch": 0, "relist": 0, "unreachable": 0, "failed": 0}
    requests = {dict(key[1])["outcome"]: v for key, v in samples.items()
                if key[0] == "watchcache_backfill_requests_total"}  # fmt: skip
    assert requests == {
        "served": 2,
        "gone": 1,
        "bound": 0,
        "mismatch": 0,
        "relist": 0,
        "unreachable": 0,
        "failed": 0,
        "deadline": 0,
    }
    assert samples[k("watchcache_backfill_events_total", **POD)] == 8
    assert samples[k("watchcache_backfill_bytes_total", **POD)] == 2 * 2048  # the 410 brought nothing
    assert samples[k("watchcache_backfill_waiting", **POD)] == 0
    assert samples[k("watchcache_backfill_duration_seconds_count", **POD)] == 3
    assert samples[k("watchcache_backfill_duration_seconds_bucket", **POD, le="+Inf")] == 3
    assert types["watchcache_backfill_duration_seconds"] == "histogram"
    assert not any(dict(key[1]).get("resource") == "configmaps" for key in samples)
