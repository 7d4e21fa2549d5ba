"""The feed's metric families: reflectors, the proxy's own failed requests, consistent-read proofs, identities.

Read at scrape time from the plain counters of ``Reflector``, ``LastFailures``, ``ConsistentReads``,
``PassthroughIdentity`` and ``ProtobufCaches``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from watchcache.dispatch.cacher import Cacher
from watchcache.upstream.consistency import ConsistentReads
from watchcache.upstream.failures import LastFailures
from watchcache.upstream.identity import PassthroughIdentity
from watchcache.upstream.protobuf import ProtobufCaches
from watchcache.upstream.reflector import Reflector

__all__ = [
    "ConsistencyCollector",
    "IdentityCollector",
    "ProtobufCollector",
    "ReflectorCollector",
    "UpstreamErrorsCollector",
]

_LABELS = ["group", "resource"]


class ReflectorCollector(Collector):
    """Per resource: relists, watch restarts, 410s, the age of the last event, the reflector's state."""

    def __init__(
        self, reflectors: Callable[[], Iterable[Reflector]], clock: Callable[[], float] = time.monotonic
    ) -> None:
        # Called at each scrape: reflectors start once discovery is done.
        self.reflectors = reflectors
        self.clock = clock  # the reflectors' (last_event_at)

    def collect(self) -> Iterator[Metric]:
        lbl = _LABELS
        relists = CounterMetricFamily("watchcache_reflector_relists", "Relists after the upstream's 410", labels=lbl)
        restarts = CounterMetricFamily(
            "watchcache_reflector_watch_restarts", "Upstream watches re-established", labels=lbl
        )
        gone = CounterMetricFamily("watchcache_reflector_gone", "410 Gone answers from the upstream", labels=lbl)
        age = GaugeMetricFamily(
            "watchcache_reflector_last_event_age_seconds",
            "Seconds since the upstream watch last delivered anything",
            labels=lbl,
        )
        state = GaugeMetricFamily(
            "watchcache_reflector_state", "1 for the reflector's current state", labels=[*lbl, "state"]
        )
        now = self.clock()
        for r in self.reflectors():
            lv = [r.resource.group, r.resource.resource]
            relists.add_metric(lv, r.relists)
            restarts.add_metric(lv, r.watch_restarts)
            gone.add_metric(lv, r.gone)
            age.add_metric(lv, 0.0 if r.last_event_at is None else now - r.last_event_at)
            state.add_metric([*lv, r.state.value], 1)
        yield from (relists, restarts, gone, age, state)


class UpstreamErrorsCollector(Collector):
    """The proxy's own failed upstream requests (lists, watches, discovery), per resource and reason."""

    def __init__(self, failures: LastFailures) -> None:
        self.failures = failures

    def collect(self) -> Iterator[Metric]:
        errors = CounterMetricFamily(
            "watchcache_upstream_errors",
            'Failed upstream requests of the proxy\'s own (discovery: resource=""), by reason (forbidden: '
            "RBAC; unauthorized: its credential; not-tls; certificate; refused; ...): /readyz?verbose has the last",
            labels=[*_LABELS, "reason"],
        )
        counts = dict(self.failures.counts)
        for reason in ("unauthorized", "forbidden"):  # defined from the start, so rate() is too
            counts.setdefault((None, reason), 0)
        for (resource, reason), count in sorted(counts.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
            group, name = (resource.group, resource.resource) if resource is not None else ("", "")
            errors.add_metric([group, name, reason], count)
        yield errors


class ConsistencyCollector(Collector):
    """Probe watches by how they ended, and the consistent limit=1 LISTs that learn the upstream's rv."""

    def __init__(self, consistent: ConsistentReads) -> None:
        self.consistent = consistent

    def collect(self) -> Iterator[Metric]:
        probes = CounterMetricFamily(
            "watchcache_consistency_probes",
            "Probe watches the proxy opened to prove a cache's progress, by how they ended",
            labels=[*_LABELS, "outcome"],
        )
        for (resource, outcome), count in list(self.consistent.probe_outcomes.items()):
            probes.add_metric([resource.group, resource.resource, outcome], count)
        yield probes
        fetches = CounterMetricFamily(
            "watchcache_consistency_target_fetches",
            "Consistent limit=1 LISTs the proxy sent to learn the upstream's rv, by outcome",
            labels=[*_LABELS, "outcome"],
        )
        for resource, outcome, count in self.consistent.target_fetches():
            fetches.add_metric([resource.group, resource.resource, outcome], count)
        yield fetches
        proofs = CounterMetricFamily(
            "watchcache_consistency_scope_lists",
            "Metadata LISTs the proxy sent to prove a scope's state for consistent LISTs and watches, by outcome "
            "(each shared by every read that joined it)",
            labels=[*_LABELS, "outcome"],
        )
        for resource, outcome, count in self.consistent.scope_fetches():
            proofs.add_metric([resource.group, resource.resource, outcome], count)
        yield proofs


class IdentityCollector(Collector):
    """Pass-through requests by the identity they went out with, and certificate users refused."""

    def __init__(self, identity: PassthroughIdentity) -> None:
        self.identity = identity

    def collect(self) -> Iterator[Metric]:
        routes = CounterMetricFamily(
            "watchcache_passthrough_identity",
            "Pass-through requests by how their client was presented to the upstream (client: its own "
            "credentials; front-proxy; proxy: impersonated) and refusals of certificate users",
            labels=["route"],
        )
        for route in ("client", "front-proxy", "proxy"):
            routes.add_metric([route], self.identity.forwarded.get(route, 0))
        routes.add_metric(["refused"], self.identity.refused)
        yield routes


class ProtobufCollector(Collector):
    """The protobuf caches (full objects in protobuf, ``upstream/protobuf.py``): per cache its objects,
    watchers and readiness (``replica``: the owner's, or a follower of it in another worker), and how
    many were started, dropped idle, and refused by the upstream.

    Apart from ``watchcache_cache_*``, whose samples are one per resource: a resource has a protobuf
    cache only while protobuf clients read it.
    """

    def __init__(self, caches: ProtobufCaches, every: Callable[[], Iterable[Cacher]]) -> None:
        self.caches = caches
        # Called at each scrape: this worker's protobuf caches, its followers of the others' included.
        self.every = every

    def collect(self) -> Iterator[Metric]:
        lbl = [*_LABELS, "replica"]
        objects = GaugeMetricFamily(
            "watchcache_protobuf_cache_objects", "Objects in a protobuf cache (kube's protobuf bytes)", labels=lbl
        )
        watchers = GaugeMetricFamily(
            "watchcache_protobuf_cache_watchers", "Watches open on a protobuf cache", labels=lbl
        )
        ready = GaugeMetricFamily(
            "watchcache_protobuf_cache_ready", "1 once a protobuf cache has synced (until then: JSON)", labels=lbl
        )
        owned = set(self.caches.cachers())
        for cacher in self.every():
            lv = [cacher.resource.group, cacher.resource.resource, "owner" if cacher in owned else "follower"]
            objects.add_metric(lv, len(cacher.cache))
            watchers.add_metric(lv, len(cacher.dispatcher))
            ready.add_metric(lv, 1 if cacher.ready else 0)
        started = CounterMetricFamily(
            "watchcache_protobuf_caches_started", "Protobuf caches started by this worker (a protobuf read)"
        )
        started.add_metric([], self.caches.started)
        dropped = CounterMetricFamily(
            "watchcache_protobuf_caches_dropped", "Protobuf caches this worker dropped when idle"
        )
        dropped.add_metric([], self.caches.dropped)
        refused = GaugeMetricFamily(
            "watchcache_protobuf_caches_refused",
            "Resources whose upstream refused protobuf (406/415), not asked again for a while",
        )
        now = time.monotonic()
        refused.add_metric([], sum(1 for until in self.caches.refused.values() if until > now))
        yield from (objects, watchers, ready, started, dropped, refused)
