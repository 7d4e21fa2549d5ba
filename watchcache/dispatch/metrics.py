"""The caches' metric families, read from each ``Cacher``'s plain counters at scrape time, and its backfills'.

kube-apiserver's watch-cache names where the meaning is the same (``apiserver_watch_cache_*``,
``apiserver_cache_list_*``, ``apiserver_registered_watchers``), ours under ``watchcache_``.
The cacher counts in integers on the hot path (a ``Counter.inc`` costs 20-70x an ``int += 1``:
docs/lab/performance-notebook.md); this module is the only reader, so a renamed counter fails ``mypy`` here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from watchcache.dispatch.backfill import BackfillFailed, Backfills
from watchcache.dispatch.cacher import Cacher, CacherState
from watchcache.resources import ResourceType

__all__ = ["BackfillCollector", "CacherCollector"]

_LABELS = ["group", "resource"]


class CacherCollector(Collector):
    """Per resource: the cache's size, history and rv, its watchers, LISTs, watch output and lagging watchers."""

    def __init__(
        self, cachers: Mapping[ResourceType, Cacher], owns: Callable[[ResourceType], bool] | None = None
    ) -> None:
        # The process's cachers, read at each scrape (followers are added on first use).
        self.cachers = cachers
        # Which caches this worker owns (the others are follower replicas: the same objects again);
        # None: a single process, which owns them all.
        self.owns = owns

    def collect(self) -> Iterator[Metric]:
        # replica: "owner" (fed by the upstream) or "follower" (a copy fed by the owner worker). A sum
        # of objects over workers counts each object once per copy: select replica="owner".
        lbl = [*_LABELS, "replica"]
        g = {
            "rv": GaugeMetricFamily(
                "apiserver_watch_cache_resource_version", "Resource version of the watch cache", labels=lbl
            ),
            "objects": GaugeMetricFamily("watchcache_cached_objects", "Objects in the cache", labels=lbl),
            "bytes": GaugeMetricFamily("watchcache_cached_bytes", "JSON bytes of the cached objects", labels=lbl),
            "hev": GaugeMetricFamily("watchcache_history_events", "Events in the history window", labels=lbl),
            "hbytes": GaugeMetricFamily(
                "watchcache_history_bytes", "JSON bytes the history window references", labels=lbl
            ),
            "hage": GaugeMetricFamily(
                "watchcache_history_seconds", "Age of the oldest event in the window", labels=lbl
            ),
            "oldest": GaugeMetricFamily(
                "watchcache_history_oldest_resource_version", "The window starts after this rv", labels=lbl
            ),
            "watchers": GaugeMetricFamily(
                "apiserver_registered_watchers", "Watchers registered on the cache", labels=lbl
            ),
            "longrunning": GaugeMetricFamily(
                "apiserver_longrunning_requests", "Long-running requests (watches) in flight", labels=["verb", *lbl]
            ),
            "ready": GaugeMetricFamily(
                "watchcache_cache_ready", "1 once the cache has synced (and while its feed is suspended)", labels=lbl
            ),
            "suspended": GaugeMetricFamily(
                "watchcache_cache_suspended",
                "1 while the cache's upstream watch is suspended: only protobuf clients read the resource, from "
                "its protobuf cache (its rv is then not exported)",
                labels=lbl,
            ),
        }
        c = {
            "received": CounterMetricFamily(
                "apiserver_watch_cache_events_received", "Events the cache received", labels=lbl
            ),
            "dispatched": CounterMetricFamily(
                "apiserver_watch_cache_events_dispatched", "Event deliveries to watchers", labels=lbl
            ),
            "inits": CounterMetricFamily(
                "apiserver_watch_cache_initializations", "Cache (re)initialisations", labels=lbl
            ),
            "terminated": CounterMetricFamily(
                "apiserver_terminated_watchers", "Watchers ended because they could not keep up", labels=lbl
            ),
            "lists": CounterMetricFamily("apiserver_cache_list", "LISTs served from the cache", labels=lbl),
            "fetched": CounterMetricFamily(
                "apiserver_cache_list_fetched_objects", "Objects scanned by LISTs", labels=lbl
            ),
            "returned": CounterMetricFamily(
                "apiserver_cache_list_returned_objects", "Objects returned by LISTs", labels=lbl
            ),
            "wevents": CounterMetricFamily("apiserver_watch_events", "Watch event frames written", labels=lbl),
            "wbytes": CounterMetricFamily("watchcache_watch_bytes", "Watch stream bytes written", labels=lbl),
            "split": CounterMetricFamily(
                "watchcache_split_groups",
                "Groups of events sharing an rv (an upstream watch cache's) whose rest came in a later read",
                labels=lbl,
            ),
        }
        slow = CounterMetricFamily(
            "watchcache_slow_watchers",
            "Watchers that fell behind (lagged), then caught up from history or were ended with 410 (expired) "
            "or with 429 (retry_later: the upstream that has the history they need could not be asked)",
            labels=[*lbl, "outcome"],
        )
        failures = CounterMetricFamily(
            "watchcache_delivery_failures",
            "Deliveries that raised; each ended only the watcher (flush, dispatch) or follower stream (replica) "
            "concerned, whose client resumes or relists",
            labels=[*lbl, "path"],
        )
        owns = self.owns
        for resource, cacher in list(self.cachers.items()):
            lv = [resource.group, resource.resource, "owner" if owns is None or owns(resource) else "follower"]
            stats = cacher.cache.stats()
            oldest_time = cacher.cache.history.oldest_event_time
            suspended = cacher.state is CacherState.SUSPENDED
            if not suspended:  # a suspended cache's rv says nothing of its upstream watch (none): not "lagging"
                g["rv"].add_metric(lv, stats.rv)
            for key, value in (
                ("objects", stats.objects),
                ("bytes", stats.object_bytes),
                ("hev", stats.history_events),
                ("hbytes", stats.history_bytes),
                ("hage", 0.0 if oldest_time is None else cacher.clock() - oldest_time),
                ("oldest", stats.oldest_rv),
                ("watchers", len(cacher.dispatcher)),
                ("ready", 1 if cacher.serving else 0),
                ("suspended", 1 if suspended else 0),
            ):
                g[key].add_metric(lv, value)
            g["longrunning"].add_metric(["WATCH", *lv], len(cacher.dispatcher))
            for key, value in (
                ("received", cacher.events_received),
                ("dispatched", cacher.dispatcher.events_dispatched),
                ("inits", cacher.initializations),
                ("terminated", cacher.watchers_terminated),
                ("lists", cacher.lists),
                ("fetched", cacher.list_fetched),
                ("returned", cacher.list_returned),
                ("wevents", cacher.watch_frames_sent),
                ("wbytes", cacher.watch_bytes_sent),
                ("split", cacher.split_groups),
            ):
                c[key].add_metric(lv, value)
            slow.add_metric([*lv, "lagged"], cacher.watchers_lagged)
            slow.add_metric([*lv, "caught_up"], cacher.watchers_caught_up)
            slow.add_metric([*lv, "expired"], cacher.watchers_expired)
            slow.add_metric([*lv, "retry_later"], cacher.watchers_retry_later)
            for path in ("flush", "dispatch", "replica"):
                failures.add_metric([*lv, path], cacher.failures.get(path, 0))
        yield from g.values()
        yield from c.values()
        yield slow
        yield failures


_FETCH_OUTCOMES = (
    "ok",
    BackfillFailed.GONE,
    BackfillFailed.BOUND,
    BackfillFailed.MISMATCH,
    BackfillFailed.RELIST,
    BackfillFailed.UNREACHABLE,
    BackfillFailed.FAILED,
)
_REQUEST_OUTCOMES = ("served", *_FETCH_OUTCOMES[1:], BackfillFailed.DEADLINE)


class BackfillCollector(Collector):
    """Per cache with a source of older history (``dispatch.backfill.Backfills``): its fetches and waiting requests."""

    def __init__(self, cachers: Mapping[ResourceType, Cacher]) -> None:
        self.cachers = cachers

    def collect(self) -> Iterator[Metric]:
        lbl = _LABELS
        fetches = CounterMetricFamily(
            "watchcache_backfill_fetches",
            "Fetches of history older than the window (from the upstream, or a follower's from its owner), by "
            "outcome: ok, gone (the upstream's 410), bound (a --backfill-* limit or the window's size), mismatch "
            "(refused: it did not replay to the cache's state), relist, unreachable (a connection refused or cut, "
            "a 429 or 5xx), failed",
            labels=[*lbl, "outcome"],
        )
        requests = CounterMetricFamily(
            "watchcache_backfill_requests",
            "Reads and watches older than the window that waited for a backfill: served, or the outcome that "
            "made them 410 (deadline: --backfill-wait ran out), or 429 (unreachable)",
            labels=[*lbl, "outcome"],
        )
        events = CounterMetricFamily(
            "watchcache_backfill_events", "Events put in front of the window by backfills", labels=lbl
        )
        nbytes = CounterMetricFamily(
            "watchcache_backfill_bytes", "Bytes read to fetch them (the LIST at the old rv included)", labels=lbl
        )
        waiting = GaugeMetricFamily("watchcache_backfill_waiting", "Requests waiting for a backfill", labels=lbl)
        durations = HistogramMetricFamily(
            "watchcache_backfill_duration_seconds", "How long each fetch took", labels=lbl
        )
        for resource, cacher in list(self.cachers.items()):
            b = cacher.backfills
            # The cacher holds its source of older history by a Protocol; only Backfills counts.
            if not isinstance(b, Backfills):
                continue
            lv = [resource.group, resource.resource]
            for outcome in _FETCH_OUTCOMES:
                fetches.add_metric([*lv, outcome], b.fetches.get(outcome, 0))
            for outcome in _REQUEST_OUTCOMES:
                requests.add_metric([*lv, outcome], b.requests.get(outcome, 0))
            events.add_metric(lv, b.events_fetched)
            nbytes.add_metric(lv, b.bytes_fetched)
            waiting.add_metric(lv, b.waiting)
            durations.add_metric(lv, b.durations.cumulative(), b.durations.sum)
        yield from (fetches, requests, events, nbytes, waiting, durations)
