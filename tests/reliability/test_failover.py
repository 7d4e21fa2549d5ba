"""Replica failover, suite tier: the clients of a killed replica resume on another, independent one.

``tests/reference/test_replica_failover.py``'s scenario (``tests.reliability.failover``) against
``watchcache sim``: two ``watchcache serve --workers 2 --resources configmaps`` replicas with one
continue-token key behind a relay (the Service), 24 informer-style clients through it (cluster-wide
ones too: the sim's journal logs every namespace), a writer at ~40/s on the sim. Before the kill, LISTs
paged across the replicas; after it, one whose first page the dead replica served. Verdict: 0 relists,
every update once and in order, every client at the sim's head with its state, the pages equal to the
sim's LIST at their rv, no traceback in either replica's log.

Run alone: ``.venv/bin/pytest -q -s -n 0 tests/reliability/test_failover.py -p no:randomly``.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tests.reliability.failover import FAILOVER_FAULTS, run_failover_on_sim
from tests.reliability.restarts import ScenarioOptions


@pytest.mark.parametrize("fault", list(FAILOVER_FAULTS))
@pytest.mark.timeout(240)
def test_the_clients_of_a_killed_replica_resume_on_another_without_relisting(fault: str, tmp_path: Path) -> None:
    import uvloop

    scenario = uvloop.run(run_failover_on_sim(ScenarioOptions(fault=fault), tmp_path))
    outcome = scenario.outcome
    assert outcome is not None
    print(outcome.summary())
    print(f"paged (selector, rv, pages): {scenario.paged} {scenario.paged_problems}")
    assert outcome.clients >= 20 and outcome.writes > 150
    assert outcome.events > 1000, outcome.summary()
    assert scenario.paged_problems == [], scenario.paged_problems
    assert scenario.paged and all(pages > 1 for _, _, pages in scenario.paged), scenario.paged
    errors = Counter(r[1] for i in scenario.informers for r in i.records if r[0] == "error")
    print(f"clients' errors by HTTP status (0: the connection failed): {dict(errors)}")
    gone = sorted({m for i in scenario.informers for _, _, m in i.gone_at})
    assert outcome.problems() == [], f"{outcome.summary()}\n410s: {gone[:5]}"
    tracebacks = scenario.service.tracebacks()
    assert not tracebacks, tracebacks[0]
