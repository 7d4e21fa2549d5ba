"""Backfills: requests at rvs older than the window share one fetch, bounded by their deadlines."""

from __future__ import annotations

import asyncio
import logging
import re
import time

import orjson
import pytest

from harness.doubles import RecordingSink
from harness.waiting import until
from tests.dispatch.readctx import ReadCtx
from tests.support.factories import pod
from watchcache.backoff import Backoff
from watchcache.cache.events import ADDED, MODIFIED
from watchcache.cache.predicate import SelectionPredicate
from watchcache.cache.semantics import Mode, WatchPlan
from watchcache.cache.store import CacheConfig, Span
from watchcache.dispatch import backfill as backfill_module
from watchcache.dispatch import reads
from watchcache.dispatch.backfill import BackfillFailed, Backfills, Fetched, reach_back
from watchcache.dispatch.cacher import Cacher, WatchRequest
from watchcache.dispatch.outcomes import Expired
from watchcache.resources import PODS
from watchcache.watchers.watcher import CloseReason, Watcher

HEAD = 100


def upstream_span(rv: int) -> Span:
    """The upstream: pod a written at every rv from 1 to HEAD."""
    listed = [pod("a", "ns", rv)] if rv >= 1 else []
    changes = [(ADDED if r == 1 else MODIFIED, pod("a", "ns", r)) for r in range(max(rv + 1, 1), HEAD + 1)]
    return Span.from_list(rv, listed, changes, HEAD)


class FakeUpstream:
    def __init__(
        self,
        *,
        delay: float = 0.0,
        gone_below: int = 0,
        fail: bool = False,
        failures: int = 0,
        unreachable: bool = False,
    ) -> None:
        self.delay = delay
        self.gone_below = gone_below
        self.fail = fail
        # How its failures fail: a connection refused (UNREACHABLE), else a malformed answer (FAILED).
        self.failure = (
            BackfillFailed(BackfillFailed.UNREACHABLE, "connection refused")
            if unreachable
            else BackfillFailed(BackfillFailed.FAILED, "a malformed answer")
        )
        # The first ``failures`` fetches fail (a passing fault that ends by itself, not when a test says).
        self.failures = failures
        self.fetched: list[int] = []

    async def __call__(self, cacher: Cacher, rv: int) -> Fetched:
        self.fetched.append(rv)
        await asyncio.sleep(self.delay)
        if self.fail or len(self.fetched) <= self.failures:
            raise BackfillFailed(self.failure.outcome, str(self.failure))
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


def test_a_passing_fault_costs_the_requests_a_delay_not_a_410() -> None:
    async def go() -> tuple[FakeUpstream, list[BackfillFailed | None]]:
        fetch = FakeUpstream(failures=1)  # the upstream is back before the next attempt
        cacher = cacher_with(fetch, backoff=Backoff(0.05, 0.05))
        results = await asyncio.gather(*(reach_back(cacher, rv, 5.0) for rv in (10, 60)))
        assert cacher.backfills is not None and cacher.backfills.fetches == {"failed": 1, "ok": 1}
        return fetch, results

    fetch, results = asyncio.run(go())
    assert results == [None, None]
    assert fetch.fetched == [10, 10]


def test_a_failing_upstream_is_asked_a_bounded_number_of_times_whatever_the_clients_do() -> None:
    async def go() -> tuple[FakeUpstream, list[BackfillFailed | None], BackfillFailed | None]:
        fetch = FakeUpstream(fail=True)
        cacher = cacher_with(fetch, backoff=Backoff(0.05, 0.05))
        results = await asyncio.gather(*(reach_back(cacher, rv, 5.0) for rv in (10, 60) for _ in range(50)))
        cacher.backfills.backoff = Backoff(30.0, 30.0)  # type: ignore[union-attr]
        cacher.backfills._retry_at = 1e18  # type: ignore[union-attr]  # the next attempt is far away
        later = await reach_back(cacher, 70, 0.2)
        return fetch, results, later

    fetch, results, later = asyncio.run(go())
    assert fetch.fetched == [10, 10, 10]  # --attempts, for 100 requests
    assert all(r is not None and r.outcome == BackfillFailed.FAILED for r in results)
    assert later is not None and later.outcome == BackfillFailed.DEADLINE  # waited for the next attempt


def test_an_unreachable_source_gets_its_requests_told_to_retry_for_a_bounded_time_then_410() -> None:
    """429 (retry from the same rv) while the upstream cannot be asked, for ``unreachable_for`` seconds of
    failures in a row; then FAILED (410, relist), so no client retries for ever; a quiet gap restarts it."""

    async def go() -> tuple[list[BackfillFailed | None], Backfills]:
        now = [0.0]
        fetch = FakeUpstream(fail=True, unreachable=True)
        cacher = cacher_with(fetch, attempts=1, backoff=Backoff(0.0, 0.0), unreachable_for=60.0, clock=lambda: now[0])
        assert cacher.backfills is not None
        got = [await reach_back(cacher, 10, 5.0)]
        now[0] = 30.0
        got.append(await reach_back(cacher, 10, 5.0))  # 30 s of failures in a row: still passing
        now[0] = 61.0
        got.append(await reach_back(cacher, 10, 5.0))  # 61 s: longer than unreachable_for
        now[0] = 200.0
        got.append(await reach_back(cacher, 10, 5.0))  # after a gap with no fetch (139 s): a new outage
        return got, cacher.backfills

    got, backfills = asyncio.run(go())
    assert [r.outcome if r else None for r in got] == ["unreachable", "unreachable", "failed", "unreachable"]
    assert all("connection refused" in str(r) for r in got)
    assert str(got[2]).endswith("(for 61s)")
    assert backfills.fetches == {"unreachable": 4}  # what the fetches met
    assert backfills.requests == {"unreachable": 3, "failed": 1}  # what the requests were told


def test_a_request_whose_wait_runs_out_while_the_source_is_unreachable_is_told_to_retry() -> None:
    """Waiting for a fetch that follows one that found the upstream down is not a slow fetch: 429, not 410."""

    async def go() -> tuple[BackfillFailed | None, list[int]]:
        fetched: list[int] = []

        async def down_then_slow(cacher: Cacher, rv: int) -> Fetched:
            fetched.append(rv)
            if len(fetched) == 1:
                raise BackfillFailed(BackfillFailed.UNREACHABLE, "connection refused")
            await asyncio.sleep(30)  # the second attempt hangs past the request's wait
            raise AssertionError("not reached")

        cacher = Cacher(PODS)
        cacher.replace([pod("a", "ns", HEAD)], HEAD)
        cacher.backfills = Backfills(cacher, down_then_slow, coalesce=0.0, backoff=Backoff(0.01, 0.01))
        failed = await reach_back(cacher, 10, 0.3)
        cacher.backfills.stop()
        return failed, fetched

    failed, fetched = asyncio.run(go())
    assert fetched == [10, 10]  # it waited through the second attempt
    assert failed is not None and failed.outcome == BackfillFailed.UNREACHABLE
    assert re.fullmatch(r"the history before \d+ was not fetched within 0.3s: connection refused", str(failed))


def test_while_the_source_is_down_a_request_that_would_wait_past_the_next_attempt_is_told_at_once() -> None:
    """When the backoff has grown past a request's wait, it cannot be served in time: the 429 comes now,
    for those waiting (when the fetch fails) and for those arriving (before the next attempt)."""

    async def go() -> tuple[list[BackfillFailed | None], FakeUpstream, float]:
        fetch = FakeUpstream(fail=True, unreachable=True)
        cacher = cacher_with(fetch, backoff=Backoff(30.0, 30.0))  # the next attempt 15-30 s away
        started = time.monotonic()
        waiting = await reach_back(cacher, 10, 10.0)  # fails with the first fetch, not at 10 s
        arriving = await reach_back(cacher, 10, 10.0)  # fails before any fetch
        return [waiting, arriving], fetch, time.monotonic() - started

    got, fetch, seconds = asyncio.run(go())
    assert fetch.fetched == [10]
    for failed in got:
        assert failed is not None and failed.outcome == BackfillFailed.UNREACHABLE
        assert re.fullmatch(
            r"the history before \d+ cannot be fetched before this request's wait ends"
            r" \(the next attempt is in \d+\.\ds\): connection refused",
            str(failed),
        ), failed
    assert seconds < 10.0  # neither waited for its wait to end


def test_a_request_gives_up_at_its_deadline_and_the_fetch_serves_the_next_ones() -> None:
    async def go() -> tuple[BackfillFailed | None, int, BackfillFailed | None, FakeUpstream]:
        fetch = FakeUpstream(delay=0.3)
        cacher = cacher_with(fetch)
        late = await reach_back(cacher, 90, 0.1)
        waiting = cacher.backfills.waiting if cacher.backfills else -1
        await until(lambda: cacher.cache.oldest_rv <= 90)  # the fetch went on without its request
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


def test_requests_waiting_when_the_cache_stops_are_told_to_retry_not_to_relist() -> None:
    """A shutdown (or a cache dropped) under a waiting request: the history is still upstream, 429 not 410."""

    async def go() -> BackfillFailed | None:
        cacher = cacher_with(FakeUpstream(delay=5.0))
        waiting = asyncio.ensure_future(reach_back(cacher, 90, 5.0))
        await until(lambda: cacher.backfills is not None and cacher.backfills.waiting == 1)
        cacher.stop()
        return await waiting

    failed = asyncio.run(go())
    assert failed is not None and failed.outcome == BackfillFailed.UNREACHABLE and "stopped" in str(failed)


@pytest.mark.parametrize("rv", [HEAD, HEAD + 5])
def test_no_fetch_for_an_rv_the_window_reaches(rv: int) -> None:
    async def go() -> tuple[BackfillFailed | None, FakeUpstream]:
        fetch = FakeUpstream()
        cacher = cacher_with(fetch)
        return await reach_back(cacher, rv, 1.0), fetch

    result, fetch = asyncio.run(go())
    assert result is None and fetch.fetched == []


# ---- the cacher's watch: its start and its lag cycle use the backfill (dispatch/cacher.py)

ALL = SelectionPredicate.parse(PODS, None, "", "")


def exact(rv: int) -> WatchPlan:
    return WatchPlan(Mode.EXACT, rv, initial_events=False, initial_events_end_bookmark=False)


def rvs(w: Watcher) -> list[int]:
    return [
        int(orjson.loads(line)["object"]["metadata"]["resourceVersion"]) for line in b"".join(w.take()[0]).splitlines()
    ]


def test_a_watch_from_before_the_window_starts_after_the_backfill_with_the_upstreams_events() -> None:
    async def go() -> tuple[list[int], FakeUpstream]:
        fetch = FakeUpstream(delay=0.02)
        cacher = cacher_with(fetch)
        w = await reads.start_watch(ReadCtx(), cacher, WatchRequest(ALL, exact(95)), RecordingSink())
        assert isinstance(w, Watcher)
        cacher.apply([(MODIFIED, pod("a", "ns", HEAD + 1))])
        return rvs(w), fetch

    got, fetch = asyncio.run(go())
    assert got == [96, 97, 98, 99, 100, 101]
    assert fetch.fetched == [95]


def test_a_watch_the_upstream_compacted_gets_kubes_own_410() -> None:
    """The upstream said 410 itself: the client gets kube-apiserver's words for that watch (the reference tier
    compares them), the upstream's go to the backfill's log line and metric."""

    async def go() -> Watcher | Expired:
        cacher = cacher_with(FakeUpstream(gone_below=1000))
        outcome = await reads.start_watch(ReadCtx(), cacher, WatchRequest(ALL, exact(95)), RecordingSink())
        assert len(cacher.dispatcher) == 0
        return outcome

    error = asyncio.run(go())
    assert error == Expired("too old resource version: 95 (100)")


def lagging_watcher_past_its_window(fetch: FakeUpstream, max_events: int = 50) -> tuple[Cacher, Watcher, RecordingSink]:
    """A watcher that lagged at 90 while its client read nothing; then its history aged out of the window."""

    now = [0.0]
    cacher = Cacher(PODS, CacheConfig(history_max_events=max_events, history_max_age=10.0), clock=lambda: now[0])
    cacher.replace([pod("a", "ns", 90)], 90)  # the upstream's state at 90 (see upstream_span)
    cacher.backfills = Backfills(cacher, fetch, coalesce=0.0)
    sink = RecordingSink()
    watcher = cacher.start_watch(WatchRequest(ALL, exact(90), max_pending_bytes=1500), sink)
    for rv in range(91, HEAD + 1):
        cacher.apply([(MODIFIED, pod("a", "ns", rv))])
    assert watcher.lagging and watcher.resume_rv == 90
    now[0] = 20.0
    cacher.tick()  # older than --history-max-age: evicted
    assert cacher.cache.oldest_rv == HEAD
    return cacher, watcher, sink


def test_a_lagging_watcher_whose_history_aged_out_is_backfilled_and_caught_up_not_ended() -> None:
    async def go() -> tuple[Watcher, list[int], Cacher, FakeUpstream]:
        fetch = FakeUpstream()
        cacher, w, sink = lagging_watcher_past_its_window(fetch)
        assert not cacher.catch_up(w)  # the backfill starts; the watcher stays LAGGING
        assert not w.closed and w.lagging
        await until(lambda: sink.lagged == 2)  # told once the history is there
        got: list[int] = []
        while cacher.catch_up(w) or w.pending:
            got += rvs(w)
        return w, got + rvs(w), cacher, fetch

    w, got, cacher, fetch = asyncio.run(go())
    assert got == list(range(91, HEAD + 1)) and not w.lagging and not w.closed
    assert fetch.fetched == [90]
    assert (cacher.watchers_expired, cacher.watchers_caught_up) == (0, 1)


@pytest.mark.parametrize(
    ("fetch", "max_events", "why"),
    [
        (FakeUpstream(gone_below=1000), 50, None),  # the upstream's own 410: kube's words, nothing added
        # more behind than the window may hold: the span does not fit (--history-max-events)
        (FakeUpstream(), 5, "do not fit in the window"),
    ],
)
def test_a_lagging_watcher_whose_backfill_fails_gets_410_saying_why(
    fetch: FakeUpstream, max_events: int, why: str | None
) -> None:
    async def go() -> tuple[Watcher, list[dict]]:
        cacher, w, _ = lagging_watcher_past_its_window(fetch, max_events)
        assert not cacher.catch_up(w) and not w.closed
        await until(lambda: w.closed)
        return w, [orjson.loads(line) for line in b"".join(w.take()[0]).splitlines()]

    w, got = asyncio.run(go())
    assert w.close_reason == CloseReason.EXPIRED
    [error] = got
    message = error["object"]["message"]
    assert error["object"]["code"] == 410, error
    if why is None:
        assert re.fullmatch(r"too old resource version: 90 \(\d+\)", message), message
    else:
        assert message.startswith("too old resource version: 90 (") and why in message, message


def test_a_lagging_watcher_whose_backfill_cannot_reach_the_upstream_is_told_to_retry_from_its_rv() -> None:
    """A 429 ERROR event: client-go's reflector backs off and watches again from its rv (it relists on 410)."""

    async def go() -> tuple[Watcher, list[dict], Cacher]:
        cacher, w, _ = lagging_watcher_past_its_window(FakeUpstream(fail=True, unreachable=True))
        assert cacher.backfills is not None
        cacher.backfills.backoff = Backoff(0.01, 0.01)
        assert not cacher.catch_up(w) and not w.closed
        await until(lambda: w.closed)
        return w, [orjson.loads(line) for line in b"".join(w.take()[0]).splitlines()], cacher

    w, got, cacher = asyncio.run(go())
    assert w.close_reason == CloseReason.RETRY_LATER
    [error] = got
    status = error["object"]
    assert error["type"] == "ERROR" and (status["code"], status["reason"]) == (429, "TooManyRequests"), status
    assert status["details"]["retryAfterSeconds"] == 1
    assert "too old" not in status["message"] and "connection refused" in status["message"], status
    assert (cacher.watchers_expired, cacher.watchers_retry_later, cacher.watchers_terminated) == (0, 1, 1)


@pytest.mark.parametrize(
    ("fetch", "outcome", "level"),
    [
        (FakeUpstream(gone_below=1000), BackfillFailed.GONE, logging.INFO),  # a client's ordinary path: 410, relist
        (FakeUpstream(fail=True), BackfillFailed.FAILED, logging.WARNING),  # a malformed answer
        (FakeUpstream(fail=True, unreachable=True), BackfillFailed.UNREACHABLE, logging.WARNING),  # down
    ],
    ids=["compacted-info", "upstream-failing-warning", "upstream-down-warning"],
)
def test_a_failed_fetch_is_logged_at_the_level_of_its_cause_once_a_minute(
    fetch: FakeUpstream, outcome: str, level: int, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def go() -> None:
        cacher = cacher_with(fetch, attempts=1)
        for rv in (10, 11, 12):  # three clients holding old rvs, one after the other
            if rv == 12:
                monkeypatch.setattr(backfill_module, "REPORT_EVERY", 0.0)  # a minute later
            failed = await reach_back(cacher, rv, 5.0)
            assert failed is not None and failed.outcome == outcome
            if cacher.backfills is not None:
                cacher.backfills._retry_at = 0.0  # the next client does not wait out the backoff

    with caplog.at_level(logging.DEBUG, logger="watchcache.dispatch.backfill"):
        asyncio.run(go())
    said = [(r.levelno, r.getMessage()) for r in caplog.records if "failed after" in r.getMessage()]
    assert [lvl for lvl, _ in said] == [level, logging.DEBUG, level]
    assert f"({outcome})" in said[0][1] and "more since" not in said[0][1]
    assert said[2][1].endswith("(1 more since the last report)")
