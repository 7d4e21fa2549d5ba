"""The server's metrics: what handlers observe per request or flush, and the handler's counters.

``Metrics`` holds the histograms and counters handlers observe as they answer (kube-apiserver's
``apiserver_request*``, the read waits and consistent-read phases, watch delivery latency and
frame sizes: per request, or per flush and sampled, never per delivered event).
``HandlerCollector`` reads the handler's plain counters at scrape time: pass-through reasons,
refusals by limit (the HTTP server's included), requests in flight; ``TunnelCollector`` the
connection upgrades' (``server/tunnel.py``), through a protocol: the tunnels sit above this module.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from watchcache.dispatch.freshness import Reached, Wait
from watchcache.http.admission import Admission
from watchcache.resources import ResourceType
from watchcache.server.negotiation import PassReason
from watchcache.server.seats import Seats

__all__ = ["HandlerCollector", "HandlerCounters", "Metrics", "TunnelCollector", "TunnelCounters"]

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# kube-apiserver's apiserver_watch_cache_read_wait_seconds buckets.
_WAIT_BUCKETS = (0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0)
_REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0)
# A consistent read passed through (not reached), by why: the reason label of its fallback.
_FALLBACK_REASONS = {Reached.IMPATIENT: "changing", Reached.TIMEOUT: "timeout", Reached.NO_TARGET: "no-target"}


def _names(resource: ResourceType | None) -> tuple[str, str]:
    return (resource.group, resource.resource) if resource is not None else ("", "")


class Metrics:
    """The per-request and per-flush observations; one instance per process, in the process's registry."""

    def __init__(self, registry: CollectorRegistry, *, delivery_sample: int = 16) -> None:
        r = registry
        self.requests = Counter(
            "apiserver_request",
            "Requests by verb, resource and HTTP code",
            ["verb", "group", "resource", "code"],
            registry=r,
        )
        self.request_seconds = Histogram(
            "apiserver_request_duration_seconds",
            "Response latency of non-watch requests",
            ["verb", "group", "resource"],
            buckets=_REQUEST_BUCKETS,
            registry=r,
        )
        self.read_wait = Histogram(
            "apiserver_watch_cache_read_wait_seconds",
            "Time a read waited for the cache to be fresh enough",
            ["group", "resource"],
            buckets=_WAIT_BUCKETS,
            registry=r,
        )
        # Consistent reads (no resourceVersion), phase by phase (docs/consistency.md).
        self.consistent_reads = Counter(
            "apiserver_watch_cache_consistent_read",
            "Consistent (Most Recent) reads: served from cache, or passed through (fallback) when not proven fresh",
            ["group", "resource", "success", "fallback"],
            registry=r,
        )
        phase = {
            "target": "Consistent LISTs and watches: waiting for the scope's proof (its metadata LIST, shared)",
            "events": "Consistent reads whose proof ended by the cache's own events (it had reached the upstream's rv, "
            "or a change on its way arrived): the whole wait",
            "probe": "Consistent reads proven by the scope's comparison with the upstream's listing: the whole wait",
        }
        self.consistent_phase = {
            name: Histogram(
                f"watchcache_consistent_read_{name}_seconds",
                doc,
                ["group", "resource"],
                buckets=_WAIT_BUCKETS,
                registry=r,
            )
            for name, doc in phase.items()
        }
        self.consistent_fallbacks = Counter(
            "watchcache_consistent_read_fallbacks",
            "Consistent reads passed through, by why: changing (the scope changed as it was proven, and the change "
            "had not arrived within the proof's patience: by choice), timeout (not proven fresh within --fresh-wait), "
            "no-target (the upstream's rv or the scope's state could not be read)",
            ["group", "resource", "reason"],
            registry=r,
        )
        self._fallbacks_shown: set[ResourceType] = set()
        self.consistent_total = Histogram(
            "watchcache_consistent_read_total_seconds",
            "Consistent reads: the whole wait for freshness, served from cache (fallback=false) or not",
            ["group", "resource", "fallback"],
            buckets=_WAIT_BUCKETS,
            registry=r,
        )
        self.delivery = Histogram(
            "watchcache_event_delivery_seconds",
            "From an event's arrival in the cache to its write to a watcher (sampled per flush)",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.event_sizes = Histogram(
            "apiserver_watch_events_sizes",
            "Watch event frame sizes in bytes (sampled per flush)",
            buckets=(256, 1024, 4096, 16384, 65536, 262144, 1048576),
            registry=r,
        )
        # Observe one flush in N: a histogram observation costs ~1 µs, a flush ~5 µs of syscall.
        self.delivery_sample = delivery_sample
        self._flushes = 0
        self._request_counters: dict[tuple[str, ResourceType | None, int], Any] = {}
        self._request_histograms: dict[tuple[str, ResourceType | None], Any] = {}

    def request(self, verb: str, resource: ResourceType | None, code: int, seconds: float | None) -> None:
        # The labelled children, remembered: ``labels()`` costs ~2 us, twice on every request. The
        # keys are bounded (verbs x the registry's resources x status codes).
        key = (verb, resource, code)
        counter = self._request_counters.get(key)
        if counter is None:
            counter = self._request_counters[key] = self.requests.labels(verb, *_names(resource), str(code))
        counter.inc()
        if seconds is not None:  # a watch has no latency: no series of its own
            hkey = (verb, resource)
            histogram = self._request_histograms.get(hkey)
            if histogram is None:
                histogram = self._request_histograms[hkey] = self.request_seconds.labels(verb, *_names(resource))
            histogram.observe(seconds)

    def waited(self, resource: ResourceType, wait: Wait, *, consistent: bool) -> None:
        """A read that could not be served at once waited (``freshness.reach``)."""
        group, name = resource.group, resource.resource
        self.read_wait.labels(group, name).observe(wait.seconds)
        if not consistent:
            return
        fallback = "false" if wait.reached else "true"
        self.consistent_reads.labels(group, name, "true", fallback).inc()
        if resource not in self._fallbacks_shown:  # every reason from the first read on, zeros included
            self._fallbacks_shown.add(resource)
            for reason in _FALLBACK_REASONS.values():
                self.consistent_fallbacks.labels(group, name, reason)
        if not wait.reached:
            self.consistent_fallbacks.labels(group, name, _FALLBACK_REASONS[wait.how]).inc()
        self.consistent_total.labels(group, name, fallback).observe(wait.seconds)
        if wait.how is not Reached.NO_TARGET:
            self.consistent_phase["target"].labels(group, name).observe(wait.target_seconds)
        if wait.how in (Reached.AT_ONCE, Reached.EVENTS):
            self.consistent_phase["events"].labels(group, name).observe(wait.seconds)
        elif wait.how is Reached.PROGRESS:
            self.consistent_phase["probe"].labels(group, name).observe(wait.seconds)

    def flushed(self, resource: ResourceType, oldest_pending: float, frame_bytes: int) -> None:
        """Called once per flush; observes one in ``delivery_sample``."""
        if not self.delivery_sample:
            return
        self._flushes += 1
        if self._flushes % self.delivery_sample:
            return
        self.delivery.observe(time.monotonic() - oldest_pending)
        self.event_sizes.observe(frame_bytes)


class HandlerCounters(Protocol):
    """What ``HandlerCollector`` reads of the API handler (``server.app.ApiHandler``)."""

    #: Requests passed through, by ``PassReason`` value.
    passed_through: dict[str, int]
    #: Of those, the ones with a shardSelector (the upstream shards them only if it serves the parameter).
    passed_through_sharded: dict[str, int]
    #: Reads of full objects in protobuf of a built-in kind, by answer (protobuf-cache, json, passed-through).
    full_protobuf: dict[str, int]
    #: Consistent GETs sent to the upstream as they arrived (``ApiHandler.prestart``), by what became of the answer.
    sent_early: dict[str, int]
    #: Requests refused by the handler's own limits (inflight, watchers, tunnels, shutdown: while draining).
    rejected: dict[str, int]
    #: Requests holding an in-flight seat (working), and those waiting without one (``server/seats.py``).
    seats: Seats
    #: Long-running requests being passed through.
    streams: int


class HandlerCollector(Collector):
    """Pass-through by reason, refusals by limit, requests in flight, pass-through streams."""

    def __init__(self, handler: HandlerCounters, admission: Admission | None = None) -> None:
        self.handler = handler
        # The HTTP server's, whose refusals (connections, request buffer, timeouts, HTTP/2) count with the handler's.
        self.admission = admission

    def collect(self) -> Iterator[Metric]:
        handler = self.handler
        passthrough = CounterMetricFamily(
            "watchcache_passthrough_requests", "Requests forwarded to the upstream, by reason", labels=["reason"]
        )
        # Every reason, zeros included, so a rate() over any of them is defined from the start.
        for reason in PassReason:
            passthrough.add_metric([reason.value], handler.passed_through.get(reason.value, 0))
        yield passthrough
        sharded = CounterMetricFamily(
            "watchcache_passthrough_sharded_requests",
            "Requests with a shardSelector forwarded to the upstream, by reason: sharded only if the upstream "
            "serves shardSelector (kube v1.36 with ShardedListAndWatch)",
            labels=["reason"],
        )
        for reason in PassReason:
            sharded.add_metric([reason.value], handler.passed_through_sharded.get(reason.value, 0))
        yield sharded
        full_protobuf = CounterMetricFamily(
            "watchcache_full_protobuf_requests",
            "Reads of full objects in protobuf of a built-in kind (typed clients), by answer: from the protobuf "
            "cache (kube's bytes), JSON while it syncs, or passed through (protobuf alone accepted)",
            labels=["answer"],
        )
        for answer in ("protobuf-cache", "json", "passed-through"):
            full_protobuf.add_metric([answer], handler.full_protobuf.get(answer, 0))
        yield full_protobuf
        early = CounterMetricFamily(
            "watchcache_passthrough_sent_early_requests",
            "Consistent GETs sent to the upstream as they arrived, while the worker was idle, before flow "
            "control and the handler's other work (docs/consistency.md), by what became of the answer: "
            "used, or dropped (the handler ended otherwise: a timeout, a failure)",
            labels=["outcome"],
        )
        for outcome in ("used", "dropped"):
            early.add_metric([outcome], handler.sent_early.get(outcome, 0))
        yield early
        rejected = CounterMetricFamily(
            "watchcache_rejected_requests",
            "Requests (or connections) refused by a limit: 429, 408 or closed (see docs/security.md)",
            labels=["limit"],
        )
        for limit in ("inflight", "priority_and_fairness", "watchers", "tunnels", "shutdown", "request_timeout"):
            rejected.add_metric([limit], handler.rejected.get(limit, 0))
        if self.admission is not None:
            for limit, count in self.admission.rejected.items():
                rejected.add_metric([limit], count)
        yield rejected
        inflight = GaugeMetricFamily(
            "apiserver_current_inflight_requests",
            "Requests holding an in-flight seat (--max-requests-inflight) while they work, watches until registered",
            labels=["request_kind"],
        )
        for kind, count in handler.seats.active_by_kind.items():
            inflight.add_metric([kind], count)
        yield inflight
        yield GaugeMetricFamily(
            "watchcache_waiting_requests",
            "Requests waiting without a seat (for a review, a proof of freshness, a backfill, the upstream), "
            "at most --max-requests-waiting",
            value=handler.seats.waiting,
        )
        yield GaugeMetricFamily(
            "watchcache_passthrough_streams",
            "Watches and other long-running requests being passed through (counted toward --max-watchers)",
            value=handler.streams,
        )


class TunnelCounters(Protocol):
    """What ``TunnelCollector`` reads of the connection upgrades (``server.tunnel.Tunnels``)."""

    #: Tunnels open now, by protocol label (websocket, spdy, other).
    open: dict[str, int]
    #: Upgrades by (protocol, outcome): switched, refused by the upstream, failed, rejected.
    outcomes: dict[tuple[str, str], int]
    #: Tunnels ended, by reason.
    ends: dict[str, int]
    bytes_to_upstream: int
    bytes_to_client: int


class TunnelCollector(Collector):
    """The tunnels' plain counters as metric families, at scrape time."""

    def __init__(self, tunnels: TunnelCounters) -> None:
        self.tunnels = tunnels

    def collect(self) -> Iterator[Metric]:
        t = self.tunnels
        open_ = GaugeMetricFamily("watchcache_tunnels_open", "Connection upgrades open now", labels=["protocol"])
        for protocol in ("websocket", "spdy", "other"):
            open_.add_metric([protocol], t.open.get(protocol, 0))
        total = CounterMetricFamily(
            "watchcache_tunnels",
            "Connection upgrades by protocol and outcome (switched, refused by the upstream, failed, rejected)",
            labels=["protocol", "outcome"],
        )
        for (protocol, outcome), count in sorted(t.outcomes.items()):
            total.add_metric([protocol, outcome], count)
        ends = CounterMetricFamily("watchcache_tunnel_ends", "Tunnels ended, by reason", labels=["reason"])
        for reason, count in sorted(t.ends.items()):
            ends.add_metric([reason], count)
        moved = CounterMetricFamily("watchcache_tunnel_bytes", "Bytes relayed by tunnels", labels=["direction"])
        moved.add_metric(["to_upstream"], t.bytes_to_upstream)
        moved.add_metric(["to_client"], t.bytes_to_client)
        yield from (open_, total, ends, moved)
