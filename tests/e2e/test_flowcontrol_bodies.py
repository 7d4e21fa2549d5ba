"""Queued requests and their bodies, through real processes: a flood of large writes waiting for a seat
holds their heads in the proxy, not their bodies.

kube-apiserver's flow control waits before any handler reads a request body; so does the proxy
(``ApiHandler.admit``, called by the HTTP layer at the end of a head whose body is to come):
a write waits in its priority level's queues with its head read and its body unread (HTTP/1.1
reads 4 KiB at a time until then), and its body is read once it has its seat. 500 writes of 1 MiB
at once, alice's and bob's (a flow each in global-default: hands of 6 queues of 50, disjoint),
against one seat per level, with the request buffer bound (--max-request-buffer-bytes) out of the
way at 1 GiB: the writes queue (a 429 only from flow control: queue-full beyond a flow's queues,
which 250 per flow do not reach, or time-out past the wait budget), and the bytes the proxy holds
stay at the queued heads and the one body being written, not 500 MiB.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.processes import Proc, start_stack
from watchcache.fairness.shuffle import deal, flow_hash

ROOT = Path(__file__).resolve().parents[2]
POLICY = str(ROOT / "watchcache/sim/policy-example.yaml")
WRITES = 500
BODY = 1 << 20
USERS = ("alice", "bob")
# kube's suggested global-default level: 128 queues, hands of 6, 50 waiting per queue.
QUEUES, HAND, QUEUE_LENGTH = 128, 6, 50


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    token_file = tmp_path_factory.mktemp("apf-bodies") / "token"
    token_file.write_text("watchcache-token")
    stack = start_stack(
        "--token-file", str(token_file), "--authentication", "delegated",
        "--workers", "1", "--max-requests-inflight", "1", "--max-requests-waiting", "0",
        "--max-request-buffer-bytes", str(1 << 30),
        sim_args=("--objects", "10", "--namespaces", "2", "--policy-file", POLICY),
    )  # fmt: skip
    yield stack.sim, stack.proxy
    stack.stop()


def _kib(pid: int, field: str) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(rf"^{field}:\s+(\d+) kB", status, re.M)
    assert match is not None
    return int(match.group(1))


async def _samples(session: aiohttp.ClientSession, url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with session.get(url + "/metrics", headers={"Authorization": "Bearer admin-token"}) as r:
        assert r.status == 200
        text = await r.text()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_queued_writes_hold_their_heads_not_their_bodies(stack: tuple[Proc, Proc]) -> None:
    _, proxy = stack
    hands = [set(deal(flow_hash("global-default", user), QUEUES, HAND)) for user in USERS]
    assert not hands[0] & hands[1]  # each flow has its own 300 places: 250 writes each all queue
    body = b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"generateName":"big-"},"data":{"x":"%s"}}' % (
        b"x" * (BODY - 100)
    )
    rss_before = _kib(proxy.pid, "VmRSS")
    held: list[float] = []
    inqueue: list[float] = []
    flow = (("flow_schema", "global-default"), ("priority_level", "global-default"))

    async def write(session: aiohttp.ClientSession, i: int) -> int:
        headers = {"Authorization": f"Bearer {USERS[i % 2]}-token", "Content-Type": "application/json"}
        async with session.post(proxy.url + "/api/v1/namespaces/ns-1/configmaps", data=body, headers=headers) as r:
            await r.read()
            return r.status

    async def watch_held(session: aiohttp.ClientSession, done: asyncio.Event) -> None:
        while not done.is_set():
            samples = await _samples(session, proxy.url)
            held.append(samples[("watchcache_http_request_buffer_bytes", ())])
            inqueue.append(samples.get(("apiserver_flowcontrol_current_inqueue_requests", flow), 0))
            await asyncio.sleep(0.05)

    async def run() -> tuple[list[int], dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=180)) as s:
            done = asyncio.Event()
            watcher = asyncio.ensure_future(watch_held(s, done))
            statuses = await asyncio.gather(*(write(s, i) for i in range(WRITES)))
            done.set()
            await watcher
            return statuses, await _samples(s, proxy.url)

    statuses, samples = asyncio.run(run())
    grown_mib = (_kib(proxy.pid, "VmHWM") - rss_before) / 1024
    counts = {s: statuses.count(s) for s in set(statuses)}
    rejected = {
        dict(labels)["reason"]: value
        for (name, labels), value in samples.items()
        if name == "apiserver_flowcontrol_rejected_requests_total" and value
    }
    peak_mib = max(held) / (1 << 20)
    print(
        f"statuses {counts}; flow control refused {rejected}; peak queued {max(inqueue):.0f}; request bytes held: "
        f"peak {peak_mib:.1f} MiB ({len(held)} scrapes); peak RSS grew {grown_mib:.0f} MiB for {WRITES} x "
        f"{BODY >> 20} MiB writes"
    )
    # Every write answered: by the upstream, or by flow control's 429; never by the request buffer.
    assert all(s < 500 for s in statuses), counts
    assert samples[("watchcache_rejected_requests_total", (("limit", "request_buffer"),))] == 0
    assert counts.get(429, 0) == sum(rejected.values()), (counts, rejected)
    assert rejected.get("queue-full", 0) == 0, rejected  # 250 per flow fit its 6 queues of 50
    assert set(rejected) <= {"time-out"}, rejected
    assert sum(s != 429 for s in statuses) >= 100, counts  # the upstream's answers: the seat went round
    assert max(inqueue) >= 100, inqueue  # they did queue (with one seat), holding what is below
    # Held: the queued heads (each with at most a 4 KiB read of its body) and the body being written,
    # not the queued bodies (500 MiB before admission happened before the body).
    assert peak_mib < WRITES * 8 / 1024 + 2 * BODY / (1 << 20), peak_mib
    assert grown_mib < 100, grown_mib
    assert proxy.running()
