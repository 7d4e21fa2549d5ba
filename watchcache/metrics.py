"""Prometheus metrics: kube-apiserver's names where the meaning is the same, ours under ``watchcache_``.

The hot path never touches prometheus-client: ``Counter.inc`` costs 0.2–0.7 µs and
``.labels()`` another 0.7 µs, a plain ``int += 1`` 10 ns (docs/performance.md, design figures). Components count
in integers (``Cacher``, ``Reflector``, ``HttpWatchStream``) and ``CacheCollector`` turns
them into metric families at scrape time. Histograms are observed per request or per
flush (sampled), never per delivered event.

With several workers, each worker's samples carry a ``worker`` label and a scrape of any
worker returns every worker's samples (``merge_workers``), gathered over the shard sockets.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from watchcache.dispatch.backfill import Backfills
from watchcache.dispatch.cacher import Cacher
from watchcache.dispatch.freshness import Reached, Wait
from watchcache.http.admission import Admission
from watchcache.resources import ResourceType
from watchcache.watchers.budget import WatchBudget
from watchcache.watchers.flush import FlushScheduler

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# kube-apiserver's apiserver_watch_cache_read_wait_seconds buckets.
_WAIT_BUCKETS = (0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0)
_REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0)


_FALLBACK_REASONS = {Reached.IMPATIENT: "small-read", Reached.TIMEOUT: "timeout", Reached.NO_TARGET: "no-target"}


class Metrics:
    """The per-request and per-flush observations; one instance per process."""

    def __init__(self, registry: CollectorRegistry | None = None, *, delivery_sample: int = 16) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
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
            "target": "Consistent reads: learning the upstream's rv (a consistent limit=1 LIST, shared)",
            "events": "Consistent reads reached by the cache's own events: from the target known to reached",
            "probe": "Consistent reads reached by a proof of progress (probe or bookmark): from the target known",
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
            "Consistent reads passed through, by why: small-read (--consistent-passthrough-objects, by choice), "
            "timeout (not proven fresh within --fresh-wait), no-target (the upstream's rv could not be read)",
            ["group", "resource", "reason"],
            registry=r,
        )
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

    def request(self, verb: str, resource: ResourceType | None, code: int, seconds: float | None) -> None:
        group, name = (resource.group, resource.resource) if resource is not None else ("", "")
        self.requests.labels(verb, group, name, str(code)).inc()
        if seconds is not None:
            self.request_seconds.labels(verb, group, name).observe(seconds)

    def waited(self, resource: ResourceType, wait: Wait, *, consistent: bool) -> None:
        """A read that could not be served at once waited (``freshness.reach``)."""
        group, name = resource.group, resource.resource
        self.read_wait.labels(group, name).observe(wait.seconds)
        if not consistent:
            return
        fallback = "false" if wait.reached else "true"
        self.consistent_reads.labels(group, name, "true", fallback).inc()
        if not wait.reached:
            self.consistent_fallbacks.labels(group, name, _FALLBACK_REASONS[wait.how]).inc()
        self.consistent_total.labels(group, name, fallback).observe(wait.seconds)
        if wait.how is not Reached.NO_TARGET:
            self.consistent_phase["target"].labels(group, name).observe(wait.target_seconds)
        if wait.how in (Reached.AT_ONCE, Reached.EVENTS):
            self.consistent_phase["events"].labels(group, name).observe(wait.wait_seconds)
        elif wait.how is Reached.PROGRESS:
            self.consistent_phase["probe"].labels(group, name).observe(wait.wait_seconds)

    def flushed(self, resource: ResourceType, oldest_pending: float, frame_bytes: int) -> None:
        """Called once per flush; observes one in ``delivery_sample``."""
        if not self.delivery_sample:
            return
        self._flushes += 1
        if self._flushes % self.delivery_sample:
            return
        self.delivery.observe(time.monotonic() - oldest_pending)
        self.event_sizes.observe(frame_bytes)


class CacheCollector(Collector):
    """Plain counters of the caches, reflectors and followers, read at scrape time."""

    def __init__(
        self,
        cachers: dict[ResourceType, Cacher],
        passed_through: dict[str, int],
        *,
        passthrough_reasons: Iterable[str] = (),
        consistent: Any = None,
        reflectors: Callable[[], Iterable[Any]] = tuple,
        followers: Callable[[], Iterable[Any]] = tuple,
        restarts_file: Path | None = None,
        rejected: dict[str, int] | None = None,
        auth: Any = None,
        identity: Any = None,
        admission: Admission | None = None,
        watch_budget: WatchBudget | None = None,
        requests: Any = None,
        flusher: FlushScheduler | None = None,
        owns: Callable[[ResourceType], bool] | None = None,
        failures: Any = None,
        worker: int | None = None,
    ) -> None:
        self.cachers = cachers
        self.passed_through = passed_through
        # Every reason the server may count (``server.negotiation.PassReason``), exported from the start.
        self.passthrough_reasons = tuple(passthrough_reasons)
        self.consistent = consistent
        self.reflectors = reflectors
        self.followers = followers
        self.restarts_file = restarts_file
        self.rejected = rejected if rejected is not None else {}
        self.auth = auth
        self.identity = identity
        self.admission = admission
        self.watch_budget = watch_budget
        # The process's flush scheduler: writes and frames per write (coalescing).
        self.flusher = flusher
        # The API handler: requests holding in-flight slots, watches passed through.
        self.requests = requests
        # Which caches this worker owns (the others are follower replicas: the same objects again).
        self.owns = owns
        # The last failures of the proxy's own upstream requests (``upstream.failures.LastFailures``).
        self.failures = failures
        self.worker = worker

    def collect(self) -> Iterator[Metric]:
        yield from self._caches()
        yield from self._backfills()
        yield from self._reflectors()
        yield from self._passthrough_and_consistency()

    def _caches(self) -> Iterator[Metric]:
        # replica: "owner" (fed by the upstream) or "follower" (a copy fed by the owner worker). A sum
        # of objects over workers counts each object once per copy: select replica="owner".
        lbl = ["group", "resource", "replica"]
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
            "ready": GaugeMetricFamily("watchcache_cache_ready", "1 once the cache has synced", labels=lbl),
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
            "Watchers that fell behind (lagged), then caught up from history or were ended with 410 (expired)",
            labels=[*lbl, "outcome"],
        )
        failures = CounterMetricFamily(
            "watchcache_delivery_failures",
            "Deliveries that raised; each ended only the watcher (flush, dispatch) or follower stream (replica) "
            "concerned, whose client resumes or relists",
            labels=[*lbl, "path"],
        )
        now = time.monotonic()
        owns = self.owns
        for resource, cacher in list(self.cachers.items()):
            lv = [resource.group, resource.resource, "owner" if owns is None or owns(resource) else "follower"]
            stats = cacher.cache.stats()
            oldest_time = cacher.cache.history.oldest_event_time
            for key, value in (
                ("rv", stats.rv),
                ("objects", stats.objects),
                ("bytes", stats.object_bytes),
                ("hev", stats.history_events),
                ("hbytes", stats.history_bytes),
                ("hage", 0.0 if oldest_time is None else now - oldest_time),
                ("oldest", stats.oldest_rv),
                ("watchers", len(cacher.dispatcher)),
                ("ready", 1 if cacher.ready else 0),
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
            for path in ("flush", "dispatch", "replica"):
                failures.add_metric([*lv, path], cacher.failures.get(path, 0))
        yield from g.values()
        yield from c.values()
        yield slow
        yield failures
        budget = self.watch_budget
        if budget is not None:
            yield GaugeMetricFamily(
                "watchcache_watch_budget_bytes",
                "Unsent watch bytes counted against --max-watch-buffer-total-bytes",
                value=budget.pending,
            )
            yield CounterMetricFamily(
                "watchcache_watch_budget_lagged",
                "Watchers sent to catch up from history because all watchers' unsent bytes exceeded the budget",
                value=budget.shed,
            )
        flusher = self.flusher
        if flusher is not None:
            yield CounterMetricFamily(
                "watchcache_watch_writes",
                "Writes to watch connections (one per watcher with frames pending, per flush pass)",
                value=flusher.writes,
            )
            yield CounterMetricFamily(
                "watchcache_watch_frames_written",
                "Watch frames (events and bookmarks) carried by those writes",
                value=flusher.frames,
            )
            hist = flusher.frames_per_write
            yield HistogramMetricFamily(
                "watchcache_watch_frames_per_write",
                "Frames per write, one observation per flush pass (its frames over its writes): "
                "coalescing, see --watch-flush-interval",
                buckets=hist.cumulative(),
                sum_value=hist.sum,
            )

    def _backfills(self) -> Iterator[Metric]:
        """Backfills (dispatch/backfill.py): fetches of older history, and the requests that waited for them."""
        lbl = ["group", "resource"]
        fetches = CounterMetricFamily(
            "watchcache_backfill_fetches",
            "Fetches of history older than the window (from the upstream, or a follower's from its owner), by "
            "outcome: ok, gone (the upstream's 410), bound (a --backfill-* limit or the window's size), mismatch "
            "(refused: it did not replay to the cache's state), relist, failed",
            labels=[*lbl, "outcome"],
        )
        requests = CounterMetricFamily(
            "watchcache_backfill_requests",
            "Reads and watches older than the window that waited for a backfill: served, or the outcome that "
            "made them 410 (deadline: --backfill-wait ran out)",
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
            if not isinstance(b, Backfills):
                continue
            lv = [resource.group, resource.resource]
            for outcome in ("ok", "gone", "bound", "mismatch", "relist", "failed"):
                fetches.add_metric([*lv, outcome], b.fetches.get(outcome, 0))
            for outcome in ("served", "gone", "bound", "mismatch", "relist", "failed", "deadline"):
                requests.add_metric([*lv, outcome], b.requests.get(outcome, 0))
            events.add_metric(lv, b.events_fetched)
            nbytes.add_metric(lv, b.bytes_fetched)
            waiting.add_metric(lv, b.waiting)
            durations.add_metric(lv, b.durations.cumulative(), b.durations.sum)
        yield from (fetches, requests, events, nbytes, waiting, durations)

    def _reflectors(self) -> Iterator[Metric]:
        lbl = ["group", "resource"]
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
        now = time.monotonic()
        for r in self.reflectors():
            lv = [r.resource.group, r.resource.resource]
            relists.add_metric(lv, r.relists)
            restarts.add_metric(lv, r.watch_restarts)
            gone.add_metric(lv, r.gone)
            age.add_metric(lv, 0.0 if r.last_event_at is None else now - r.last_event_at)
            state.add_metric([*lv, r.state.value], 1)
        follower_synced = GaugeMetricFamily(
            "watchcache_follower_synced", "1 once a follower replica has caught up with its owner", labels=lbl
        )
        resyncs = CounterMetricFamily(
            "watchcache_follower_resyncs", "Follower resyncs from a fresh snapshot", labels=lbl
        )
        resumes = CounterMetricFamily(
            "watchcache_follower_resumes",
            "Follow streams that went on from the follower's rv after a break (no snapshot, no difference)",
            labels=lbl,
        )
        for f in self.followers():
            lv = [f.resource.group, f.resource.resource]
            follower_synced.add_metric(lv, 1 if f.cacher.ready else 0)
            resyncs.add_metric(lv, f.resyncs)
            resumes.add_metric(lv, f.resumes)
        yield from (relists, restarts, gone, age, state, follower_synced, resyncs, resumes)
        if self.failures is not None:
            errors = CounterMetricFamily(
                "watchcache_upstream_errors",
                'Failed upstream requests of the proxy\'s own (discovery: resource=""), by reason (forbidden: '
                "RBAC; unauthorized: its credential; not-tls; certificate; refused; ...): /readyz?verbose has the last",
                labels=[*lbl, "reason"],
            )
            counts = dict(self.failures.counts)
            for reason in ("unauthorized", "forbidden"):  # defined from the start, so rate() is too
                counts.setdefault((None, reason), 0)
            for (resource, reason), count in sorted(counts.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
                errors.add_metric([resource.group if resource else "", resource.resource if resource else "", reason],
                                  count)  # fmt: skip
            yield errors

    def _passthrough_and_consistency(self) -> Iterator[Metric]:
        passthrough = CounterMetricFamily(
            "watchcache_passthrough_requests", "Requests forwarded to the upstream, by reason", labels=["reason"]
        )
        # Every reason, zeros included, so a rate() over any of them is defined from the start.
        for reason in self.passthrough_reasons:
            passthrough.add_metric([reason], self.passed_through.get(reason, 0))
        yield passthrough
        rejected = CounterMetricFamily(
            "watchcache_rejected_requests",
            "Requests (or connections) refused by a limit: 429, 408 or closed (see docs/security.md)",
            labels=["limit"],
        )
        for limit in ("inflight", "watchers", "tunnels", "shutdown"):
            rejected.add_metric([limit], self.rejected.get(limit, 0))
        admission = self.admission
        if admission is not None:
            for limit, count in admission.rejected.items():
                rejected.add_metric([limit], count)
        yield rejected
        if admission is not None:
            yield GaugeMetricFamily(
                "watchcache_http_connections", "Open client connections", value=admission.connections
            )
            yield GaugeMetricFamily(
                "watchcache_http2_connections",
                "Open client connections speaking HTTP/2",
                value=admission.h2_connections,
            )
            yield GaugeMetricFamily(
                "watchcache_http2_streams", "HTTP/2 streams open (each watch holds one)", value=admission.h2_streams
            )
            yield GaugeMetricFamily(
                "watchcache_http_request_buffer_bytes",
                "Request bytes (heads and bodies) received or announced and not answered yet",
                value=admission.buffered,
            )
        if self.requests is not None:
            inflight = GaugeMetricFamily(
                "apiserver_current_inflight_requests",
                "Requests holding an in-flight slot (--max-requests-inflight), watches until registered",
                labels=["request_kind"],
            )
            for kind, count in self.requests.active_by_kind.items():
                inflight.add_metric([kind], count)
            yield inflight
            yield GaugeMetricFamily(
                "watchcache_passthrough_streams",
                "Watches and other long-running requests being passed through (counted toward --max-watchers)",
                value=self.requests.streams,
            )
        if self.auth is not None:
            decisions = CounterMetricFamily(
                "watchcache_auth_decisions",
                "Delegated authn/authz outcomes of cached reads and of the proxy's own endpoints",
                labels=["decision"],
            )
            stats = self.auth.stats()
            for decision in ("allowed", "denied", "unauthenticated", "anonymous", "failed"):
                decisions.add_metric([decision], stats.get(decision, 0))
            yield decisions
        if self.identity is not None:
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
        if self.consistent is not None:
            probes = CounterMetricFamily(
                "watchcache_consistency_probes",
                "Probe watches the proxy opened to prove a cache's progress, by how they ended",
                labels=["group", "resource", "outcome"],
            )
            for (resource, outcome), count in list(self.consistent.probe_outcomes.items()):
                probes.add_metric([resource.group, resource.resource, outcome], count)
            yield probes
            fetches = CounterMetricFamily(
                "watchcache_consistency_target_fetches",
                "Consistent limit=1 LISTs the proxy sent to learn the upstream's rv, by outcome",
                labels=["group", "resource", "outcome"],
            )
            for resource, outcome, count in self.consistent.target_fetches():
                fetches.add_metric([resource.group, resource.resource, outcome], count)
            yield fetches
        if self.restarts_file is not None:
            # This worker's own restarts (the merge of the workers' expositions labels it with its id;
            # each exporting every worker's count gave one series per worker twice, under one label).
            counts = json.loads(self.restarts_file.read_text()) if self.restarts_file.exists() else {}
            yield CounterMetricFamily(
                "watchcache_worker_restarts",
                "Times the supervisor restarted this worker (it died)",
                value=counts.get(str(self.worker), 0),
            )


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)


def merge_workers(texts: Sequence[tuple[int, bytes]]) -> bytes:
    """One exposition from several workers' expositions, each sample labelled with its worker."""
    merged: dict[str, Metric] = {}
    for worker, text in texts:
        for family in text_string_to_metric_families(text.decode()):
            into = merged.get(family.name)
            if into is None:
                into = merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
            for sample in family.samples:
                labels = {**sample.labels, "worker": str(worker)}
                into.add_sample(sample.name, labels, sample.value, sample.timestamp, sample.exemplar)

    class _Merged(Collector):
        def collect(self) -> Iterator[Metric]:
            return iter(merged.values())

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged())
    return generate_latest(registry)
