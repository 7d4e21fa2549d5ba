"""The owner's backfill against the simulated cluster on a real socket: what it asks, what it builds.

A "restarted proxy" is a Cacher whose reflector listed the sim after writes its clients saw
from an earlier process: their rvs are older than its window. The upstream requests are
counted by the sim itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator

import pytest

from harness.processes import free_port
from harness.waiting import until
from tests.support.simserver import SimServer, sim_server, upstream_client
from tests.upstream.fakeapi import fake_api
from watchcache.cache.predicate import SelectionPredicate
from watchcache.cache.store import CacheConfig
from watchcache.dispatch.backfill import BackfillFailed, BackfillLimits, reach_back
from watchcache.dispatch.cacher import Cacher
from watchcache.resources import CONFIGMAPS, PODS
from watchcache.upstream.backfill import UpstreamBackfill
from watchcache.upstream.client import UpstreamClient
from watchcache.upstream.reflector import Reflector


def relabel(sim: SimServer, name: str, value: str) -> int:
    """One write: a pod's label (so selector watches see pods enter and leave)."""
    obj = sim.cluster.patch(
        PODS, "ns-0", name, "application/merge-patch+json", b'{"metadata":{"labels":{"x":"%s"}}}' % value.encode()
    )
    return obj.rv


def pod_names(sim: SimServer) -> list[str]:
    return [o.name for o in sim.cluster.cachers[PODS].cache.snapshot().iter_range("ns-0/", "ns-00")]


@contextlib.asynccontextmanager
async def restarted_proxy(
    client: UpstreamClient, limits: BackfillLimits | None = None, cache: CacheConfig | None = None
) -> AsyncIterator[tuple[Cacher, UpstreamBackfill]]:
    cacher = Cacher(PODS, cache)
    fetch = UpstreamBackfill(client, limits or BackfillLimits(coalesce=0.05))
    cacher.backfills = fetch.backfills(cacher)
    task = asyncio.ensure_future(Reflector(client, cacher).run())
    try:
        assert await cacher.wait_ready(10)
        yield cacher, fetch
    finally:
        task.cancel()
        cacher.stop()
        await asyncio.gather(task, return_exceptions=True)


def view(events: list, predicate: SelectionPredicate | None = None) -> list[tuple[int, str, str, int | None]]:
    return [
        (e.rv, e.type, e.object.key, None if e.prev is None else e.prev.rv)
        for e in events
        if predicate is None or predicate.concerns(e)
    ]


def exact_lists(sim: SimServer) -> int:
    return sum(1 for verb, q in sim.queries if verb == "LIST" and q.get("resourceVersionMatch") == "Exact")


def test_a_restart_storm_of_200_clients_at_different_old_rvs_costs_one_exact_list_and_the_history_is_exact() -> None:
    async def go() -> None:
        async with sim_server(objects=40) as sim, upstream_client(sim.url) as client:
            names = pod_names(sim)
            held = [relabel(sim, names[i % len(names)], str(i % 3)) for i in range(30)]  # seen by the old process
            async with restarted_proxy(client) as (cacher, _):
                assert cacher.cache.oldest_rv == sim.cluster.rv == held[-1]
                for i in range(5):  # the resource stays busy after the restart
                    relabel(sim, names[i], "after")
                await until(lambda: cacher.rv == sim.cluster.rv)
                lists_before = exact_lists(sim)
                rng = random.Random(1)
                asked = [rng.choice(held[:-1]) for _ in range(200)]
                started = time.monotonic()
                results = await asyncio.gather(*(reach_back(cacher, rv, 10.0) for rv in asked))
                took = time.monotonic() - started
                assert results == [None] * 200
                assert exact_lists(sim) - lists_before == 1
                assert cacher.backfills is not None and cacher.backfills.fetches == {"ok": 1}
                assert cacher.cache.oldest_rv == min(asked)
                assert took < 5.0
                # Every resume point now serves exactly the upstream's own history, prev states included.
                upstream = sim.cluster.cachers[PODS].cache
                selector = SelectionPredicate.parse(PODS, "ns-0", "x=1", "")
                for rv in sorted(set(asked)):
                    assert view(cacher.cache.events_since(rv)) == view(upstream.events_since(rv))
                    mine = view(cacher.cache.events_since(rv, selector), selector)
                    assert mine == view(upstream.events_since(rv, selector), selector)
                    snap, theirs = cacher.cache.snapshot(rv), upstream.snapshot(rv)
                    assert [(o.key, o.rv) for o in snap.iter_range("", None)] == [
                        (o.key, o.rv) for o in theirs.iter_range("", None)
                    ]

    asyncio.run(go())


def test_the_event_at_the_windows_start_proves_the_span_at_once() -> None:
    """The window starts at the resource's last event (the restarted proxy listed right after it):
    kube sends no bookmark then (nothing moved past the watch), and the event itself is the proof."""

    async def go() -> float:
        async with sim_server(objects=20) as sim, upstream_client(sim.url) as client:
            names = pod_names(sim)
            held = relabel(sim, names[0], "a")
            last = relabel(sim, names[1], "b")
            async with restarted_proxy(client) as (cacher, _):
                assert cacher.cache.oldest_rv == last
                started = time.monotonic()
                assert await reach_back(cacher, held, 10.0) is None
                assert [e.rv for e in cacher.cache.events_since(held)] == [last]
                return time.monotonic() - started

    took = asyncio.run(go())
    assert took < 0.5, f"the proof took {took:.2f}s"


def test_a_quiet_resource_is_proven_by_the_upstreams_bookmark() -> None:
    """The window starts past the resource's last event (another resource was written since)."""

    async def go() -> float:
        async with sim_server(objects=20) as sim, upstream_client(sim.url) as client:
            names = pod_names(sim)
            held = relabel(sim, names[0], "a")
            relabel(sim, names[1], "b")
            sim.cluster.create(CONFIGMAPS, "ns-0", {"metadata": {"name": "elsewhere"}})
            async with restarted_proxy(client) as (cacher, _):
                assert cacher.cache.oldest_rv == held + 2
                started = time.monotonic()
                assert await reach_back(cacher, held, 10.0) is None
                assert [e.rv for e in cacher.cache.events_since(held)] == [held + 1]
                watches = [q for verb, q in sim.queries if verb == "WATCH" and q.get("timeoutSeconds") == "3"]
                assert len(watches) == 1
                return time.monotonic() - started

    took = asyncio.run(go())
    assert took < 4.0, f"the bookmark proof took {took:.2f}s"


def test_an_rv_the_upstream_compacted_gets_the_upstreams_410_and_the_cache_is_unchanged() -> None:
    async def go() -> None:
        async with sim_server(objects=20) as sim, upstream_client(sim.url) as client:
            names = pod_names(sim)
            held = relabel(sim, names[0], "a")
            relabel(sim, names[1], "b")
            async with restarted_proxy(client) as (cacher, _):
                oldest = cacher.cache.oldest_rv
                sim.cluster.compact()
                failed = await reach_back(cacher, held, 10.0)
                assert failed is not None and failed.outcome == BackfillFailed.GONE
                assert "410" in str(failed) and "too old" in str(failed)
                assert cacher.cache.oldest_rv == oldest
                assert cacher.backfills is not None and cacher.backfills.fetches == {"gone": 1}

    asyncio.run(go())


def test_a_span_longer_than_the_bound_is_not_fetched_whole() -> None:
    async def go() -> None:
        async with sim_server(objects=20) as sim, upstream_client(sim.url) as client:
            names = pod_names(sim)
            held = relabel(sim, names[0], "a")
            for i in range(10):
                relabel(sim, names[i % len(names)], f"v{i}")
            async with restarted_proxy(client, BackfillLimits(max_events=5, coalesce=0.0)) as (cacher, _):
                failed = await reach_back(cacher, held, 10.0)
                assert failed is not None and failed.outcome == BackfillFailed.BOUND
                assert "--backfill-max-events=5" in str(failed)
                assert await reach_back(cacher, cacher.cache.oldest_rv - 3, 10.0) is None  # a shorter one fits

    asyncio.run(go())


def test_the_memory_budget_bounds_what_fetches_hold_and_is_given_back() -> None:
    async def go() -> None:
        async with sim_server(objects=30) as sim, upstream_client(sim.url) as client:
            names = pod_names(sim)
            held = relabel(sim, names[0], "a")
            relabel(sim, names[1], "b")
            async with restarted_proxy(client, BackfillLimits(memory_bytes=10_000, coalesce=0.0)) as (cacher, fetch):
                failed = await reach_back(cacher, held, 10.0)
                assert failed is not None and failed.outcome == BackfillFailed.BOUND
                assert "--backfill-memory-bytes" in str(failed)
                assert fetch.held == 0

    asyncio.run(go())


def test_a_window_that_would_overflow_refuses_the_span() -> None:
    async def go() -> None:
        async with sim_server(objects=20) as sim, upstream_client(sim.url) as client:
            names = pod_names(sim)
            held = relabel(sim, names[0], "a")
            for i in range(4):
                relabel(sim, names[1], f"v{i}")
            small = CacheConfig(history_max_events=3)
            async with restarted_proxy(client, BackfillLimits(coalesce=0.0), small) as (cacher, _):
                failed = await reach_back(cacher, held, 10.0)
                assert failed is not None and failed.outcome == BackfillFailed.BOUND
                assert "do not fit" in str(failed)

    asyncio.run(go())


@pytest.mark.parametrize(
    ("list_error", "outcome"),
    [
        (503, BackfillFailed.UNREACHABLE),  # "not now": its requests are told to retry (429)
        (500, BackfillFailed.UNREACHABLE),
        (429, BackfillFailed.UNREACHABLE),
        (403, BackfillFailed.FAILED),  # the proxy's own credentials: asking again will not help
        (0, BackfillFailed.FAILED),  # an exact LIST answered at another rv: a wrong answer
    ],
)
def test_an_upstream_that_says_not_now_is_unreachable_and_a_wrong_answer_failed(list_error: int, outcome: str) -> None:
    async def go() -> BackfillFailed:
        async with fake_api() as (api, client):
            api.list_error = list_error
            cacher = Cacher(PODS)
            cacher.replace([], 100)
            with pytest.raises(BackfillFailed) as failed:
                await UpstreamBackfill(client, BackfillLimits())(cacher, 10)
            assert api.requests["list"] == 1
            return failed.value

    failed = asyncio.run(go())
    assert failed.outcome == outcome, failed
    assert (f"the upstream answered {list_error}" if list_error else "an exact list at 10 answered 100") in str(failed)


def test_an_upstream_that_refuses_the_connection_is_unreachable() -> None:
    async def go() -> BackfillFailed:
        async with upstream_client(f"http://127.0.0.1:{free_port()}") as client:  # nothing listens there
            cacher = Cacher(PODS)
            cacher.replace([], 100)
            with pytest.raises(BackfillFailed) as failed:
                await UpstreamBackfill(client, BackfillLimits())(cacher, 10)
            return failed.value

    failed = asyncio.run(go())
    assert failed.outcome == BackfillFailed.UNREACHABLE, failed
