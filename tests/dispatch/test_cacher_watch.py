"""A watch's life on the cacher, without sockets: ``start_watch`` starts it, ``catch_up`` runs the lag cycle.

The HTTP handler (server/watch.py) only writes what the watcher has pending; everything a
client can observe about where a watch starts, what it replays and when it gets 410 is decided
here (docs/architecture.md, invariants 2, 3 and 6).
"""

from __future__ import annotations

import orjson
import pytest

from harness.doubles import RecordingSink
from tests.support.factories import pod
from tests.support.handlers import arun
from watchcache.cache.encoding import FULL_JSON
from watchcache.cache.events import MODIFIED
from watchcache.cache.predicate import SelectionPredicate
from watchcache.cache.semantics import Mode, WatchPlan
from watchcache.cache.store import CacheConfig, ResourceVersionTooOld
from watchcache.dispatch.cacher import Cacher, WatchRequest
from watchcache.resources import PODS
from watchcache.watchers.budget import WatchBudget
from watchcache.watchers.watcher import CloseReason, Watcher

ALL = SelectionPredicate.parse(PODS, None, "", "")


def cacher(max_events: int = 50_000) -> Cacher:
    c = Cacher(PODS, CacheConfig(history_max_events=max_events), clock=lambda: 0.0)
    c.replace([pod("a", "ns1", 1), pod("b", "ns2", 2)], 10)
    return c


def exact(rv: int) -> WatchPlan:
    return WatchPlan(Mode.EXACT, rv, initial_events=False, initial_events_end_bookmark=False)


def frames(w: Watcher) -> list[dict]:
    return [orjson.loads(line) for line in b"".join(w.take()[0]).splitlines()]


def rvs(w: Watcher) -> list[int]:
    return [int(f["object"]["metadata"]["resourceVersion"]) for f in frames(w)]


@arun
async def test_a_watch_from_an_exact_rv_gets_the_backlog_then_live_events_each_once() -> None:
    c = cacher()
    c.apply([(MODIFIED, pod("a", "ns1", 11))])
    c.apply([(MODIFIED, pod("b", "ns2", 12))])
    w = c.start_watch(WatchRequest(ALL, exact(10)), RecordingSink())
    c.apply([(MODIFIED, pod("a", "ns1", 13))])
    assert rvs(w) == [11, 12, 13]
    assert list(c.dispatcher.watchers()) == [w]


@arun
async def test_a_watch_from_before_the_window_gets_410_and_leaves_nothing_registered() -> None:
    c = cacher(max_events=2)
    for rv in range(11, 15):
        c.apply([(MODIFIED, pod("a", "ns1", rv))])
    budget = WatchBudget(1 << 20)
    # The read's owner answers it with 410 (tests/dispatch/test_reads.py).
    with pytest.raises(ResourceVersionTooOld) as e:
        c.start_watch(WatchRequest(ALL, exact(10), budget=budget), RecordingSink())
    assert str(e.value) == "too old resource version: 10 (12)"
    assert len(c.dispatcher) == 0 and not budget.watchers


@arun
async def test_initial_events_come_first_then_the_end_bookmark_then_live_events() -> None:
    c = cacher()
    plan = WatchPlan(Mode.ANY, 0, initial_events=True, initial_events_end_bookmark=True)
    ns1 = SelectionPredicate.parse(PODS, "ns1", "", "")
    w = c.start_watch(WatchRequest(ns1, plan, allow_bookmarks=True), RecordingSink())
    c.apply([(MODIFIED, pod("a", "ns1", 11)), (MODIFIED, pod("b", "ns2", 12))])
    got = frames(w)
    assert [(f["type"], f["object"]["metadata"].get("name")) for f in got] == [
        ("ADDED", "a"),
        ("BOOKMARK", None),
        ("MODIFIED", "a"),
    ]
    assert got[1]["object"]["metadata"] == {
        "resourceVersion": "10",
        "annotations": {"k8s.io/initial-events-end": "true"},
    }


@arun
async def test_a_start_that_raises_leaves_no_watcher_registered_or_budgeted(monkeypatch: pytest.MonkeyPatch) -> None:
    c = cacher()
    budget = WatchBudget(1 << 20)

    def broken(*args: object) -> tuple[list[bytes], int]:
        raise RuntimeError("a bug in the initial events")

    monkeypatch.setattr(FULL_JSON, "initial_events", broken)
    sink = RecordingSink()
    plan = WatchPlan(Mode.ANY, 0, initial_events=True, initial_events_end_bookmark=False)
    with pytest.raises(RuntimeError):
        c.start_watch(WatchRequest(ALL, plan, budget=budget), sink)
    assert len(c.dispatcher) == 0 and not budget.watchers and budget.pending == 0
    assert sink.closed_reasons == [CloseReason.INTERNAL_ERROR]


@arun
async def test_a_lagging_watcher_whose_history_moved_on_gets_410_when_its_client_drains() -> None:
    c = cacher(max_events=3)
    sink = RecordingSink()
    w = c.start_watch(WatchRequest(ALL, exact(10), max_pending_bytes=1500), sink)
    for rv in range(11, 20):  # the client reads nothing: over its cap, it lags at 10
        c.apply([(MODIFIED, pod("a", "ns1", rv))])
    assert w.lagging and w.resume_rv == 10 and sink.lagged == 1 and c.watchers_lagged == 1
    assert not c.catch_up(w)  # the window starts after 16 now: nothing to replay from 10
    assert w.closed and w.close_reason == CloseReason.EXPIRED
    [error] = frames(w)
    assert error["type"] == "ERROR" and error["object"]["code"] == 410
    assert error["object"]["message"].startswith("too old resource version: 10 (")
    assert (c.watchers_expired, c.watchers_terminated, c.watchers_caught_up) == (1, 1, 0)
    assert len(c.dispatcher) == 0


@arun
async def test_a_closed_watcher_leaves_the_dispatcher_and_the_budget() -> None:
    c = cacher()
    budget = WatchBudget(1 << 20)
    w = c.start_watch(WatchRequest(ALL, exact(10), budget=budget), RecordingSink())
    assert budget.watchers == {w} and len(c.dispatcher) == 1
    w.close(CloseReason.TIMEOUT)
    assert not budget.watchers and len(c.dispatcher) == 0
    assert c.watchers_terminated == 0  # a timeout is no termination


@arun
async def test_a_watcher_that_overflows_inside_a_fan_out_leaves_when_the_fan_out_ends() -> None:
    c = cacher()
    small = c.start_watch(WatchRequest(ALL, exact(10), max_pending_bytes=1000), RecordingSink())
    small.can_lag = False  # over its cap it closes (BUFFER_OVERFLOW) instead of lagging
    others = [c.start_watch(WatchRequest(ALL, exact(10)), RecordingSink()) for _ in range(3)]
    c.apply([(MODIFIED, pod(f"p{i}", "ns1", 11)) for i in range(5)])  # one batch, ~2.5 KB
    assert small.closed and small.close_reason == CloseReason.BUFFER_OVERFLOW
    assert list(c.dispatcher.watchers()) == others  # removed once the fan-out ended, not during it
    assert all(rvs(w) == [11] * 5 for w in others)
    assert c.watchers_terminated == 1 and c.failures == {}
