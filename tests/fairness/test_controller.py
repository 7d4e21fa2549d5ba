"""FlowControl: admission waits in the queue, times out with kube's reason, and follows live changes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from watchcache.fairness.classify import RequestDigest
from watchcache.fairness.config import parse_flow_schema, parse_priority_level
from watchcache.fairness.controller import FlowControl, Rejected
from watchcache.fairness.defaults import flow_schemas, priority_levels

SA = ("system:serviceaccounts", "system:authenticated")


def control(limit: int, clock: Callable[[], float] = time.monotonic) -> FlowControl:
    fc = FlowControl(limit, clock=clock)
    fc.configure([parse_flow_schema(o) for o in flow_schemas()], [parse_priority_level(o) for o in priority_levels()])
    return fc


def sa(name: str) -> RequestDigest:
    return RequestDigest(f"system:serviceaccount:t:{name}", SA, "list", True, resource="pods", namespace="t")


def test_nominal_limits_follow_kube_formula() -> None:
    fc = control(8)
    # Shares: 30+40+10+40+100+20+5 (+0 exempt) = 245; ceil(8 * shares / 245), at least 1.
    nominal = {n: lv.seats.nominal for n, lv in fc.levels.items()}
    assert nominal == {"system": 1, "node-high": 2, "leader-election": 1, "workload-high": 2, "workload-low": 4,
                       "global-default": 1, "catch-all": 1, "exempt": 0}  # fmt: skip
    assert fc.nominal_sum == 12 and fc.levels["exempt"].queueset is None
    # Idle, every level is guaranteed one seat (lendable 33, 25, 0, 50, 90, 50, 0 %: at least one)
    # and gets 12/7 of it: 1.71, rounded as Go, 2 (kube's rounding may sum over the nominal seats).
    limits = {n: lv.queueset.limit for n, lv in fc.levels.items() if lv.queueset is not None}
    assert set(limits.values()) == {2} and fc.fair_frac == pytest.approx(12 / 7)


def test_quiet_flow_is_dispatched_before_the_noisy_backlog() -> None:
    asyncio.run(_quiet_flow_is_dispatched_before_the_noisy_backlog())


async def _quiet_flow_is_dispatched_before_the_noisy_backlog() -> None:
    now = [0.0]
    fc = control(8, clock=lambda: now[0])  # each request executes for 1 ms, simulated
    # Borrowing aside (test_borrowing.py): workload-low at its 4 nominal seats, as after an adjustment.
    level = fc.levels["workload-low"]
    assert level.queueset is not None
    level.seats.current = seats = 4
    level.queueset.set_limit(seats)
    c_noisy, c_quiet = fc.classify(sa("noisy")), fc.classify(sa("quiet"))
    running = [await fc.admit(c_noisy, None) for _ in range(seats)]
    order: list[str] = []

    async def one(c, who):  # type: ignore[no-untyped-def]
        g = await fc.admit(c, None)
        order.append(who)
        running.append(g)

    noisy = [asyncio.create_task(one(c_noisy, "noisy")) for _ in range(40)]
    await asyncio.sleep(0)
    stats = fc.stats[("workload-low", "service-accounts")]
    assert stats.inqueue == 40 and stats.executing == seats
    while len(order) < 6:  # each of the noisy flow's queues (a hand of 6) served once: a steady backlog
        now[0] += 0.001
        running.pop(0).release()
        await asyncio.sleep(0)
    quiet = asyncio.create_task(one(c_quiet, "quiet"))
    await asyncio.sleep(0)
    while running:
        now[0] += 0.001
        running.pop(0).release()
        await asyncio.sleep(0)
    # One round at most: before it, no more than one request from each of the noisy flow's queues
    # (kube's fair queuing; test_queueset.py checks that bound over many runs), of 34 waiting.
    assert order.index("quiet") <= 6 + 6, order
    await asyncio.gather(quiet, *noisy)
    assert stats.inqueue == 0 and stats.executing == 0 and stats.dispatched == 41 + seats


def test_wait_budget_gives_time_out_and_queue_full_is_at_once() -> None:
    asyncio.run(_wait_budget_gives_time_out_and_queue_full_is_at_once())


async def _wait_budget_gives_time_out_and_queue_full_is_at_once() -> None:
    fc = control(1)
    c = fc.classify(sa("noisy"))
    held = await fc.admit(c, None)
    with pytest.raises(Rejected) as e:
        await fc.admit(c, 0.01)
    assert e.value.reason == "time-out"
    level = fc.levels["workload-low"].queueset
    assert level is not None and level.waiting == 0
    # One flow waits in the shortest queue of its hand (6 of 128): 6 x queueLengthLimit (50) fill it.
    waiters = [asyncio.create_task(fc.admit(c, None)) for _ in range(300)]
    await asyncio.sleep(0)
    assert level.waiting == 300
    with pytest.raises(Rejected) as e:
        await asyncio.wait_for(fc.admit(c, None), 1)
    assert e.value.reason == "queue-full"
    for w in waiters:
        w.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
    assert level.waiting == 0
    held.release()
    held.release()  # idempotent
    assert level.executing == 0
    stats = fc.stats[("workload-low", "service-accounts")]
    assert stats.rejected == {"time-out": 1, "queue-full": 1, "cancelled": 300}


def test_exempt_never_waits_and_live_change_applies() -> None:
    asyncio.run(_exempt_never_waits_and_live_change_applies())


async def _exempt_never_waits_and_live_change_applies() -> None:
    fc = control(1)
    admin = fc.classify(RequestDigest("root", ("system:masters",), "list", True, resource="pods"))
    grants = [await fc.admit(admin, 0) for _ in range(100)]
    for g in grants:
        g.release()
    c = fc.classify(sa("a"))
    held = await fc.admit(c, None)
    waiter = asyncio.create_task(fc.admit(c, None))
    await asyncio.sleep(0)
    assert not waiter.done()
    fc.server_limit = 1000  # more seats: the waiter goes at once
    fc.configure([parse_flow_schema(o) for o in flow_schemas()], [parse_priority_level(o) for o in priority_levels()])
    (await asyncio.wait_for(waiter, 1)).release()
    held.release()
    # A configuration without the suggested objects: everyone authenticated is catch-all.
    fc.configure([], [], source="test")
    assert fc.classify(sa("a")).flow_schema.name == "catch-all"
    assert fc.source == "test"


def test_a_waiting_request_gives_its_seat_back_for_good() -> None:
    asyncio.run(_a_waiting_request_gives_its_seat_back_for_good())


async def _a_waiting_request_gives_its_seat_back_for_good() -> None:
    fc = control(1)
    c = fc.classify(sa("noisy"))
    first = await fc.admit(c, None)
    second = asyncio.create_task(fc.admit(c, None))
    await asyncio.sleep(0)
    first.vacate()  # waits for a proof: the next request goes
    g = await asyncio.wait_for(second, 1)
    # back at work (its remaining work outside the level's seats): newcomers are not held behind it
    level = fc.levels["workload-low"].queueset
    assert level is not None and level.executing == 1
    first.release()
    assert level.executing == 1
    g.release()
    assert level.executing == 0 and fc.stats[("workload-low", "service-accounts")].executing == 0


def test_max_seats_per_level_is_kubes_and_the_estimate_is_counted() -> None:
    asyncio.run(_max_seats_per_level_is_kubes_and_the_estimate_is_counted())


async def _max_seats_per_level_is_kubes_and_the_estimate_is_counted() -> None:
    fc = control(400)  # workload-low 164 nominal seats, global-default 33, hand size 6 (exempt: none)
    assert fc.max_seats("workload-low") == 25 and fc.max_seats("global-default") == 5
    assert fc.max_seats("exempt") == 0 and fc.max_seats("no-such-level") == 0
    c = fc.classify(sa("lister"))
    grant = await fc.admit(c, None, 5)
    stats = fc.stats[("workload-low", "service-accounts")]
    assert grant.seats == 5 and stats.seats == 5 and stats.executing == 1
    assert stats.estimated == 5 and stats.estimates[3] == 1  # the bucket le=8 (1, 2, 4, 8, ...)
    grant.release()
    assert stats.seats == 0
    admin = fc.classify(RequestDigest("admin", ("system:masters",), "list", True, resource="pods"))
    exempt = await fc.admit(admin, None, 3)  # exempt: never waits, its seats counted all the same
    assert exempt.seats == 3 and fc.stats[("exempt", "exempt")].seats == 3
    exempt.release()


def test_a_flows_pass_throughs_take_turns_at_the_upstream_as_many_as_its_levels_seats_holding_none() -> None:
    asyncio.run(_a_flows_pass_throughs_take_turns_at_the_upstream())


async def _a_flows_pass_throughs_take_turns_at_the_upstream() -> None:
    fc = control(8)
    queueset = fc.levels["workload-low"].queueset
    assert queueset is not None
    queueset.set_limit(2)
    c_noisy, c_quiet = fc.classify(sa("noisy")), fc.classify(sa("quiet"))
    grants = [await fc.admit(c_noisy, None) for _ in range(2)]
    for g in grants:  # two pass-throughs at the upstream: their seats back
        g.vacate()
        await g.upstream_turn(1.0)
    assert queueset.executing == 0 and fc.upstream_turns == {grants[0].flow: 2}
    third, fourth = await fc.admit(c_noisy, None), await fc.admit(c_noisy, None)
    third.vacate()
    fourth.vacate()
    waits = [asyncio.create_task(third.upstream_turn(1.0)), asyncio.create_task(fourth.upstream_turn(1.0))]
    await asyncio.sleep(0)
    assert not any(w.done() for w in waits), "a flow had more pass-throughs at the upstream than its level's seats"
    assert queueset.executing == 0, "a pass-through waiting for its flow's turn held a seat"
    stats = fc.stats[("workload-low", "service-accounts")]
    assert (stats.at_upstream, stats.in_line) == (2, 2)
    # Another flow is neither queued for a seat nor in the noisy flow's line: the turns are per flow.
    quiet = await asyncio.wait_for(fc.admit(c_quiet, None), 1)
    quiet.vacate()
    await asyncio.wait_for(quiet.upstream_turn(1.0), 1)
    assert fc.upstream_turns == {grants[0].flow: 2, quiet.flow: 1} and quiet.flow != grants[0].flow
    grants[0].end_upstream_turn()  # an answer came: the turn goes to the first in line, and only to it
    await asyncio.wait_for(waits[0], 1)
    await asyncio.sleep(0)
    assert not waits[1].done() and fc.upstream_turns[grants[0].flow] == 2
    grants[0].end_upstream_turn()  # idempotent: its turn was given once
    assert not waits[1].done()
    for g in (grants[1], third, quiet):
        g.end_upstream_turn()
    await asyncio.wait_for(waits[1], 1)
    fourth.end_upstream_turn()
    assert fc.upstream_turns == {} and fc.upstream_line == {} and queueset.executing == 0
    assert (stats.at_upstream, stats.in_line) == (0, 0)


def test_a_wait_for_a_flows_turn_at_the_upstream_ends_in_kubes_time_out_or_with_its_caller() -> None:
    asyncio.run(_a_wait_for_a_flows_turn_ends())


async def _a_wait_for_a_flows_turn_ends() -> None:
    fc = control(8)
    queueset = fc.levels["workload-low"].queueset
    assert queueset is not None
    queueset.set_limit(1)
    c = fc.classify(sa("noisy"))
    grants = []
    for _ in range(4):  # each gives its seat back as it waits for the upstream
        grants.append(await asyncio.wait_for(fc.admit(c, None), 1))
        grants[-1].vacate()
    first, late, gone, next_ = grants
    await first.upstream_turn(1.0)
    with pytest.raises(Rejected) as refused:
        await late.upstream_turn(0.01)
    assert refused.value.reason == "time-out"
    assert fc.stats[("workload-low", "service-accounts")].rejected == {"time-out": 1}
    assert fc.upstream_line == {}, "a request that timed out stayed in its flow's line"
    cancelled = asyncio.create_task(gone.upstream_turn(1.0))
    waiting = asyncio.create_task(next_.upstream_turn(1.0))
    await asyncio.sleep(0)
    cancelled.cancel()  # its client went
    first.end_upstream_turn()  # the turn skips it
    await asyncio.wait_for(waiting, 1)
    assert cancelled.cancelled() and fc.upstream_turns == {first.flow: 1}
    # Handed its turn just as it was cancelled: it passes the turn on.
    third = await asyncio.wait_for(fc.admit(c, None), 1)
    third.vacate()
    handed = asyncio.create_task(third.upstream_turn(1.0))
    await asyncio.sleep(0)
    next_.end_upstream_turn()
    handed.cancel()
    with pytest.raises(asyncio.CancelledError):
        await handed
    assert fc.upstream_turns == {} and fc.upstream_line == {}
    stats = fc.stats[("workload-low", "service-accounts")]
    assert (stats.at_upstream, stats.in_line) == (0, 0), "a turn or a place in line outlived its request"
    # An exempt level's requests take no turn.
    admin = await fc.admit(fc.classify(RequestDigest("admin", ("system:masters",), "get", True)), None)
    await admin.upstream_turn(0.0)
    assert fc.upstream_turns == {}
    for g in (first, late, gone, next_, third, admin):
        g.release()


def test_a_flow_has_one_turn_at_the_upstream_when_its_level_lent_all_its_seats() -> None:
    asyncio.run(_one_turn_at_a_level_of_no_seats())


async def _one_turn_at_a_level_of_no_seats() -> None:
    fc = control(8)
    queueset = fc.levels["workload-low"].queueset
    assert queueset is not None
    c = fc.classify(sa("noisy"))
    first, second = await fc.admit(c, None), await fc.admit(c, None)
    first.vacate()
    second.vacate()
    queueset.set_limit(0)  # its seats lent since these were admitted
    await asyncio.wait_for(first.upstream_turn(1.0), 1)
    waiting = asyncio.create_task(second.upstream_turn(1.0))
    await asyncio.sleep(0)
    assert not waiting.done()
    first.end_upstream_turn()
    await asyncio.wait_for(waiting, 1)
    second.end_upstream_turn()
    assert fc.upstream_turns == {} and fc.upstream_line == {}
