"""A sim with a fixed clock and seed, and one pod in it for the tests that change one."""

from __future__ import annotations

import pytest

from tests.sim.helpers import WALL, pod
from watchcache.cache.object import CachedObject
from watchcache.resources import PODS
from watchcache.sim.cluster import SimCluster


@pytest.fixture
def sim() -> SimCluster:
    return SimCluster(clock=lambda: 100.0, wall_clock=lambda: WALL, seed=7)


@pytest.fixture
def web(sim: SimCluster) -> CachedObject:
    return sim.create(PODS, "default", pod())
