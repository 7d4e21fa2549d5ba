"""Consistent-read proofs against a counting upstream on a real socket: what the proxy asks of the
upstream stays bounded whatever the clients do."""

from __future__ import annotations

import asyncio

from tests.upstream.fakeapi import fake_api
from watchcache.dispatch.cacher import Cacher
from watchcache.dispatch.freshness import reach
from watchcache.resources import PODS
from watchcache.upstream.consistency import ConsistentReads

FAR = 1_000_000_000_000_000


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_a_probe_that_fails_fast_is_not_retried_in_a_loop() -> None:
    async def go() -> int:
        async with fake_api() as (api, client):
            api.watch_error = 410
            cacher = Cacher(PODS)
            cacher.replace([], 50)
            reads = ConsistentReads(client, fresh_wait=0.5)
            assert not (await reach(cacher, FAR, reads, 0.5)).reached
            return api.requests["watch"]

    watches = run(go())
    assert watches <= 3, f"one read waiting 0.5 s opened {watches} upstream watches"


def test_a_thousand_far_future_reads_open_a_bounded_number_of_probes() -> None:
    async def go() -> tuple[int, int]:
        async with fake_api() as (api, client):
            api.watch_error = 403
            cacher = Cacher(PODS)
            cacher.replace([], 50)
            reads = ConsistentReads(client, fresh_wait=1.0)
            results = await asyncio.gather(*(reach(cacher, FAR + i, reads, 1.0) for i in range(1000)))
            assert not any(r.reached for r in results)
            return api.requests["watch"], cacher.waiting

    watches, waiting = run(go())
    assert watches <= 4, f"1,000 reads waiting 1 s opened {watches} upstream watches"
    assert waiting == 0


def test_consistent_reads_with_a_failing_target_fetch_ask_the_upstream_a_bounded_number_of_times() -> None:
    async def go() -> int:
        async with fake_api() as (api, client):
            api.list_error = 500
            cacher = Cacher(PODS)
            cacher.replace([], 50)
            reads = ConsistentReads(client, fresh_wait=0.5)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 1.0

            async def client_loop() -> None:
                while loop.time() < deadline:  # a client that retries at once after each pass-through
                    assert not (await reach(cacher, None, reads, 0.5)).reached

            await asyncio.gather(*(client_loop() for _ in range(100)))
            return api.requests["list"]

    lists = run(go())
    assert lists <= 10, f"100 clients retrying for 1 s made {lists} target fetches"
