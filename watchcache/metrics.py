"""Prometheus exposition: plain counters kept by the components, read at scrape time.

The hot path never touches prometheus-client (``Counter.inc`` costs 0.2–0.7 µs, a plain
``int += 1`` 10 ns — PERF-NOTES.md): components count in integers and this collector
turns them into metric families when ``/metrics`` is scraped. Names follow
kube-apiserver's where the meaning is the same.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from watchcache.server.context import ApiContext


class CacheCollector(Collector):
    def __init__(self, ctx: ApiContext, passed_through: dict[str, int], consistent: object | None = None) -> None:
        self.ctx = ctx
        self.passed_through = passed_through
        self.consistent = consistent

    def collect(self) -> Iterator[Metric]:
        labels = ["group", "resource"]
        rv = GaugeMetricFamily(
            "apiserver_watch_cache_resource_version", "Current resource version of the watch cache", labels=labels
        )
        objects = GaugeMetricFamily("watchcache_cached_objects", "Objects in the cache", labels=labels)
        nbytes = GaugeMetricFamily("watchcache_cached_bytes", "JSON bytes of the cached objects", labels=labels)
        hist_events = GaugeMetricFamily("watchcache_history_events", "Events in the history window", labels=labels)
        hist_bytes = GaugeMetricFamily(
            "watchcache_history_bytes", "JSON bytes referenced by the history window", labels=labels
        )
        oldest = GaugeMetricFamily(
            "watchcache_history_oldest_resource_version", "The window starts after this rv", labels=labels
        )
        watchers = GaugeMetricFamily("apiserver_registered_watchers", "Watchers registered on the cache", labels=labels)
        received = CounterMetricFamily(
            "apiserver_watch_cache_events_received", "Events the cache received from its feed", labels=labels
        )
        dispatched = CounterMetricFamily(
            "apiserver_watch_cache_events_dispatched", "Event deliveries to watchers", labels=labels
        )
        slow = CounterMetricFamily(
            "watchcache_slow_watchers",
            "Watchers that fell behind (lagged), then caught up from history or were ended with 410 (expired)",
            labels=[*labels, "outcome"],
        )
        for resource, cacher in list(self.ctx.cachers.items()):
            lv = [resource.group, resource.resource]
            slow.add_metric([*lv, "lagged"], cacher.watchers_lagged)
            slow.add_metric([*lv, "caught_up"], cacher.watchers_caught_up)
            slow.add_metric([*lv, "expired"], cacher.watchers_expired)
            stats = cacher.cache.stats()
            rv.add_metric(lv, stats.rv)
            objects.add_metric(lv, stats.objects)
            nbytes.add_metric(lv, stats.object_bytes)
            hist_events.add_metric(lv, stats.history_events)
            hist_bytes.add_metric(lv, stats.history_bytes)
            oldest.add_metric(lv, stats.oldest_rv)
            watchers.add_metric(lv, len(cacher.dispatcher))
            received.add_metric(lv, cacher.events_received)
            dispatched.add_metric(lv, cacher.dispatcher.events_dispatched)
        yield from (rv, objects, nbytes, hist_events, hist_bytes, oldest, watchers, received, dispatched, slow)

        passthrough = CounterMetricFamily(
            "watchcache_passthrough_requests", "Requests forwarded to the upstream, by reason", labels=["reason"]
        )
        for reason, count in list(self.passed_through.items()):
            passthrough.add_metric([reason], count)
        yield passthrough

        served = getattr(self.consistent, "served_from_cache", None)
        fell_back = getattr(self.consistent, "passed_through", None)
        if served is not None and fell_back is not None:
            consistent = CounterMetricFamily(
                "apiserver_watch_cache_consistent_read",
                "Consistent (Most Recent) reads: served from cache, or passed through when freshness was not proven",
                labels=["group", "resource", "success", "fallback"],
            )
            for resource, count in list(served.items()):
                consistent.add_metric([resource.group, resource.resource, "true", "false"], count)
            for resource, count in list(fell_back.items()):
                consistent.add_metric([resource.group, resource.resource, "true", "true"], count)
            yield consistent


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
