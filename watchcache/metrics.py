"""Prometheus: a process's exposition, and the merge of every worker's into one.

The hot path never touches prometheus-client: ``Counter.inc`` costs 0.2–0.7 µs and
``.labels()`` another 0.7 µs, a plain ``int += 1`` 10 ns (docs/lab/performance-notebook.md, design figures).
Components count in integers, and each package turns its components' counters into metric
families at scrape time, in a ``metrics`` module beside them (as kube's ``cacher/metrics``),
typed with the components' own classes so that ``mypy`` catches a renamed counter:

| families | where |
|---|---|
| the caches: rv, objects, history, watchers, LISTs, watch output, slow watchers, failures | ``dispatch/metrics.py`` |
| backfills: fetches, waiting requests, events, bytes, durations | ``dispatch/metrics.py`` |
| watch writes, frames per write, the watch budget | ``watchers/metrics.py`` |
| reflectors, the proxy's own upstream errors, consistency probes and fetches, identities | ``upstream/metrics.py`` |
| followers (synced, resyncs, resumes), worker restarts | ``shard/metrics.py`` |
| auth decisions | ``auth/metrics.py`` |
| connections, HTTP/2 connections and streams, request bytes held | ``http/metrics.py`` |
| requests, read waits, consistent reads and fallbacks, delivery latency, frame sizes | ``server/metrics.py`` |
| pass-through by reason, refusals by limit, requests in flight | ``server/metrics.py`` |
| tunnels (connection upgrades) | ``server/metrics.py`` |
| API Priority and Fairness (``apiserver_flowcontrol_*``), skipped flow control objects | ``fairness/metrics.py`` |

``service.lifecycle`` registers them in one registry per process (``process_registry``: with
``watchcache_build_info``, as kube's ``kubernetes_build_info``, and without prometheus-client's
``_created`` series); this module renders it and, with several workers, merges every worker's
exposition, each sample labelled with its worker (gathered over the shard sockets), so a scrape of
any worker returns them all.
"""

from __future__ import annotations

import platform
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, disable_created_metrics, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from watchcache.version import version

__all__ = ["BuildInfo", "merge_workers", "process_registry", "render"]


class BuildInfo(Collector):
    """``watchcache_build_info{version, python_version} 1``: which build each process runs (a rollout
    half done shows two versions), as kube-apiserver's ``kubernetes_build_info``."""

    def __init__(self, version: str, python_version: str) -> None:
        self.version = version
        self.python_version = python_version

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "watchcache_build_info",
            "A metric with a constant '1' value labeled by the watchcache version and the Python version it runs on",
            labels=["version", "python_version"],
        )
        family.add_metric([self.version, self.python_version], 1)
        yield family


def process_registry() -> CollectorRegistry:
    """The registry of a process that serves /metrics, with its build info.

    prometheus-client adds a ``<name>_created`` sample (the series' creation time) to each counter
    and histogram, which the text format exposes as one more gauge family per family (12 here).
    Nothing of kube's has them, dashboards never read them, and every scrape carried them: off for
    the whole process (a module-wide switch in prometheus-client, read at every collect).
    """
    disable_created_metrics()
    registry = CollectorRegistry()
    registry.register(BuildInfo(version(), platform.python_version()))
    return registry


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
