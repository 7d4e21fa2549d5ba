"""A scrape of a known state gives the expected samples: each package's collector, and the merge across workers.

The components are real (caches fed through ``replace``/``apply``, a gate that made its
decisions, an ``Admission`` that counted connections); counters that the handlers own are set
as the handlers would count them. Exported names, labels and values are what dashboards and
alerts (deploy/) read, so each is spelled out here rather than derived from the code.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from tests.support.authfakes import info_of, request
from tests.support.factories import NullSink, pod
from watchcache.apierrors import StatusError
from watchcache.auth.gate import Gate
from watchcache.auth.metrics import GateCollector
from watchcache.cache.events import ADDED, DELETED, MODIFIED
from watchcache.cache.predicate import SelectionPredicate
from watchcache.cache.store import Span
from watchcache.dispatch.backfill import BackfillFailed, Backfills, Fetched, reach_back
from watchcache.dispatch.cacher import Cacher
from watchcache.dispatch.freshness import Reached, Wait
from watchcache.dispatch.metrics import BackfillCollector, CacherCollector
from watchcache.http.admission import Admission
from watchcache.http.metrics import AdmissionCollector
from watchcache.metrics import merge_workers, render
from watchcache.resources import CONFIGMAPS, PODS
from watchcache.server.metrics import HandlerCollector, Metrics
from watchcache.server.negotiation import PassReason
from watchcache.shard.follower import Follower
from watchcache.shard.metrics import FollowerCollector, RestartsCollector
from watchcache.sim.auth import LocalReviewClient
from watchcache.sim.policy import load_policy
from watchcache.upstream.client import UpstreamError
from watchcache.upstream.consistency import ConsistentReads
from watchcache.upstream.failures import LastFailures
from watchcache.upstream.identity import PassthroughIdentity
from watchcache.upstream.metrics import (
    ConsistencyCollector,
    IdentityCollector,
    ReflectorCollector,
    UpstreamErrorsCollector,
)
from watchcache.upstream.reflector import Reflector, ReflectorState
from watchcache.watchers.budget import WatchBudget
from watchcache.watchers.flush import FlushScheduler
from watchcache.watchers.metrics import DeliveryCollector
from watchcache.watchers.watcher import Watcher

EXAMPLE_POLICY = Path(__file__).parents[1] / "watchcache" / "sim" / "policy-example.yaml"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def k(name: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """A sample's key in ``scrape``'s result: its name and its labels, sorted."""
    return name, tuple(sorted(labels.items()))


POD = {"group": "", "resource": "pods"}
CM = {"group": "", "resource": "configmaps"}
# A cache's families say whether this worker owns the cache or follows its owner.
POD_OWNER = {**POD, "replica": "owner"}
CM_FOLLOWER = {**CM, "replica": "follower"}


def scrape(*collectors: Collector) -> tuple[Samples, dict[str, str]]:
    """Every sample as {(name, sorted labels): value}, and every family's type, through the text exposition."""
    registry = CollectorRegistry()
    for collector in collectors:
        registry.register(collector)
    samples: Samples = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(render(registry).decode()):
        types[family.name] = family.type
        for s in family.samples:
            if not s.name.endswith("_created"):
                samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, types


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
    # What the LIST and WATCH handlers and the fan-out count (server/reads.py, server/watch.py).
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
    assert fetches == {"ok": 2, "gone": 1, "bound": 0, "mismatch": 0, "relist": 0, "failed": 0}
    requests = {dict(key[1])["outcome"]: v for key, v in samples.items()
                if key[0] == "watchcache_backfill_requests_total"}  # fmt: skip
    assert requests == {"served": 2, "gone": 1, "bound": 0, "mismatch": 0, "relist": 0, "failed": 0, "deadline": 0}
    assert samples[k("watchcache_backfill_events_total", **POD)] == 8
    assert samples[k("watchcache_backfill_bytes_total", **POD)] == 2 * 2048  # the 410 brought nothing
    assert samples[k("watchcache_backfill_waiting", **POD)] == 0
    assert samples[k("watchcache_backfill_duration_seconds_count", **POD)] == 3
    assert samples[k("watchcache_backfill_duration_seconds_bucket", **POD, le="+Inf")] == 3
    assert types["watchcache_backfill_duration_seconds"] == "histogram"
    assert not any(dict(key[1]).get("resource") == "configmaps" for key in samples)


def test_delivery_writes_frames_per_write_and_the_budget() -> None:
    loop = asyncio.new_event_loop()
    try:
        flusher = FlushScheduler(loop)
        flusher.writes, flusher.frames = 4, 25  # as a flush pass counts them
        for frames_per_write in (1, 3, 3, 18):
            flusher.frames_per_write.observe(frames_per_write)
        budget = WatchBudget(1 << 20, flusher)
        budget.pending, budget.shed = 3000, 2  # as watchers report their unsent bytes, and enforce() sheds

        samples, types = scrape(DeliveryCollector(flusher, budget))
    finally:
        loop.close()

    assert samples[k("watchcache_watch_writes_total")] == 4
    assert samples[k("watchcache_watch_frames_written_total")] == 25
    assert samples[k("watchcache_watch_budget_bytes")] == 3000
    assert samples[k("watchcache_watch_budget_lagged_total")] == 2
    hist = "watchcache_watch_frames_per_write"
    assert types[hist] == "histogram"
    assert samples[k(f"{hist}_bucket", le="1.0")] == 1
    assert samples[k(f"{hist}_bucket", le="2.0")] == 1
    assert samples[k(f"{hist}_bucket", le="4.0")] == 3
    assert samples[k(f"{hist}_bucket", le="16.0")] == 3
    assert samples[k(f"{hist}_bucket", le="32.0")] == 4
    assert samples[k(f"{hist}_bucket", le="+Inf")] == 4
    assert samples[(f"{hist}_count", ())] == 4
    assert samples[(f"{hist}_sum", ())] == 25


def test_without_a_budget_there_is_no_budget_family() -> None:
    loop = asyncio.new_event_loop()
    try:
        samples, types = scrape(DeliveryCollector(FlushScheduler(loop)))
    finally:
        loop.close()
    assert "watchcache_watch_budget_bytes" not in types and "watchcache_watch_budget_lagged" not in types
    assert samples[k("watchcache_watch_writes_total")] == 0


def test_reflectors_consistency_and_pass_through_identity() -> None:
    pods = Cacher(PODS)
    reflector = Reflector(None, pods)  # type: ignore[arg-type]  # never run: only its counters are read
    reflector.relists, reflector.watch_restarts, reflector.gone = 1, 5, 2
    reflector.state, reflector.last_event_at = ReflectorState.WATCHING, 95.0
    consistent = ConsistentReads(None)  # type: ignore[arg-type]
    consistent.probe_outcomes[(PODS, "progress")] += 6
    consistent.probe_outcomes[(PODS, "timeout")] += 1
    consistent._target(PODS).fetches.update({"ok": 9, "error": 2})
    identity = PassthroughIdentity()
    identity.forwarded.update({"client": 12, "proxy": 3})
    identity.refused = 1

    samples, _ = scrape(
        ReflectorCollector(lambda: [reflector], clock=lambda: 100.0),
        ConsistencyCollector(consistent),
        IdentityCollector(identity),
    )

    assert samples[k("watchcache_reflector_relists_total", **POD)] == 1
    assert samples[k("watchcache_reflector_watch_restarts_total", **POD)] == 5
    assert samples[k("watchcache_reflector_gone_total", **POD)] == 2
    assert samples[k("watchcache_reflector_last_event_age_seconds", **POD)] == 5.0
    assert samples[k("watchcache_reflector_state", **POD, state="watching")] == 1
    assert samples[k("watchcache_consistency_probes_total", **POD, outcome="progress")] == 6
    assert samples[k("watchcache_consistency_probes_total", **POD, outcome="timeout")] == 1
    assert samples[k("watchcache_consistency_target_fetches_total", **POD, outcome="ok")] == 9
    assert samples[k("watchcache_consistency_target_fetches_total", **POD, outcome="error")] == 2
    for route, count in (("client", 12), ("front-proxy", 0), ("proxy", 3), ("refused", 1)):
        assert samples[k("watchcache_passthrough_identity_total", route=route)] == count


def test_the_proxys_own_upstream_errors_by_resource_and_reason() -> None:
    failures = LastFailures("https://127.0.0.1:6443")
    forbidden = UpstreamError(403, "forbidden", {"kind": "Status", "code": 403, "reason": "Forbidden"})
    failures.failed(PODS, "list", forbidden, 1.0)
    failures.failed(PODS, "watch", forbidden, 1.0)
    failures.failed(None, "discovery", ConnectionRefusedError(111, "Connection refused"), 1.0)

    samples, _ = scrape(UpstreamErrorsCollector(failures))

    errors = {(dict(key[1])["resource"], dict(key[1])["reason"]): v for key, v in samples.items()
              if key[0] == "watchcache_upstream_errors_total"}  # fmt: skip
    assert errors == {
        ("pods", "forbidden"): 2,
        ("", "refused"): 1,  # discovery
        ("", "unauthorized"): 0,  # defined from the start, so that rate() is
        ("", "forbidden"): 0,
    }


def test_followers_and_worker_restarts(tmp_path: Path) -> None:
    synced = Cacher(CONFIGMAPS)
    synced.replace([], 4)
    follower = Follower(CONFIGMAPS, synced, str(tmp_path / "w1.sock"), 0)
    follower.resyncs, follower.resumes = 2, 5
    restarts = tmp_path / "restarts.json"

    samples, _ = scrape(FollowerCollector(lambda: [follower]), RestartsCollector(restarts, 1))
    assert samples[k("watchcache_follower_synced", **CM)] == 1
    assert samples[k("watchcache_follower_resyncs_total", **CM)] == 2
    assert samples[k("watchcache_follower_resumes_total", **CM)] == 5
    assert samples[k("watchcache_worker_restarts_total")] == 0  # before the supervisor writes its file

    # This worker's own count, unlabelled: the merge across workers adds worker="1".
    restarts.write_text(json.dumps({"0": 0, "1": 3}))
    samples, _ = scrape(RestartsCollector(restarts, 1))
    assert samples[k("watchcache_worker_restarts_total")] == 3


def test_the_gates_decisions() -> None:
    gate = Gate.build(LocalReviewClient(load_policy(EXAMPLE_POLICY)))

    async def read(target: str, token: str | None) -> None:
        req = request(target, token=token)
        with contextlib.suppress(StatusError):
            await gate.check(req, info_of(req))

    async def decide() -> None:
        await read("/api/v1/namespaces/ns-1/pods", "alice-token")  # allowed
        await read("/api/v1/namespaces/ns-1/pods", "alice-token")  # allowed (cached)
        await read("/api/v1/namespaces/ns-2/pods?watch=true", "bob-token")  # denied
        await read("/api/v1/namespaces/ns-1/pods", "mallory-token")  # unauthenticated
        await read("/api/v1/namespaces/ns-1/pods", None)  # anonymous, then denied

    asyncio.run(decide())
    samples, _ = scrape(GateCollector(gate))
    decisions = {k[1][0][1]: v for k, v in samples.items() if k[0] == "watchcache_auth_decisions_total"}
    assert decisions == {"allowed": 2, "denied": 2, "unauthenticated": 1, "anonymous": 1, "failed": 0}


def test_connections_and_the_requests_refused_by_every_limit() -> None:
    admission = Admission(max_connections=2, max_per_client=1)
    assert admission.connect("10.0.0.1") is None
    assert admission.connect("10.0.0.1") == "connections_per_client"
    assert admission.connect("10.0.0.2") == "connections"
    admission.h2_connections, admission.h2_streams, admission.buffered = 1, 4, 900
    admission.rejected["http2_rapid_reset"] += 1
    handler = SimpleNamespace(
        passed_through={"write": 7, "media-type": 1},
        rejected={"inflight": 2, "shutdown": 4},
        active_by_kind={"readOnly": 3, "mutating": 1},
        streams=2,
    )

    samples, _ = scrape(HandlerCollector(handler, admission), AdmissionCollector(admission))

    assert samples[k("watchcache_http_connections")] == 2
    assert samples[("watchcache_http2_connections", ())] == 1
    assert samples[("watchcache_http2_streams", ())] == 4
    assert samples[k("watchcache_http_request_buffer_bytes")] == 900
    rejected = {k[1][0][1]: v for k, v in samples.items() if k[0] == "watchcache_rejected_requests_total"}
    assert rejected["inflight"] == 2 and rejected["watchers"] == 0 and rejected["tunnels"] == 0
    assert rejected["shutdown"] == 4  # 429 while draining
    assert rejected["connections"] == 1 and rejected["connections_per_client"] == 1
    assert rejected["http2_rapid_reset"] == 1 and rejected["request_buffer"] == 0
    passed = {k[1][0][1]: v for k, v in samples.items() if k[0] == "watchcache_passthrough_requests_total"}
    # Every reason is exported from the start, zeros included, so that a rate() over any is defined.
    assert passed == {r.value: {"write": 7, "media-type": 1}.get(r.value, 0) for r in PassReason}
    assert samples[k("apiserver_current_inflight_requests", request_kind="readOnly")] == 3
    assert samples[k("apiserver_current_inflight_requests", request_kind="mutating")] == 1
    assert samples[k("watchcache_passthrough_streams")] == 2


def test_request_observations() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry, delivery_sample=1)
    metrics.request("LIST", PODS, 200, 0.02)
    metrics.request("WATCH", PODS, 200, None)  # long-running: counted, not timed
    metrics.waited(PODS, Wait(Reached.PROGRESS, 12, target_seconds=0.1, wait_seconds=0.2), consistent=True)
    metrics.waited(PODS, Wait(Reached.NO_TARGET, None, wait_seconds=3.0), consistent=True)
    metrics.waited(PODS, Wait(Reached.TIMEOUT, 12, target_seconds=0.1, wait_seconds=3.0), consistent=True)

    samples, _ = scrape_registry(registry)
    assert samples[k("apiserver_request_total", **POD, verb="LIST", code="200")] == 1
    assert samples[k("apiserver_request_total", **POD, verb="WATCH", code="200")] == 1
    assert samples[k("apiserver_request_duration_seconds_count", **POD, verb="LIST")] == 1
    assert k("apiserver_request_duration_seconds_count", **POD, verb="WATCH") not in samples
    assert samples[k("apiserver_watch_cache_read_wait_seconds_count", **POD)] == 3
    consistent = "apiserver_watch_cache_consistent_read_total"
    assert samples[k(consistent, **POD, success="true", fallback="false")] == 1
    assert samples[k(consistent, **POD, success="true", fallback="true")] == 2
    assert samples[k("watchcache_consistent_read_total_seconds_count", **POD, fallback="true")] == 2
    fallbacks = "watchcache_consistent_read_fallbacks_total"
    assert samples[k(fallbacks, **POD, reason="no-target")] == 1
    assert samples[k(fallbacks, **POD, reason="timeout")] == 1
    assert k(fallbacks, **POD, reason="small-read") not in samples  # none yet
    assert samples[k("watchcache_consistent_read_target_seconds_count", **POD)] == 2  # none without a target
    assert samples[k("watchcache_consistent_read_probe_seconds_count", **POD)] == 1
    assert samples[k("watchcache_consistent_read_probe_seconds_sum", **POD)] == pytest.approx(0.2)
    assert k("watchcache_consistent_read_events_seconds_count", **POD) not in samples  # reached by a probe


def scrape_registry(registry: CollectorRegistry) -> tuple[Samples, dict[str, str]]:
    samples: Samples = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        types[family.name] = family.type
        for s in family.samples:
            if not s.name.endswith("_created"):
                samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, types


def test_merge_labels_each_workers_samples_and_keeps_one_family() -> None:
    one = b'# HELP x_total X\n# TYPE x_total counter\nx_total{resource="pods"} 3.0\n'
    two = b'# HELP x_total X\n# TYPE x_total counter\nx_total{resource="pods"} 4.0\n'
    families = list(text_string_to_metric_families(merge_workers([(0, one), (1, two)]).decode()))
    assert [f.name for f in families] == ["x"]
    assert {(s.labels["worker"], s.value) for s in families[0].samples} == {("0", 3.0), ("1", 4.0)}
