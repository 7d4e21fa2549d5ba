"""Queued requests and their bodies, through real processes: what a flood of large writes waiting for
a seat holds in the proxy stays bounded.

The HTTP layer reads a request's body before its handler runs, and flow control waits in the
handler: a queued write holds its body. What bounds that is --max-request-buffer-bytes (heads and
bodies received or announced and not answered, per worker): a write past it is refused with 429
before its body is read. 500 writes of 1 MiB at once against one seat per level and a 16 MiB
buffer: the proxy's peak RSS grows by tens of MiB, not 500.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import aiohttp
import pytest

from harness.processes import Proc, start_stack

ROOT = Path(__file__).resolve().parents[2]
POLICY = str(ROOT / "watchcache/sim/policy-example.yaml")
BUFFER = 16 << 20
WRITES = 500
BODY = 1 << 20


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    token_file = tmp_path_factory.mktemp("apf-bodies") / "token"
    token_file.write_text("watchcache-token")
    stack = start_stack(
        "--token-file", str(token_file), "--authentication", "delegated",
        "--workers", "1", "--max-requests-inflight", "1", "--max-requests-waiting", "0",
        "--max-request-buffer-bytes", str(BUFFER),
        sim_args=("--objects", "10", "--namespaces", "2", "--policy-file", POLICY),
    )  # fmt: skip
    yield stack.sim, stack.proxy
    stack.stop()


def _kib(pid: int, field: str) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(rf"^{field}:\s+(\d+) kB", status, re.M)
    assert match is not None
    return int(match.group(1))


def test_queued_writes_hold_bounded_bytes(stack: tuple[Proc, Proc]) -> None:
    _, proxy = stack
    body = b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"generateName":"big-"},"data":{"x":"%s"}}' % (
        b"x" * (BODY - 100)
    )
    rss_before = _kib(proxy.pid, "VmRSS")

    async def write(session: aiohttp.ClientSession, i: int) -> int:
        headers = {"Authorization": f"Bearer {('alice', 'bob')[i % 2]}-token", "Content-Type": "application/json"}
        async with session.post(proxy.url + "/api/v1/namespaces/ns-1/configmaps", data=body, headers=headers) as r:
            await r.read()
            return r.status

    async def run() -> list[int]:
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=120)) as s:
            return await asyncio.gather(*(write(s, i) for i in range(WRITES)))

    statuses = asyncio.run(run())
    grown_mib = (_kib(proxy.pid, "VmHWM") - rss_before) / 1024
    counts = {s: statuses.count(s) for s in set(statuses)}
    print(f"statuses {counts}; peak RSS grew {grown_mib:.0f} MiB for {WRITES} x {BODY >> 20} MiB writes")
    # Every write answered: by the upstream (its own answer), or refused by the buffer bound.
    assert all(s < 500 for s in statuses), counts
    assert counts.get(429, 0) > 0  # the bound was reached: without it all 500 MiB would be held
    # Bounded: the buffer, and its copies on the way to the upstream, not 500 MiB.
    assert grown_mib < 4 * (BUFFER >> 20) + 64, counts
    assert proxy.running()
