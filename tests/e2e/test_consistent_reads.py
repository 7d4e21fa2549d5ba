"""Consistent reads and waits for an rv through the proxy, counted at the upstream (``watchcache sim``).

Whatever clients ask, what the proxy asks of the upstream to prove freshness stays bounded:
probe watches per resource are few and backed off when they fail, and the target LIST is
shared and backed off too (docs/consistency.md).
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Iterator

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.processes import Stack, start_stack
from tests.support.httpkube import request

FAR = 1_000_000_000_000_000


def counter(url: str, name: str, **labels: str) -> float:
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    value = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                value += s.value
    return value


def upstream_requests(stack: Stack) -> float:
    """Every request the sim has answered (its own /metrics scrapes included: one per call)."""
    return counter(stack.sim.url, "apiserver_request_total")


async def clients(url: str, path: str, n: int) -> list[int]:
    """``n`` clients at once, each one GET; their status codes."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one() -> int:
            async with session.get(url + path, timeout=aiohttp.ClientTimeout(total=60)) as resp:
                await resp.read()
                return resp.status

        return await asyncio.gather(*(one() for _ in range(n)))


@pytest.fixture
def stack() -> Iterator[Stack]:
    s = start_stack(
        "--resources",
        "pods,configmaps",
        "--fresh-wait",
        "2",
        # A thousand reads of one client all admitted, to wait: flow control would queue one flow's
        # flood and refuse its overflow with 429, as kube does (tests/e2e/test_flowcontrol.py).
        "--max-requests-inflight",
        "2000",
        "--no-enable-priority-and-fairness",
        # Pods churn, so the upstream's rv moves and a probe of quiet configmaps gets a bookmark above it.
        sim_args=("--objects", "30", "--namespaces", "2", "--churn", "20"),
    )
    yield s
    s.proxy.stop()
    s.sim.stop()


def test_a_thousand_clients_asking_for_far_future_rvs_while_probes_fail_fast(stack: Stack) -> None:
    before = upstream_requests(stack)
    # Every new request to the upstream fails at once (the proxy's open watches go on): probes too.
    res = request(stack.sim.url, "POST", "/sim/faults", {"kind": "error", "code": 503, "seconds": 30})
    assert res.status == 200, res
    try:
        statuses = asyncio.run(clients(stack.proxy.url, f"/api/v1/pods?resourceVersion={FAR}", 1000))
        assert set(statuses) == {504}, sorted(set(statuses))
        asked = upstream_requests(stack) - before - 1
    finally:
        request(stack.sim.url, "DELETE", "/sim/faults")
    # Probes of pods, backed off after each failure (0.5 s, doubling): about five in the 2 s wait and
    # the 2 s linger. Before the backoff, one probe after another as fast as the upstream answered
    # them: 26 to 47 in this test, 1,979 for one read against a fast fake upstream.
    assert asked <= 12, f"1,000 waiting reads made {asked:.0f} requests to the upstream"
    failed = counter(stack.proxy.url, "watchcache_consistency_probes_total", resource="pods", outcome="rejected")
    assert 1 <= failed <= asked


def test_a_thousand_clients_asking_for_far_future_rvs_of_a_healthy_upstream(stack: Stack) -> None:
    before = upstream_requests(stack)
    statuses = asyncio.run(clients(stack.proxy.url, f"/api/v1/configmaps?resourceVersion={FAR}", 1000))
    assert set(statuses) == {504}, sorted(set(statuses))
    asked = upstream_requests(stack) - before - 1
    # Probes succeed (each proves some rv, never the one asked for): a few per second, two at a time.
    assert asked <= 20, f"1,000 waiting reads made {asked:.0f} requests to the upstream"
    proved = counter(stack.proxy.url, "watchcache_consistency_probes_total", resource="configmaps", outcome="proved")
    assert proved >= 1


def test_a_consistent_list_never_answers_from_a_cache_whose_stream_lags_a_write(stack: Stack) -> None:
    """The reflector's stream is stalled (its bytes wait at the upstream) while a write is made directly:
    the scope's proof lists the new version, the cache does not have it, so the LIST passes through
    with the write in it, and no stale answer leaves; once the stream flows again, the cache serves."""
    path = "/api/v1/namespaces/ns-0/configmaps"
    assert request(stack.proxy.url, "GET", path).status == 200
    before = counter(stack.proxy.url, "watchcache_passthrough_requests_total", reason="consistent-read")
    res = request(stack.sim.url, "POST", "/sim/faults", {"kind": "stall", "seconds": 3})
    assert res.status == 200, res
    try:
        name = request(stack.sim.url, "GET", path).json()["items"][0]["metadata"]["name"]
        for i in range(5):
            written = request(stack.sim.url, "PATCH", f"{path}/{name}", {"data": {"stalled": str(i)}},
                              content_type="application/merge-patch+json")  # fmt: skip
            assert written.status == 200, written
            listed = request(stack.proxy.url, "GET", path)
            assert listed.status == 200
            mine = next(o for o in listed.json()["items"] if o["metadata"]["name"] == name)
            assert mine["data"].get("stalled") == str(i), "a consistent LIST answered from a cache behind a write"
    finally:
        request(stack.sim.url, "DELETE", "/sim/faults")
    assert counter(stack.proxy.url, "watchcache_passthrough_requests_total", reason="consistent-read") - before >= 5
