"""API Priority and Fairness through real processes: the proxy in front of the simulated cluster,
delegated authentication, kube's suggested configuration (the simulator serves no flowcontrol API).

alice floods with 64 concurrent consistent LIST loops while bob makes one LIST at a time; both are
flows of their own in the global-default FlowSchema, whose priority level has 1 of the worker's 8
seats. With --max-requests-waiting 0 a consistent read keeps its seat while its freshness is
proved, so seats are really busy: with --no-enable-priority-and-fairness the same run refused bob
121 of 139 LISTs and alice 8,923 of 10,055 (429 at once); with flow control both wait their turn.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.processes import Proc, start_stack
from watchcache.fairness.defaults import flow_schemas, priority_levels

ROOT = Path(__file__).resolve().parents[2]
POLICY = str(ROOT / "watchcache/sim/policy-example.yaml")
UID = {
    o["metadata"]["name"]: o["metadata"]["uid"]
    for o in [*flow_schemas(), *priority_levels()]
    if o["kind"] == "FlowSchema"
}
PL_UID = {o["metadata"]["name"]: o["metadata"]["uid"] for o in priority_levels()}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    token_file = tmp_path_factory.mktemp("apf") / "token"
    token_file.write_text("watchcache-token")
    stack = start_stack(
        "--token-file", str(token_file), "--authentication", "delegated",
        "--workers", "1", "--max-requests-inflight", "8", "--max-requests-waiting", "0",
        sim_args=("--objects", "30", "--namespaces", "3", "--policy-file", POLICY),
    )  # fmt: skip
    yield stack.sim, stack.proxy
    stack.stop()


async def _get(session: aiohttp.ClientSession, url: str, token: str | None) -> tuple[int, dict[str, str], bytes]:
    headers = {"Accept": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    async with session.get(url, headers=headers) as resp:
        return resp.status, dict(resp.headers), await resp.read()


def test_pf_headers_name_the_flow_schema_and_priority_level(stack: tuple[Proc, Proc]) -> None:
    _, proxy = stack

    async def run() -> list[tuple[int, dict[str, str], bytes]]:
        async with aiohttp.ClientSession() as s:
            return [
                await _get(s, proxy.url + path, token)
                for token, path in (
                    ("alice-token", "/api/v1/pods"),  # cached read
                    ("dave-token", "/api/v1/pods"),  # 403 after classification
                    ("admin-token", "/api/v1/pods"),  # system:masters: exempt
                    ("alice-token", "/api/v1/namespaces/ns-1/secrets"),  # passed through
                    ("not-a-token", "/api/v1/pods"),  # 401: never classified (kube authenticates first)
                )
            ]

    alice, dave, admin, secrets, bad = asyncio.run(run())
    assert (alice[0], dave[0], admin[0], secrets[0], bad[0]) == (200, 403, 200, 403, 401)
    assert "X-Kubernetes-PF-FlowSchema-UID" not in bad[1]
    for res, schema in ((alice, "global-default"), (dave, "global-default"), (secrets, "global-default"),
                        (admin, "exempt")):  # fmt: skip
        assert res[1]["X-Kubernetes-PF-FlowSchema-UID"] == UID[schema], res
        assert res[1]["X-Kubernetes-PF-PriorityLevel-UID"] == PL_UID[schema], res


def test_a_quiet_flow_is_served_not_refused_while_a_noisy_one_floods(stack: tuple[Proc, Proc]) -> None:
    _, proxy = stack
    url = proxy.url + "/api/v1/pods"

    async def run() -> tuple[dict[int, int], dict[int, int], list[float]]:
        noisy: dict[int, int] = {}
        quiet: dict[int, int] = {}
        latencies: list[float] = []
        end = time.monotonic() + 4
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as s:

            async def flood() -> None:
                while time.monotonic() < end:
                    status, _, _ = await _get(s, url, "alice-token")
                    noisy[status] = noisy.get(status, 0) + 1

            async def one_at_a_time() -> None:
                await asyncio.sleep(0.5)  # the flood is on
                while time.monotonic() < end:
                    started = time.monotonic()
                    status, _, _ = await _get(s, proxy.url + "/api/v1/namespaces/ns-1/pods?limit=5", "bob-token")
                    latencies.append(time.monotonic() - started)
                    quiet[status] = quiet.get(status, 0) + 1

            await asyncio.gather(*(flood() for _ in range(64)), one_at_a_time())
        return noisy, quiet, latencies

    noisy, quiet, latencies = asyncio.run(run())
    print(f"noisy {noisy}, quiet {quiet}, quiet p50 {sorted(latencies)[len(latencies) // 2] * 1000:.1f} ms")
    assert set(quiet) == {200}, quiet
    assert set(noisy) == {200}, noisy  # 64 waiting fit alice's hand of 6 queues of 50
    assert quiet[200] >= 5, quiet
    assert noisy[200] > quiet[200]

    async def metrics() -> str:
        async with aiohttp.ClientSession() as s:
            status, _, body = await _get(s, proxy.url + "/metrics", "admin-token")
            assert status == 200
            return body.decode()

    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(asyncio.run(metrics()))
        for s in family.samples
    }
    labels = (("flow_schema", "global-default"), ("priority_level", "global-default"))
    dispatched = samples[("apiserver_flowcontrol_dispatched_requests_total", labels)]
    assert dispatched >= noisy[200] + quiet[200]
    assert samples[("apiserver_flowcontrol_nominal_limit_seats", (("priority_level", "global-default"),))] == 1
    waited = samples[("apiserver_flowcontrol_request_wait_duration_seconds_count", (("execute", "true"), *labels))]
    assert waited == dispatched
    refused = {k: v for k, v in samples.items() if k[0] == "apiserver_flowcontrol_rejected_requests_total" and v}
    assert not refused


def test_a_busy_level_borrows_idle_levels_seats_within_an_adjustment(stack: tuple[Proc, Proc]) -> None:
    """kube's borrowing, every 10 s: global-default (1 nominal seat of the worker's 8, guaranteed 1)
    flooded by 16 LIST loops while the other levels idle. Idle, the 12 nominal seats of the levels go
    12/7 of each one's guaranteed seat: 2 (rounded). Flooded, its demand (16 seats and more) is its
    target against the others' 1: they keep their guaranteed seat each and it gets the rest, 12 - 6."""
    _, proxy = stack

    def limits(text: str) -> dict[str, float]:
        return {
            s.name.removeprefix("apiserver_flowcontrol_"): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.labels.get("priority_level") == "global-default" and s.name.endswith("_limit_seats")
        }

    async def run() -> tuple[dict[str, float], float]:
        stop = asyncio.Event()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:

            async def flood() -> None:
                while not stop.is_set():
                    await _get(s, proxy.url + "/api/v1/pods", "alice-token")

            loops = [asyncio.create_task(flood()) for _ in range(16)]
            started = time.monotonic()
            seen: dict[str, float] = {}
            while time.monotonic() - started < 25:  # an adjustment comes within 10 s
                await asyncio.sleep(0.5)
                _, _, body = await _get(s, proxy.url + "/metrics", "admin-token")
                seen = limits(body.decode())
                if seen["current_limit_seats"] >= 6:
                    break
            stop.set()
            await asyncio.gather(*loops)
            return seen, time.monotonic() - started

    seen, waited = asyncio.run(run())
    print(f"global-default after {waited:.1f} s of flood: {seen}")
    assert seen["nominal_limit_seats"] == 1 and seen["lower_limit_seats"] == 1 and seen["upper_limit_seats"] == 9
    assert seen["current_limit_seats"] == 6, seen
