"""make chaos's split of relists: the proxy's own faults apart from what the upstream forced."""

from __future__ import annotations

import time
from dataclasses import asdict
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


def test_a_relist_put_on_the_proxy_carries_its_evidence_into_the_summary(tmp_path: Path) -> None:
    """A relist put on the proxy once in CI could not be explained after the workdir was gone: the
    report now shows the 410's message, the floors and relists around it and the proxy's log."""
    from harness.checker import WatchSpec
    from harness.fleet import Informer
    from loadtest.chaos.campaign import PhaseResult, summary

    c = campaign(tmp_path)
    t0 = time.mktime(time.strptime("2026-11-27 11:38:20", "%Y-%m-%d %H:%M:%S"))
    (tmp_path / "proxy.log").write_text(
        "2026-11-27 11:38:10,000 INFO w0 watchcache.service: long before\n"
        "2026-11-27 11:38:19,500 WARNING supervisor: worker 1 exited\n"
        "2026-11-27 11:38:22,000 INFO w0 watchcache.service: long after\n"
    )
    c.floors = {"pods": [(t0 - 5, 50), (t0 + 30, 80)]}
    inf = Informer("c007", "http://127.0.0.1:1", WatchSpec(resource="pods"), session=None)  # type: ignore[arg-type]
    e = c.evidence(inf, PhaseResult("combined", 0.0), t0, 60, "too old resource version: 60 (70)", {})
    assert e["message"] == "too old resource version: 60 (70)"
    assert e["floors"] == [(-5.0, 50)]  # the one 30 s later is not about it
    assert e["floor_then"] == 50  # what ``cause_of`` compared the rv with
    assert e["proxy_log"] == ["2026-11-27 11:38:19,500 WARNING supervisor: worker 1 exited"]
    text = summary(
        {
            "totals": {"events": 0, "reconnects": 0, "relists": 1, "relists_proxy": 1, "relists_upstream": 0,
                       "violations": 0},
            "phases": [], "clients": 1, "upstream_writes": 0, "final_rv": 0, "writes_ok": 0, "writes_failed": 0,
            "relist_groups_accepted": 0, "replays_tolerated": 0, "not_converged": [], "check_seconds": 0,
            "wall_seconds": 0, "violations_by_kind": {}, "known_bugs": "none", "violations": [],
            "linearizability": {"operations": 0, "violations": 0, "examples": []},
            "proxy_relists": [e],
        }
    )  # fmt: skip
    assert "c007" in text and "too old resource version: 60 (70)" in text and "worker 1 exited" in text


def test_a_429_is_an_error_the_client_retried_from_its_rv_and_no_relist(tmp_path: Path) -> None:
    """The proxy tells a client to come back (429) while the history it needs cannot be fetched: the
    report counts those apart from the 410s, which are relists."""
    from harness.checker import ClientResult, Report, WatchSpec
    from harness.fleet import Informer
    from loadtest.chaos.campaign import PhaseResult, summary

    c = campaign(tmp_path)
    c.phases = [PhaseResult("combined", 0.0)]
    inf = Informer("c001", "http://127.0.0.1:1", WatchSpec(resource="pods"), session=None)  # type: ignore[arg-type]
    inf.records = [("list", 40, {}, None), ("reconnect", 40), ("error", 429), ("reconnect", 40), ("error", 500)]
    inf.marks = [(0, 0)]
    c.informers = [inf]
    c.attribute(Report(clients=[ClientResult("c001", inf.spec)]))
    [p] = c.phases
    assert (p.errors, p.retried, p.relists, p.reconnects) == (2, 1, 0, 1)
    text = summary(
        {
            "totals": {"events": 0, "reconnects": 1, "relists": 0, "relists_proxy": 0, "relists_upstream": 0,
                       "violations": 0},
            "phases": [asdict(p)], "clients": 1, "upstream_writes": 0, "final_rv": 0, "writes_ok": 0,
            "writes_failed": 0, "relist_groups_accepted": 0, "replays_tolerated": 0, "not_converged": [],
            "check_seconds": 0, "wall_seconds": 0, "violations_by_kind": {}, "known_bugs": "none", "violations": [],
            "linearizability": {"operations": 0, "violations": 0, "examples": []},
        }
    )  # fmt: skip
    assert "429s (the client retried from its rv): 1" in text
