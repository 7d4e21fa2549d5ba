"""The fault campaign in CI: 60 seconds of faults, then every client's record is checked.

One test, so that one campaign runs even when pytest-xdist spreads tests over workers: the
verdict (no guarantee violated, every client converged, events delivered), then proof that the
checker would have noticed a loss in these very records (one event dropped, one duplicated).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import linearizability
from harness.checker import Upstream, check, read_log
from harness.proxylog import relist_points
from loadtest.chaos.campaign import Campaign, Options, summary, verdict

MIN_EVENTS = 10_000


@pytest.mark.campaign
@pytest.mark.timeout(300)
def test_campaign_keeps_every_watch_guarantee_and_the_checker_sees_an_injected_loss(tmp_path: Path) -> None:
    import uvloop

    opts = Options(duration=60.0, churn=50.0, objects=500, workdir=str(tmp_path), quiet=True, min_events=MIN_EVENTS)
    campaign = Campaign(opts)
    result = uvloop.run(campaign.run())
    print(summary(result))

    assert verdict(result, MIN_EVENTS) == [], summary(result)
    assert result["clients"] >= 100
    names = {p["name"] for p in result["phases"]}
    assert {"upstream SIGKILL + restart", "owner worker SIGKILL", "rolling restart (supervisor SIGTERM)"} <= names
    # The faults did bite: clients reconnected, every one of them across the rolling restart (which,
    # since the proxy backfills the history before its new window, costs them no relist).
    assert result["totals"]["reconnects"] > 100
    rolling = next(p for p in result["phases"] if p["name"] == "rolling restart (supervisor SIGTERM)")
    assert rolling["reconnects"] >= result["clients"], rolling
    # Every relist is put down to the proxy's own faults or to the upstream, and the proxy's own
    # faults (worker kills, the rolling restart) cost none (issue 20).
    totals = result["totals"]
    assert totals["relists_proxy"] + totals["relists_upstream"] == totals["relists"]
    assert totals["relists_proxy"] == 0, summary(result)

    # The same records, tampered with: the checker must notice.
    upstream = Upstream(read_log(str(tmp_path / "sim.journal")))
    relists = relist_points(tmp_path / "proxy.log")
    inf = max(campaign.informers, key=lambda i: i.counters.events)
    events = [i for i, r in enumerate(inf.records) if r[0] == "event"]

    dropped = list(inf.records)
    victim = dropped.pop(events[len(events) // 2])
    report = check(upstream, [(inf.id, inf.spec, dropped)], relists)
    assert report.total_violations >= 1, f"dropping {victim} went unnoticed"
    assert report.violations[0].kind in ("reliable", "resumable", "bookmarkable")
    assert any(victim[2] in v.expected for v in report.violations), [str(v) for v in report.violations]

    doubled = list(inf.records)
    at = events[len(events) // 3]
    doubled.insert(at + 1, doubled[at])
    report = check(upstream, [(inf.id, inf.spec, doubled)], relists)
    assert [v.kind for v in report.violations][:1] == ["unique"]

    # Consistent reads through the faults: linearizable, and a stale answer in the same history is caught.
    lin = result["linearizability"]
    assert lin["violations"] == 0 and lin["reads"]["list"] > 100 and lin["writes"] > 100, lin
    history = campaign.registers.history if campaign.registers is not None else None
    assert history is not None
    read, register = next(
        (r, k)
        for r in reversed(history.reads)
        for k, v in r.values.items()
        if r.kind == "list" and v >= 1 and history.writes[k][1].end < r.start
    )
    read.values = {**read.values, register: 0}  # as if the cache answered before a write it should have had
    assert any(register in v.why and "stale" in v.why for v in linearizability.check(history))
