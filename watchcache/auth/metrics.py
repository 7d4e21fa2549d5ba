"""The gate's metric family: delegated authentication and authorization outcomes, read at scrape time."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from watchcache.auth.gate import Gate

__all__ = ["GateCollector"]


class GateCollector(Collector):
    """Outcomes of cached reads and the proxy's own endpoints: allowed, denied, unauthenticated, anonymous, failed."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate

    def collect(self) -> Iterator[Metric]:
        decisions = CounterMetricFamily(
            "watchcache_auth_decisions",
            "Delegated authn/authz outcomes of cached reads and of the proxy's own endpoints",
            labels=["decision"],
        )
        gate = self.gate
        for decision, count in (
            ("allowed", gate.allowed),
            ("denied", gate.denied),
            ("unauthenticated", gate.unauthenticated),
            ("anonymous", gate.anonymous),
            ("failed", gate.failed),
        ):
            decisions.add_metric([decision], count)
        yield decisions
