"""server/metrics.py: what handlers observe per request, and the handler's counters with the HTTP server's refusals."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from tests.support.collectors import POD, k, scrape, scrape_registry
from tests.support.handlers import Harness, arun
from watchcache.dispatch.freshness import Reached, Wait
from watchcache.http.admission import Admission
from watchcache.resources import PODS
from watchcache.server.metrics import HandlerCollector, Metrics
from watchcache.server.negotiation import PassReason


def test_the_requests_refused_by_every_limit_the_handlers_and_the_http_servers() -> None:
    admission = Admission(max_connections=2, max_per_client=1)
    assert admission.connect("10.0.0.1") is None
    assert admission.connect("10.0.0.1") == "connections_per_client"
    assert admission.connect("10.0.0.2") == "connections"
    admission.rejected["http2_rapid_reset"] += 1
    handler = SimpleNamespace(
        passed_through={"write": 7, "media-type": 1},
        passed_through_sharded={"media-type": 1},
        full_protobuf={"protobuf-cache": 9, "json": 2},
        sent_early={"used": 11, "dropped": 1},
        rejected={"inflight": 2, "shutdown": 4},
        seats=SimpleNamespace(active_by_kind={"readOnly": 3, "mutating": 1}, waiting=5),
        streams=2,
    )

    samples, _ = scrape(HandlerCollector(handler, admission))

    rejected = {k[1][0][1]: v for k, v in samples.items() if k[0] == "watchcache_rejected_requests_total"}
    assert rejected["inflight"] == 2 and rejected["watchers"] == 0 and rejected["tunnels"] == 0
    assert rejected["shutdown"] == 4  # 429 while draining
    assert rejected["connections"] == 1 and rejected["connections_per_client"] == 1
    assert rejected["http2_rapid_reset"] == 1 and rejected["request_buffer"] == 0
    passed = {k[1][0][1]: v for k, v in samples.items() if k[0] == "watchcache_passthrough_requests_total"}
    # Every reason is exported from the start, zeros included, so that a rate() over any is defined.
    assert passed == {r.value: {"write": 7, "media-type": 1}.get(r.value, 0) for r in PassReason}
    sharded = {k[1][0][1]: v for k, v in samples.items() if k[0] == "watchcache_passthrough_sharded_requests_total"}
    assert sharded == {r.value: {"media-type": 1}.get(r.value, 0) for r in PassReason}
    full = {k[1][0][1]: v for k, v in samples.items() if k[0] == "watchcache_full_protobuf_requests_total"}
    assert full == {"protobuf-cache": 9, "json": 2, "passed-through": 0}  # every answer, zeros included
    early = {k[1][0][1]: v for k, v in samples.items() if k[0] == "watchcache_passthrough_sent_early_requests_total"}
    assert early == {"used": 11, "dropped": 1}
    assert samples[k("apiserver_current_inflight_requests", request_kind="readOnly")] == 3
    assert samples[k("apiserver_current_inflight_requests", request_kind="mutating")] == 1
    assert samples[k("watchcache_passthrough_streams")] == 2
    assert samples[k("watchcache_waiting_requests")] == 5


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
    assert samples[k(fallbacks, **POD, reason="changing")] == 0  # none yet, but shown from the first read
    assert samples[k("watchcache_consistent_read_target_seconds_count", **POD)] == 2  # none without a target
    assert samples[k("watchcache_consistent_read_probe_seconds_count", **POD)] == 1
    assert samples[k("watchcache_consistent_read_probe_seconds_sum", **POD)] == pytest.approx(0.3)  # the whole wait
    assert k("watchcache_consistent_read_events_seconds_count", **POD) not in samples  # reached by a probe


@arun
async def test_an_error_counts_under_the_requests_verb_and_resource_with_its_latency() -> None:
    """As kube-apiserver's: a 404 from the cache is a GET of pods, a LIST's 410 a LIST of pods (they
    were counted under the HTTP method and no resource), each with its latency observed."""
    h = Harness()
    registry = CollectorRegistry()
    h.ctx.metrics = Metrics(registry, delivery_sample=1)
    assert (await h.get("nobody", resourceVersion="0")).status == 404
    expired = await h.list(resourceVersion="1", resourceVersionMatch="Exact")  # older than the window
    assert expired.status == 410, expired.body
    samples, _ = scrape_registry(registry)
    assert samples[k("apiserver_request_total", **POD, verb="GET", code="404")] == 1
    assert samples[k("apiserver_request_total", **POD, verb="LIST", code="410")] == 1
    assert samples[k("apiserver_request_duration_seconds_count", **POD, verb="GET")] == 1
    assert samples[k("apiserver_request_duration_seconds_count", **POD, verb="LIST")] == 1
    assert not [key for key in samples if key[0] == "apiserver_request_total" and ("resource", "") in key[1]]
