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

from pathlib import Path

import pytest

from tests.reliability.failover import FAILOVER_FAULTS, assert_failover_verdict, run_failover_on_sim
from tests.reliability.restarts import ScenarioOptions


@pytest.mark.parametrize("fault", list(FAILOVER_FAULTS))
@pytest.mark.timeout(240)
def test_the_clients_of_a_killed_replica_resume_on_another_without_relisting(fault: str, tmp_path: Path) -> None:
    import uvloop

    scenario = uvloop.run(run_failover_on_sim(ScenarioOptions(fault=fault), tmp_path))
    outcome = scenario.outcome
    assert outcome is not None
    assert_failover_verdict(scenario, outcome)
