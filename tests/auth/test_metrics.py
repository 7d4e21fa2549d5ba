"""auth/metrics.py: the decisions of a real gate over the simulator's example policy."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from tests.support.authfakes import info_of, request
from tests.support.collectors import scrape
from watchcache.apierrors import StatusError
from watchcache.auth.gate import Gate
from watchcache.auth.metrics import GateCollector
from watchcache.sim.auth import LocalReviewClient
from watchcache.sim.policy import load_policy

EXAMPLE_POLICY = Path(__file__).parents[2] / "watchcache" / "sim" / "policy-example.yaml"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def test_the_gates_decisions() -> None:
    gate = Gate.build(LocalReviewClient(load_policy(EXAMPLE_POLICY)))

    async def read(target: str, token: str | None) -> None:
        req = request(target, token=token)
        with contextlib.suppress(StatusError):
            await gate.check(req, info_of(req))

    async def decide() -> None:
        await read("/api/v1/namespaces/ns-1/pods", "alice-token")  # allowed
        await read("/api/v1/namespaces/ns-1/pods", "alice-token")  # allowed (cached)
        await read("/api/v1/namespaces/ns-2/pods?watch=true", "bob-token")  # denied
        await read("/api/v1/namespaces/ns-1/pods", "mallory-token")  # unauthenticated
        await read("/api/v1/namespaces/ns-1/pods", None)  # anonymous, then denied

    asyncio.run(decide())
    samples, _ = scrape(GateCollector(gate))
    decisions = {k[1][0][1]: v for k, v in samples.items() if k[0] == "watchcache_auth_decisions_total"}
    assert decisions == {"allowed": 2, "denied": 2, "unauthenticated": 1, "anonymous": 1, "failed": 0}
