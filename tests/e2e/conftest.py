"""End-to-end fixtures: real ``watchcache`` processes on real sockets (harness/processes.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.processes import Proc, Stack, start, start_stack


@pytest.fixture
def sim() -> Iterator[Proc]:
    """A simulated cluster with 120 pods in 3 namespaces, no churn."""
    proc = start("sim", "--objects", "120", "--namespaces", "3")
    yield proc
    proc.stop()


@pytest.fixture
def serve() -> Iterator[Proc]:
    """The service on its embedded simulated cluster, 120 pods in 3 namespaces, no churn."""
    proc = start("serve", "--simulated", "--sim-objects", "120", "--sim-namespaces", "3")
    yield proc
    proc.stop()


@pytest.fixture(params=["sim", "serve"])
def api(request: pytest.FixtureRequest) -> Iterator[Proc]:
    """Both servers: the simulated cluster and the service must answer identically."""
    if request.param == "sim":
        proc = start("sim", "--objects", "120", "--namespaces", "3")
    else:
        proc = start("serve", "--simulated", "--sim-objects", "120", "--sim-namespaces", "3")
    yield proc
    proc.stop()


@pytest.fixture
def stack() -> Iterator[Stack]:
    s = start_stack()
    yield s
    s.proxy.stop()
    s.sim.stop()
