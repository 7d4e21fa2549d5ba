"""Issue 20, suite tier: a proxy restart mid-churn costs 20+ informers nothing.

Against ``watchcache sim`` (real processes, real sockets) with ``watchcache serve --workers 2
--resources configmaps`` in front, a writer updating ConfigMaps at ~40/s on the sim and 24
informer-style clients reading through the proxy (``tests.reliability.restarts``). Mid-churn:
SIGTERM and a new process on the same port (a rolling update); SIGKILL of the whole proxy and a
new process; SIGKILL of the worker owning configmaps, or of one following them (the supervisor
restarts it). Each must leave 0 relists, every update seen exactly once and in order by every
client (the checker, no relist diff accepted), and every client's final state equal to the sim's.

Run alone: ``.venv/bin/pytest -q -s -n 0 tests/reliability/test_restarts.py`` (~20 s a fault).
Before issue 20's history backfill (main 024c487), and with ``serve --no-backfill`` today, the
first three fail: every client relists, or a follower hands its watchers a resync difference
(docs/reliability.md, "Restarts").
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.restarts import FAULTS, ScenarioOptions, run_on_sim

CASES = list(FAULTS)


@pytest.mark.parametrize("fault", CASES)
@pytest.mark.timeout(240)
def test_a_proxy_restart_mid_churn_costs_the_informers_nothing(fault: str, tmp_path: Path) -> None:
    import uvloop

    outcome = uvloop.run(run_on_sim(ScenarioOptions(fault=fault), tmp_path))
    print(outcome.summary())
    assert outcome.clients >= 20 and outcome.writes > 150
    assert outcome.events > 1000, outcome.summary()  # the clients did watch the churn
    assert outcome.problems() == [], outcome.summary()
