"""make chaos's split of relists: the proxy's own faults apart from what the upstream forced."""

from __future__ import annotations

import time
from pathlib import Path

from harness.proxylog import relist_times
from loadtest.chaos.campaign import Campaign, Options


def campaign(tmp_path: Path) -> Campaign:
    c = Campaign(Options(workdir=str(tmp_path), quiet=True))
    c.floors = {"pods": [(100.0, 50), (200.0, 80)]}  # compacted at rv 50 (t=100), restarted at rv 80 (t=200)
    return c


def test_a_resume_below_the_upstreams_window_is_the_upstreams_doing(tmp_path: Path) -> None:
    c = campaign(tmp_path)
    assert c.cause_of("pods", 150.0, 49, {}) == "upstream"  # below the floor of t=100
    assert c.cause_of("pods", 150.0, 60, {}) == "proxy"  # the upstream still serves 60 then
    assert c.cause_of("pods", 199.8, 60, {}) == "upstream"  # 0.5 s of slack: the floor is polled
    assert c.cause_of("pods", 99.0, 40, {}) == "proxy"  # before the compaction
    assert c.cause_of("configmaps", 300.0, 1, {}) == "proxy"  # no floor known for it


def test_a_resume_from_before_the_proxys_forced_relist_is_the_upstreams_doing(tmp_path: Path) -> None:
    c = campaign(tmp_path)
    relists = {"pods": [(120.0, 70)]}  # the proxy relisted at rv 70 after the upstream's 410
    assert c.cause_of("pods", 130.0, 65, relists) == "upstream"  # held part of the diff
    assert c.cause_of("pods", 130.0, 70, relists) == "proxy"  # at the relist's rv: must be served
    assert c.cause_of("pods", 110.0, 65, relists) == "proxy"  # before the relist


def test_relist_times_come_from_reflector_relists_only(tmp_path: Path) -> None:
    log = tmp_path / "proxy.log"
    log.write_text(
        "2026-11-27 11:38:20,450 INFO w0 watchcache.upstream.reflector: relisted pods at rv 1234: 10 objects\n"
        "2026-11-27 11:38:21,000 INFO w0 watchcache.shard.follower: following pods: caught up at rv 1300\n"
    )
    expected = time.mktime(time.strptime("2026-11-27 11:38:20", "%Y-%m-%d %H:%M:%S")) + 0.45
    assert relist_times(log) == {"pods": [(expected, 1234)]}
