"""``watchcache sim``: a writable in-memory Kubernetes API for demos, tests and load tests."""

from watchcache.sim.churn import Churn, populate
from watchcache.sim.cluster import SimCluster
from watchcache.sim.writes import handle_write

__all__ = ["Churn", "SimCluster", "handle_write", "populate"]
