"""The harness's processes die with the test run that started them, even in a session of their own.

A killed pytest (a CI timeout, an xdist worker that crashed, a ^C that reaches only its group) runs no
fixture's teardown: a proxy left running holds its port and a core through the next run.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.orphans import child_outlives_a_killed_parent

ROOT = Path(__file__).resolve().parents[2]

# The test run: starts a sleeper through the harness, in a session of its own, and says its pid.
RUN = (
    "import sys, time\n"
    "from harness.processes import Proc\n"
    "p = Proc([sys.executable, '-c', 'import time; time.sleep(120)'], name='sleeper', new_session=True).start()\n"
    "print(p.process.pid, flush=True)\n"
    "time.sleep(120)\n"
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_harness_process_in_a_session_of_its_own_dies_with_a_killed_run() -> None:
    assert not child_outlives_a_killed_parent(RUN, cwd=str(ROOT)), "the harness's process outlived the run"
