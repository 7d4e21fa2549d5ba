"""The read's owner (dispatch/reads.py) without HTTP: readiness, the wait per read mode, reaching back, the state read.

Each refusal is a value; the texts of a 410 are one builder's (``outcomes.expired``), so a LIST and
a watch at the same old resourceVersion say the same about why the proxy could not reach back.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from harness.doubles import NullSink
from harness.waiting import until
from tests.dispatch.readctx import Config, ReadCtx
from tests.support.factories import pod
from tests.support.handlers import arun
from watchcache.cache.continuetoken import ContinueCodec
from watchcache.cache.encoding import FULL_JSON
from watchcache.cache.events import MODIFIED
from watchcache.cache.predicate import SelectionPredicate
from watchcache.cache.semantics import ListOptions, Mode, ReadPlan, WatchPlan, plan_list
from watchcache.cache.store import CacheConfig, Snapshot
from watchcache.dispatch import reads
from watchcache.dispatch.backfill import Backfills, Fetched
from watchcache.dispatch.cacher import Cacher, WatchRequest
from watchcache.dispatch.lists import list_parts
from watchcache.dispatch.outcomes import (
    CONTINUE_TOO_OLD,
    LIST_TOO_OLD,
    WATCH_TOO_OLD,
    BackfillFailed,
    Delegated,
    Delegation,
    Expired,
    NotReady,
    Refusal,
    RetryLater,
    TooLarge,
)
from watchcache.resources import PODS, ResourceType
from watchcache.watchers.watcher import Watcher

ALL = SelectionPredicate.parse(PODS, None, "", "")


def cacher(max_events: int = 100) -> Cacher:
    """pods ns1/a (rv 1) and ns2/b (rv 2), synced at 10."""
    c = Cacher(PODS, CacheConfig(history_max_events=max_events))
    c.replace([pod("a", "ns1", 1), pod("b", "ns2", 2)], 10)
    return c


def ctx_at(c: Cacher, **config: float) -> ReadCtx:
    """A read's context whose upstream is where the cache is."""
    ctx = ReadCtx(config=Config(**config))
    ctx.upstream.rv = c.rv
    return ctx


def plan(mode: Mode, rv: int = 0) -> ReadPlan:
    return ReadPlan(mode, rv)


def watch_from(rv: int) -> WatchPlan:
    return WatchPlan(Mode.EXACT, rv, initial_events=False, initial_events_end_bookmark=False)


def write(c: Cacher, ctx: ReadCtx, rv: int, name: str = "a") -> None:
    """Commit a change upstream at ``rv`` and feed it to the cache."""
    ctx.upstream.rv = rv
    c.apply([(MODIFIED, pod(name, "ns1", rv))])


# ---------------------------------------------------------------------------------------------- readiness


@arun
async def test_a_cache_not_synced_is_refused_with_429_and_read_once_it_syncs_within_the_wait() -> None:
    c = Cacher(PODS)
    ctx = ReadCtx()
    refused = await reads.list_snapshot(ctx, c, plan(Mode.ANY), None)
    assert refused == NotReady(PODS)
    status = refused.status()
    assert (status.code, status.reason, status.retry_after) == (429, "TooManyRequests", 1)
    assert "not synced yet" in str(status)

    c.ready_wait = 5.0  # this cache's own --ready-wait
    pending = asyncio.ensure_future(reads.read_object(ctx, c, plan(Mode.ANY), "ns1", "a"))
    await asyncio.sleep(0)
    assert not pending.done()
    c.replace([pod("a", "ns1", 1)], 3)
    got = await pending
    assert got is not None and not isinstance(got, reads.Refusal) and got.rv == 1


# ---------------------------------------------------------------------------------------------- freshness


@arun
async def test_a_consistent_read_waits_for_its_scopes_proof_without_its_seat() -> None:
    c = cacher()
    ctx = ctx_at(c, fresh_wait=5.0)
    ctx.upstream.rv = 12  # the upstream is ahead: the scope is proven once the cache reaches 12
    pending = asyncio.ensure_future(reads.list_snapshot(ctx, c, plan(Mode.MOST_RECENT), "ns1"))
    await until(lambda: ctx.upstream.scope_proofs)
    assert not ctx.seated  # the seat is given up while the proof is under way
    write(c, ctx, 11)
    write(c, ctx, 12)
    snapshot = await pending
    assert isinstance(snapshot, Snapshot) and snapshot.rv == 12
    assert ctx.seated and ctx.upstream.scope_proofs == ["ns1"] and ctx.upstream.asked_seated == [False]
    [(resource, wait, consistent)] = ctx.metrics.seen
    assert resource is PODS and consistent and wait.reached


@arun
async def test_a_consistent_read_not_proven_in_time_passes_through_and_an_all_namespaces_scope_is_none() -> None:
    c = cacher()
    ctx = ctx_at(c, fresh_wait=0.05)
    ctx.upstream.rv = 99  # never reached
    assert await reads.list_snapshot(ctx, c, plan(Mode.MOST_RECENT), "") == Delegated(Delegation.CONSISTENT_READ)
    assert await reads.admit_watch(ctx, c, WatchPlan(Mode.MOST_RECENT, 0, False, False), None) == Delegated(
        Delegation.CONSISTENT_READ
    )
    assert ctx.upstream.scope_proofs == [None, None]
    assert [(consistent, wait.reached) for _, wait, consistent in ctx.metrics.seen] == [(True, False)] * 2


@arun
async def test_a_read_at_an_rv_the_cache_has_does_not_wait_or_give_up_its_seat() -> None:
    c = cacher()
    ctx = ctx_at(c)
    for mode in (Mode.NOT_OLDER_THAN, Mode.EXACT):
        got = await reads.list_snapshot(ctx, c, plan(mode, 10), None)
        assert isinstance(got, Snapshot) and got.rv == 10
    assert ctx.waits == 0 and ctx.metrics.seen == []


@arun
async def test_a_read_at_an_rv_ahead_waits_for_it_else_504_too_large_with_the_rv_reached() -> None:
    c = cacher()
    ctx = ctx_at(c, fresh_wait=5.0)
    pending = asyncio.ensure_future(reads.read_object(ctx, c, plan(Mode.NOT_OLDER_THAN, 11), "ns1", "a"))
    await until(lambda: c.waiting)
    assert not ctx.seated
    write(c, ctx, 11)
    got = await pending
    assert got is not None and not isinstance(got, reads.Refusal) and got.rv == 11
    [(_, wait, consistent)] = ctx.metrics.seen
    assert not consistent and wait.reached

    short = ctx_at(c, fresh_wait=0.05)
    refused = await reads.list_snapshot(short, c, plan(Mode.NOT_OLDER_THAN, 20), None)
    assert refused == TooLarge(20, 11)
    status = refused.status()
    assert status.code == 504 and str(status) == "Timeout: Too large resource version: 20, current: 11"
    # A watch from that rv: the same refusal (its handler writes it as an ERROR event).
    assert await reads.admit_watch(short, c, watch_from(20), None) == TooLarge(20, 11)


# ---------------------------------------------------------------------------------------------- reaching back


def history_after_writes() -> tuple[Cacher, ReadCtx]:
    """A window of 2 events after writes at 11..14: rv 10 is before it."""
    c = cacher(max_events=2)
    ctx = ctx_at(c)
    for rv in range(11, 15):
        write(c, ctx, rv)
    assert c.cache.oldest_rv > 10
    return c, ctx


class FailingFetch:
    def __init__(self, failure: BackfillFailed) -> None:
        self.failure = failure
        self.fetched: list[int] = []

    async def __call__(self, cacher: Cacher, rv: int) -> Fetched:
        self.fetched.append(rv)
        raise self.failure


async def list_and_watch_at(c: Cacher, ctx: ReadCtx, rv: int) -> tuple[Expired, Expired]:
    listed = await reads.list_snapshot(ctx, c, plan(Mode.EXACT, rv), None)
    watched = await reads.start_watch(ctx, c, WatchRequest(ALL, watch_from(rv)), NullSink())
    assert isinstance(listed, Expired) and isinstance(watched, Expired), (listed, watched)
    assert len(c.dispatcher) == 0
    return listed, watched


@arun
async def test_an_exact_read_before_the_window_without_a_source_of_history_gets_kubes_410s() -> None:
    c, ctx = history_after_writes()
    listed, watched = await list_and_watch_at(c, ctx, 10)
    assert listed == Expired(LIST_TOO_OLD)
    assert watched == Expired("too old resource version: 10 (12)")
    assert (listed.status().code, listed.status().reason) == (410, "Expired")


@arun
async def test_an_exact_list_before_the_window_passes_through_to_an_upstream_that_may_still_have_it() -> None:
    c, ctx = history_after_writes()
    ctx.upstream.answers_old_reads = True
    assert await reads.list_snapshot(ctx, c, plan(Mode.EXACT, 10), None) == Delegated(Delegation.OLD_EXACT_READ)


@pytest.mark.parametrize(
    ("outcome", "said"),
    [
        (BackfillFailed.GONE, False),  # the upstream compacted it too: kube's words alone
        (BackfillFailed.BOUND, True),
        (BackfillFailed.RELIST, True),
        (BackfillFailed.FAILED, True),
    ],
)
def test_a_list_and_a_watch_at_the_same_old_rv_say_the_same_about_why_the_history_could_not_be_had(
    outcome: str, said: bool
) -> None:
    async def go() -> tuple[Expired, Expired, FailingFetch]:
        c, ctx = history_after_writes()
        fetch = FailingFetch(BackfillFailed(outcome, f"the reason ({outcome})"))
        c.backfills = Backfills(c, fetch, coalesce=0.0, attempts=1)
        listed, watched = await list_and_watch_at(c, ctx, 10)
        assert ctx.seated and ctx.waits == 2  # each waited for the backfill without its seat
        return listed, watched, fetch

    listed, watched, fetch = asyncio.run(go())
    assert fetch.fetched  # the backfill was tried
    why = f" (the proxy could not fetch the older history: the reason ({outcome}))" if said else ""
    assert listed.message == LIST_TOO_OLD + why
    assert watched.message == "too old resource version: 10 (12)" + why


def test_a_list_and_a_watch_at_an_old_rv_whose_upstream_cannot_be_asked_now_are_told_to_retry_not_to_relist() -> None:
    async def go() -> tuple[Refusal, Refusal]:
        c, ctx = history_after_writes()
        fetch = FailingFetch(BackfillFailed(BackfillFailed.UNREACHABLE, "ConnectionResetError: EOF"))
        c.backfills = Backfills(c, fetch, coalesce=0.0, attempts=1)
        listed = await reads.list_snapshot(ctx, c, plan(Mode.EXACT, 10), None)
        watched = await reads.start_watch(ctx, c, WatchRequest(ALL, watch_from(10)), NullSink())
        assert len(c.dispatcher) == 0 and ctx.waits == 2
        assert not isinstance(listed, Snapshot) and not isinstance(watched, Watcher)
        return listed, watched

    listed, watched = asyncio.run(go())
    message = "the proxy could not fetch the history older than its cache now, retry: ConnectionResetError: EOF"
    assert listed == watched == RetryLater(message)
    status = listed.status()
    assert (status.code, status.reason, status.retry_after) == (429, "TooManyRequests", 1)


@arun
async def test_an_expired_continue_token_gets_kubes_410_with_a_token_from_the_same_key_at_the_newest_rv() -> None:
    c, ctx = history_after_writes()
    codec = ContinueCodec(b"t" * 32)
    token = codec.encode(10, "ns1/a", 1)
    continued = plan_list(ListOptions(continue_token=token, limit=1), codec)
    assert continued.mode is Mode.CONTINUE
    refused = await reads.list_snapshot(ctx, c, continued, None)
    assert isinstance(refused, Expired) and refused.message == CONTINUE_TOO_OLD
    assert refused.list_continue is not None
    rv, start = codec.decode(refused.list_continue)
    assert (rv, start) == (c.rv, "ns1/a")
    assert refused.status().body()  # a Status with metadata.continue


@arun
async def test_an_exact_read_after_the_cache_moved_back_is_504_not_a_snapshot_of_another_history() -> None:
    c = cacher()
    ctx = ctx_at(c, fresh_wait=0.05)
    write(c, ctx, 15)
    c.replace([pod("a", "ns1", 12)], 12)  # the upstream restarted from older storage: the cache moved back
    assert c.rv == 12
    assert await reads.list_snapshot(ctx, c, plan(Mode.EXACT, 15), None) == TooLarge(15, 12)  # waited for 15
    # Moved back between the wait and the state read (during a backfill's await): the same answer.
    assert reads.snapshot_at(ctx, c, plan(Mode.EXACT, 15), None) == TooLarge(15, 12)


@arun
async def test_a_watch_from_inside_the_window_starts_with_its_backlog_and_no_wait() -> None:
    c = cacher()
    ctx = ctx_at(c)
    write(c, ctx, 11)
    assert await reads.admit_watch(ctx, c, watch_from(10), None) is None
    watcher = await reads.start_watch(ctx, c, WatchRequest(ALL, watch_from(10)), NullSink())
    assert isinstance(watcher, Watcher) and watcher.pending and list(c.dispatcher.watchers()) == [watcher]
    assert ctx.waits == 0


# What kube-apiserver serves from etcd (events: no watch cache), the proxy answers in etcd's words.
EVENTS = ResourceType("", "v1", "events", "Event", True, "event", ("ev",))


def events_cacher(max_events: int = 100) -> Cacher:
    c = Cacher(EVENTS, CacheConfig(history_max_events=max_events))
    c.replace([pod(f"e{i}", "ns1", i + 1) for i in range(5)], 10)
    return c


@arun
async def test_a_watch_before_the_window_of_what_kube_serves_from_etcd_gets_etcds_410() -> None:
    # kube's etcd watch (the fuzz of session 48, kit): "The resourceVersion for the provided watch is
    # too old.", where its cacher says "too old resource version: N (M)".
    c = events_cacher(max_events=2)
    ctx = ctx_at(c)
    for rv in range(11, 15):
        write(c, ctx, rv, name="e0")
    everything = SelectionPredicate.parse(EVENTS, None, "", "")
    watched = await reads.start_watch(ctx, c, WatchRequest(everything, watch_from(10)), NullSink())
    assert watched == Expired(WATCH_TOO_OLD)


def test_a_list_of_what_kube_serves_from_etcd_pages_at_resource_version_0() -> None:
    # etcd's store pages a LIST at resourceVersion=0 (kit: events?resourceVersion=0&limit=1 has a
    # continue token and remainingItemCount), where kube's watch cache ignores the limit.
    c = events_cacher()
    codec = ContinueCodec(b"t" * 32)
    opts = ListOptions(resource_version="0", limit=2)
    everything = SelectionPredicate.parse(EVENTS, None, "", "")
    parts = list_parts(codec, c, c.cache.snapshot(), plan_list(opts, codec), everything, "", opts, FULL_JSON)
    doc = json.loads(b"".join(parts))
    assert [i["metadata"]["name"] for i in doc["items"]] == ["e0", "e1"]
    assert doc["metadata"]["remainingItemCount"] == 3 and doc["metadata"]["continue"]
    nxt = ListOptions(continue_token=doc["metadata"]["continue"], limit=2)
    rest = list_parts(codec, c, c.cache.snapshot(), plan_list(nxt, codec), everything, "", nxt, FULL_JSON)
    assert [i["metadata"]["name"] for i in json.loads(b"".join(rest))["items"]] == ["e2", "e3"]
    # pods (kube's watch cache) still ignore it
    pods = cacher()
    assert b'"continue"' not in b"".join(
        list_parts(codec, pods, pods.cache.snapshot(), plan_list(opts, codec), ALL, "", opts, FULL_JSON)
    )
