"""shard/metrics.py: a follower's sync, resyncs and resumes; this worker's restarts."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.collectors import CM, k, scrape
from watchcache.dispatch.cacher import Cacher
from watchcache.resources import CONFIGMAPS
from watchcache.shard.follower import Follower
from watchcache.shard.metrics import FollowerCollector, RestartsCollector


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
