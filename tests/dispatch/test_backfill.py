"""Backfills: requests at rvs older than the window share one fetch, bounded by their deadlines."""

from __future__ import annotations

import asyncio

import pytest

from tests.factories import pod
from watchcache.backoff import Backoff
from watchcache.cache.events import ADDED, MODIFIED
from watchcache.cache.store import Span
from watchcache.dispatch.backfill import BackfillFailed, Backfills, Fetched, reach_back
from watchcache.dispatch.cacher import Cacher
from watchcache.resources import PODS

HEAD = 100


def upstream_span(rv: int) -> Span:
    """The upstream: pod a written at every rv from 1 to HEAD."""
    listed = [pod("a", "ns", rv)] if rv >= 1 else []
    changes = [(ADDED if r == 1 else MODIFIED, pod("a", "ns", r)) for r in range(max(rv + 1, 1), HEAD + 1)]
    return Span.from_list(rv, listed, changes, HEAD)


class FakeUpstream:
    def __init__(self, *, delay: float = 0.0, gone_below: int = 0, fail: bool = False) -> None:
        self.delay = delay
        self.gone_below = gone_below
        self.fail = fail
        self.fetched: list[int] = []

    async def __call__(self, cacher: Cacher, rv: int) -> Fetched:
        self.fetched.append(rv)
        await asyncio.sleep(self.delay)
        if self.fail:
            raise BackfillFailed(BackfillFailed.FAILED, "connection refused")
        if rv < self.gone_below:
            raise BackfillFailed(BackfillFailed.GONE, f"the upstream compacted {rv}")
        return Fetched(len(cacher.backfill(upstream_span(rv))), 0)


def cacher_with(fetch: FakeUpstream, **kw: object) -> Cacher:
    cacher = Cacher(PODS)
    cacher.replace([pod("a", "ns", HEAD)], HEAD)
    cacher.backfills = Backfills(cacher, fetch, coalesce=0.02, **kw)  # type: ignore[arg-type]
    return cacher


def test_a_storm_of_requests_at_different_old_rvs_costs_one_fetch_from_the_oldest() -> None:
    async def go() -> tuple[list[BackfillFailed | None], FakeUpstream, Cacher]:
        fetch = FakeUpstream(delay=0.05)
        cacher = cacher_with(fetch)
        results = await asyncio.gather(*(reach_back(cacher, 90 + i % 7, 5.0) for i in range(500)))
        return results, fetch, cacher

    results, fetch, cacher = asyncio.run(go())
    assert results == [None] * 500
    assert fetch.fetched == [90]
    assert cacher.cache.oldest_rv == 90
    assert [e.rv for e in cacher.cache.events_since(90)] == list(range(91, HEAD + 1))
    assert cacher.backfills is not None and cacher.backfills.requests["served"] == 500
    assert cacher.backfills.waiting == 0


def test_requests_older_than_the_running_fetch_get_the_next_one() -> None:
    async def go() -> tuple[FakeUpstream, list[BackfillFailed | None]]:
        fetch = FakeUpstream(delay=0.1)
        cacher = cacher_with(fetch)
        first = asyncio.ensure_future(reach_back(cacher, 95, 5.0))
        await asyncio.sleep(0.05)  # the fetch from 95 is under way
        later = [asyncio.ensure_future(reach_back(cacher, rv, 5.0)) for rv in (80, 97, 85)]
        return fetch, await asyncio.gather(first, *later)

    fetch, results = asyncio.run(go())
    assert results == [None] * 4
    assert fetch.fetched == [95, 80]


def test_an_rv_the_upstream_compacted_fails_alone_and_the_others_are_fetched() -> None:
    async def go() -> tuple[FakeUpstream, list[BackfillFailed | None]]:
        fetch = FakeUpstream(gone_below=50)
        cacher = cacher_with(fetch)
        return fetch, await asyncio.gather(*(reach_back(cacher, rv, 5.0) for rv in (10, 60, 70)))

    fetch, results = asyncio.run(go())
    assert fetch.fetched == [10, 60]
    assert results[0] is not None and results[0].outcome == BackfillFailed.GONE
    assert "compacted 10" in str(results[0])
    assert results[1:] == [None, None]


def test_a_failing_upstream_fails_every_waiter_and_is_not_asked_again_during_the_backoff() -> None:
    async def go() -> tuple[FakeUpstream, list[BackfillFailed | None], BackfillFailed | None]:
        fetch = FakeUpstream(fail=True)
        cacher = cacher_with(fetch, backoff=Backoff(30.0, 30.0))
        results = await asyncio.gather(*(reach_back(cacher, rv, 5.0) for rv in (10, 60)))
        again = await reach_back(cacher, 70, 5.0)
        return fetch, results, again

    fetch, results, again = asyncio.run(go())
    assert fetch.fetched == [10]
    assert all(r is not None and r.outcome == BackfillFailed.FAILED for r in results)
    assert again is not None and again.outcome == BackfillFailed.FAILED and "backing off" in str(again)


def test_a_request_gives_up_at_its_deadline_and_the_fetch_serves_the_next_ones() -> None:
    async def go() -> tuple[BackfillFailed | None, int, BackfillFailed | None, FakeUpstream]:
        fetch = FakeUpstream(delay=0.3)
        cacher = cacher_with(fetch)
        late = await reach_back(cacher, 90, 0.1)
        waiting = cacher.backfills.waiting if cacher.backfills else -1
        await asyncio.sleep(0.4)
        return late, waiting, await reach_back(cacher, 90, 0.1), fetch

    late, waiting, next_one, fetch = asyncio.run(go())
    assert late is not None and late.outcome == BackfillFailed.DEADLINE
    assert waiting == 0
    assert next_one is None
    assert fetch.fetched == [90]


def test_no_backfill_across_a_relist_and_none_without_a_source() -> None:
    async def go() -> tuple[BackfillFailed | None, BackfillFailed | None, FakeUpstream]:
        fetch = FakeUpstream()
        cacher = cacher_with(fetch)
        cacher.relist([pod("a", "ns", HEAD + 5)], HEAD + 5)
        across = await reach_back(cacher, 90, 1.0)
        bare = Cacher(PODS)
        bare.replace([], 10)
        return across, await reach_back(bare, 5, 1.0), fetch

    across, off, fetch = asyncio.run(go())
    assert across is not None and across.outcome == BackfillFailed.RELIST
    assert off is not None and off.outcome == BackfillFailed.OFF
    assert fetch.fetched == []


def test_a_fetch_that_returns_without_reaching_the_rv_fails_its_requests() -> None:
    async def nothing(cacher: Cacher, rv: int) -> Fetched:
        return Fetched(0, 0)

    async def go() -> BackfillFailed | None:
        cacher = Cacher(PODS)
        cacher.replace([], HEAD)
        cacher.backfills = Backfills(cacher, nothing, coalesce=0.0)
        return await reach_back(cacher, 50, 1.0)

    result = asyncio.run(go())
    assert result is not None and result.outcome == BackfillFailed.FAILED


@pytest.mark.parametrize("rv", [HEAD, HEAD + 5])
def test_no_fetch_for_an_rv_the_window_reaches(rv: int) -> None:
    async def go() -> tuple[BackfillFailed | None, FakeUpstream]:
        fetch = FakeUpstream()
        cacher = cacher_with(fetch)
        return await reach_back(cacher, rv, 1.0), fetch

    result, fetch = asyncio.run(go())
    assert result is None and fetch.fetched == []
