"""A normal start says each finding once, at the level an operator expects.

Against the project's own simulator a 2-worker proxy logged 14 warnings: an open-files "warning"
per process for the default --max-connections (a ceiling, nothing to act on), "not caching ..." for
each of five default resources the simulator did not serve, per worker, and the authentication
warning per worker. Now the simulator serves every default resource, one worker speaks for the
group, a default the upstream lacks is INFO, and what the operator asked for and cannot have (a
resource named in --resources) stays a WARNING.
"""

from __future__ import annotations

import pytest

from harness.processes import start, start_stack, wait_logged, wait_ready

pytestmark = pytest.mark.timeout(90)


def warnings(log: list[str]) -> list[str]:
    return [line for line in log if " WARNING " in line or " ERROR " in line]


def test_a_two_worker_start_against_the_simulator_warns_once_about_what_is_actionable() -> None:
    stack = start_stack("--workers", "2", "--authentication", "none")
    try:
        for worker in ("w0", "w1"):  # each has resolved its resources (discovery) and started its reflectors
            wait_logged(stack.proxy, lambda line, w=worker: f" {w} watchcache: caching " in line, 30)
        said = warnings(stack.proxy.log)
        assert len(said) == 1 and "AUTHENTICATION IS OFF" in said[0], said  # asked for: once, not per worker
        assert not [line for line in stack.proxy.log if "not caching" in line]  # the sim serves every default
        connections = [line for line in stack.proxy.log if "client connections per worker" in line]
        assert len(connections) <= 1 and all(" INFO " in line for line in connections), connections
        assert warnings(stack.sim.log) == []
    finally:
        stack.proxy.stop()
        stack.sim.stop()


def test_a_resource_named_in_the_flag_that_the_upstream_does_not_serve_is_a_warning() -> None:
    sim = start("sim", "--objects", "10", "--namespaces", "1")
    try:
        proxy = start("serve", "--upstream", sim.url, "--resources", "pods,batch/v1/jobs", "--workers", "1")
        try:
            wait_ready(proxy)
            line = wait_logged(proxy, lambda line: "not caching" in line)
            assert " WARNING " in line and "batch/v1/jobs (--resources)" in line, line
        finally:
            proxy.stop()
    finally:
        sim.stop()
