"""The worker group's metric families: follower replicas, and this worker's restarts by the supervisor.

Followers are read at scrape time from their plain counters; restarts from the file the
supervisor keeps in the shard directory (``shard/layout.py``: restarts.json), as the supervisor
is another process.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from watchcache.shard.follower import Follower

__all__ = ["FollowerCollector", "RestartsCollector"]

_LABELS = ["group", "resource"]


class FollowerCollector(Collector):
    """Per followed resource: whether the replica caught up with its owner, its resyncs and its resumes."""

    def __init__(self, followers: Callable[[], Iterable[Follower]]) -> None:
        # Called at each scrape: followers are made on first use and dropped when idle.
        self.followers = followers

    def collect(self) -> Iterator[Metric]:
        synced = GaugeMetricFamily(
            "watchcache_follower_synced", "1 once a follower replica has caught up with its owner", labels=_LABELS
        )
        resyncs = CounterMetricFamily(
            "watchcache_follower_resyncs", "Follower resyncs from a fresh snapshot", labels=_LABELS
        )
        resumes = CounterMetricFamily(
            "watchcache_follower_resumes",
            "Follow streams that went on from the follower's rv after a break (no snapshot, no difference)",
            labels=_LABELS,
        )
        for f in self.followers():
            lv = [f.resource.group, f.resource.resource]
            synced.add_metric(lv, 1 if f.cacher.ready else 0)
            resyncs.add_metric(lv, f.resyncs)
            resumes.add_metric(lv, f.resumes)
        yield from (synced, resyncs, resumes)


class RestartsCollector(Collector):
    """This worker's restarts (0 until the supervisor has written its file)."""

    def __init__(self, restarts_file: Path, worker: int) -> None:
        self.restarts_file = restarts_file
        self.worker = worker

    def collect(self) -> Iterator[Metric]:
        # Unlabelled: the merge of the workers' expositions labels it with its worker (each exporting
        # every worker's count gave one series per worker twice, under one label).
        counts = json.loads(self.restarts_file.read_text()) if self.restarts_file.exists() else {}
        yield CounterMetricFamily(
            "watchcache_worker_restarts",
            "Times the supervisor restarted this worker (it died)",
            value=counts.get(str(self.worker), 0),
        )
